#!/usr/bin/env node
/**
 * Run a benchmark script of bench/ inside Pyodide under Node:
 *
 *   node bench/run-pyodide.mjs bench/dispatch.py
 *
 * Provisions like the unit-suite runner (the same cached directory, the one code path in
 * pedelec_pyodide/build/provision.py), boots Pyodide with our lock's runtime wheels, mounts
 * bench/ and awaits the script's `async def main()` on Pyodide's own event loop.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..");
const script = process.argv[2];
if (!script) {
  console.error("usage: node bench/run-pyodide.mjs bench/SCRIPT.py");
  process.exit(2);
}
const outDir = process.env.PEDELEC_PYODIDE_TEST_DIR ?? path.join(repo, ".cache", "pyodide-test");
const venvPython = path.join(repo, ".venv", "bin", "python");
const python = process.env.PEDELEC_PYTHON ?? (existsSync(venvPython) ? venvPython : "python3");
const provisioned = spawnSync(
  python, ["-m", "pedelec_pyodide.build.provision", outDir, "--with-tests", "--repo", repo],
  { cwd: repo, stdio: ["ignore", "ignore", "inherit"] },
);
if (provisioned.error || provisioned.status !== 0) {
  console.error("run-pyodide: provisioning failed");
  process.exit(2);
}
const pyodideDir = path.join(outDir, "pyodide");
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const pyodide = await loadPyodide({
  indexURL: pyodideDir + path.sep,
  lockFileURL: path.join(pyodideDir, "pyodide-lock.json"),
  packages: ["pedelec-pyodide"],
  stdout: (line) => console.log(line),
  stderr: (line) => console.error(line),
});
pyodide.FS.mkdirTree("/bench");
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: here }, "/bench");
pyodide.globals.set("_script", "/bench/" + path.basename(script));
try {
  await pyodide.runPythonAsync(`
import runpy, sys
sys.dont_write_bytecode = True
await runpy.run_path(_script, run_name="bench")["main"]()
`);
} catch (err) {
  console.error(`run-pyodide: Python raised:\n${err.message ?? err}`);
  process.exit(1);
}
