#!/usr/bin/env node
/**
 * Compile Python sources to bytecode with Pyodide's own CPython, for own_wheel.py: the
 * host's CPython (3.11+) cannot write .pyc files for Pyodide's Python (3.14), and a page
 * that imports .py files without .pyc compiles them on its main thread at every start.
 *
 *   node compile_pyc.mjs PYODIDE_DIR < {"pkg/mod.py": "source", ...}
 *   -> stdout {"pkg/__pycache__/mod.cpython-314.pyc": "<base64>", ...}
 *
 * Unchecked-hash .pyc (PEP 552): the importer uses them without comparing the source's
 * mtime or hash (the wheel's files never change once installed, and zip mtimes are not
 * meaningful), so nothing is stat'ed or rehashed at import.
 */
import path from "node:path";
import { pathToFileURL } from "node:url";

const dir = path.resolve(process.argv[2]);
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { loadPyodide } = await import(pathToFileURL(path.join(dir, "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL: dir + path.sep, stdout: () => {}, stderr: (line) => console.error(line) });
pyodide.globals.set("sources_json", input);
const out = pyodide.runPython(`
import base64, importlib.util, json, os, py_compile
root = "/pedelec-compile"
compiled = {}
for name, source in json.loads(sources_json).items():
    path = f"{root}/{name}"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(source)
    cfile = importlib.util.cache_from_source(path)
    py_compile.compile(path, cfile=cfile, dfile=name, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    with open(cfile, "rb") as fh:
        compiled[os.path.relpath(cfile, root)] = base64.b64encode(fh.read()).decode("ascii")
json.dumps(compiled)
`);
process.stdout.write(out);
