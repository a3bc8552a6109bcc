#!/usr/bin/env node
/**
 * Run the unit test suite (tests/unit) inside Pyodide under Node.
 *
 *   node tests/pyodide/run-unit.mjs                 # provision (cached), then pytest
 *   node tests/pyodide/run-unit.mjs -- -k session   # extra pytest args after `--`
 *   node tests/pyodide/run-unit.mjs --no-provision  # reuse the provisioned dir as is
 *   node tests/pyodide/run-unit.mjs --tests-dir /tmp/x   # run another dir (mounted)
 *
 * What it does:
 *  1. `python -m pedelec_pyodide.build.provision <dir> --with-tests` (Python: $PEDELEC_PYTHON,
 *     else .venv/bin/python, else python3; <dir>: $PEDELEC_PYODIDE_TEST_DIR, else
 *     .cache/pyodide-test in the repo). That lays out the npm Pyodide runtime (pinned
 *     314.0.6), the pinned wheels (runtime + pytest/hypothesis) and our own freshly
 *     built wheel, with a pyodide-lock.json listing exactly those wheels. Warm: ~0.1 s.
 *  2. loadPyodide({indexURL, lockFileURL, packages: every package in that lock}); the
 *     wheels come from the lock, never from the network (micropip is not used).
 *     Neither loadPyodide nor loadPackage throws when a package fails (loadPyodide
 *     takes no errorCallback: it only prints to stderr), so pyodide.loadedPackages is
 *     checked, anything missing is retried once with loadPackage({errorCallback}) to
 *     get the reason, and the imports are checked with find_spec afterwards.
 *  3. Mounts the repo's tests/ with NODEFS at /repo/tests (only read: bytecode writing
 *     is off and pytest's cache provider is disabled), copies pyproject.toml to /repo
 *     (pytest config), chdir /repo, and runs
 *     `pytest tests/unit -q -p no:cacheprovider [extra args]`. pedelec_pyodide itself
 *     is imported from the installed wheel, not from the source tree.
 *  4. Exits with pytest's exit code (2 if Pyodide or a package failed to load).
 *
 * `async def` tests: Pyodide's WebLoop cannot block without JSPI, which Node 20 lacks;
 * tests/unit/conftest.py runs them on the loop in tests/pyodide/noio_loop.py (copied
 * to /pedelec-runner, which is on sys.path here: `from noio_loop import run` works).
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");

// ---- arguments
const argv = process.argv.slice(2);
const dashdash = argv.indexOf("--");
const ownArgs = dashdash >= 0 ? argv.slice(0, dashdash) : argv;
const pytestExtra = dashdash >= 0 ? argv.slice(dashdash + 1) : [];
let provisionFirst = true;
let testsDir = path.join(repo, "tests");
let target = "tests/unit";
for (let i = 0; i < ownArgs.length; i++) {
  const a = ownArgs[i];
  if (a === "--no-provision") provisionFirst = false;
  else if (a === "--tests-dir") testsDir = path.resolve(ownArgs[++i]);
  else if (a === "--target") target = ownArgs[++i];
  else if (a === "-h" || a === "--help") {
    console.log("usage: node tests/pyodide/run-unit.mjs [--no-provision] " +
      "[--tests-dir DIR] [--target PATH] [-- PYTEST ARGS]");
    process.exit(0);
  } else {
    console.error(`run-unit: unknown argument ${a} (pytest args go after --)`);
    process.exit(2);
  }
}

const outDir = process.env.PEDELEC_PYODIDE_TEST_DIR ?? path.join(repo, ".cache", "pyodide-test");
const pyodideDir = path.join(outDir, "pyodide");
const lockFile = path.join(pyodideDir, "pyodide-lock.json");

// ---- 1. provision (cached; the one code path shared with Core)
if (provisionFirst) {
  const venvPython = path.join(repo, ".venv", "bin", "python");
  const python = process.env.PEDELEC_PYTHON ?? (existsSync(venvPython) ? venvPython : "python3");
  const t = Date.now();
  const r = spawnSync(
    python,
    ["-m", "pedelec_pyodide.build.provision", outDir, "--with-tests", "--repo", repo],
    { cwd: repo, stdio: ["ignore", "ignore", "inherit"] },
  );
  if (r.error || r.status !== 0) {
    console.error(`run-unit: provisioning failed (${r.error ?? `exit ${r.status}`})`);
    process.exit(2);
  }
  console.error(`run-unit: provisioned in ${Date.now() - t} ms`);
}
if (!existsSync(lockFile)) {
  console.error(`run-unit: ${lockFile} is missing: run without --no-provision`);
  process.exit(2);
}

// ---- 2. boot Pyodide with every wheel of our lock
const lock = JSON.parse(readFileSync(lockFile, "utf8"));
const packages = Object.keys(lock.packages);
const loadErrors = [];
const t0 = Date.now();
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const pyodide = await loadPyodide({
  indexURL: pyodideDir + path.sep,
  lockFileURL: lockFile,
  packages, // fetched while the runtime boots; failures only go to stderr here...
  env: { PYTHONDONTWRITEBYTECODE: "1", COLUMNS: "100", HOME: "/home/pyodide" },
  stdout: (line) => console.log(line),
  stderr: (line) => console.error(line),
});
// ...so check what really loaded, and retry the rest once with errorCallback to report
// (loadedPackages is keyed by each entry's "name", e.g. "Pygments", not the lock key)
const notLoaded = () =>
  packages.filter((key) => !(lock.packages[key].name in pyodide.loadedPackages));
if (notLoaded().length) {
  await pyodide.loadPackage(notLoaded(), {
    messageCallback: () => {},
    errorCallback: (msg) => loadErrors.push(msg),
  });
}
if (notLoaded().length || loadErrors.length) {
  console.error(`run-unit: packages failed to load from ${lockFile}: ${notLoaded().join(", ")}` +
    `\n  ${loadErrors.join("\n  ")}`);
  process.exit(2);
}
const write = (stream) => ({
  write: (buf) => {
    stream.write(buf);
    return buf.length;
  },
});
pyodide.setStdout(write(process.stdout));
pyodide.setStderr(write(process.stderr));

// ---- 3. mount tests/, check imports, run pytest
const FS = pyodide.FS;
FS.mkdirTree("/repo/tests");
FS.mount(FS.filesystems.NODEFS, { root: testsDir }, "/repo/tests");
const pyproject = path.join(repo, "pyproject.toml");
if (existsSync(pyproject)) FS.writeFile("/repo/pyproject.toml", readFileSync(pyproject));
FS.mkdirTree("/pedelec-runner");
FS.writeFile("/pedelec-runner/noio_loop.py", readFileSync(path.join(here, "noio_loop.py")));

pyodide.globals.set("_pedelec_target", target);
pyodide.globals.set("_pedelec_extra", pyodide.toPy(pytestExtra));
let code;
try {
  code = pyodide.runPython(`
import importlib.util, os, sys
sys.dont_write_bytecode = True          # never write __pycache__ into the mounted tests/
# find_spec, not import: pytest must import its plugins (hypothesis) itself to rewrite them
_specs = {n: importlib.util.find_spec(n) for n in
          ["pedelec_pyodide", "pytest", "hypothesis", "jsonschema"]}
_missing = [n for n, spec in _specs.items() if spec is None]
if _missing:
    print("run-unit: not importable after loading the lock:", *_missing, sep="\\n  ",
          file=sys.stderr)
    _code = 2
else:
    import pytest
    os.chdir("/repo")
    sys.path.insert(0, "/pedelec-runner")   # noio_loop.py, for the conftest
    print(f"run-unit: Python {sys.version.split()[0]} on {sys.platform}, "
          f"pytest {pytest.__version__}, pedelec_pyodide from "
          f"{list(_specs['pedelec_pyodide'].submodule_search_locations)[0]}",
          file=sys.stderr)
    _code = int(pytest.main([_pedelec_target, "-q", "-p", "no:cacheprovider",
                             *_pedelec_extra]))
_code
`);
} catch (err) {
  console.error(`run-unit: Python raised:\n${err.message ?? err}`);
  code = 2;
}
console.error(`run-unit: pytest exit code ${code}; ${Date.now() - t0} ms in Pyodide`);
process.exit(code);
