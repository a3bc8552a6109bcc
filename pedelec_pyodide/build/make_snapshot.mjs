#!/usr/bin/env node
/**
 * Make the page's memory snapshot under Node, for provision.py (snapshot.py):
 *
 *   node make_snapshot.mjs SNAPSHOT_MODULE PYODIDE_DIR OUT_PREFIX < {"wheels": [...], "imports": [...]}
 *   -> OUT_PREFIX.gz and OUT_PREFIX.br (the snapshot, compressed), stdout {"buildId", "bytes"}
 *
 * SNAPSHOT_MODULE is web/pyodide-snapshot.js (the only place that names Pyodide's
 * underscore options). The interpreter gets exactly what a page gets before its blocks
 * run: our wheels unpacked into site-packages, our modules imported. Nothing here may
 * leave Python holding a JS object (Pyodide refuses to snapshot one it cannot name).
 */
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const [moduleFile, dirArg, outPrefix] = process.argv.slice(2);
const dir = path.resolve(dirArg);
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { wheels, imports } = JSON.parse(input);

const snapshots = await import(pathToFileURL(path.resolve(moduleFile)).href);
const { loadPyodide } = await import(pathToFileURL(path.join(dir, "pyodide.mjs")).href);
const pyodide = await loadPyodide({
  indexURL: dir + path.sep,
  stdout: () => {},
  stderr: (line) => console.error(line),
  ...snapshots.makingOptions(),
});
const site = pyodide.runPython("import site; site.getsitepackages()[0]");
for (const file of wheels) {
  pyodide.unpackArchive(new Uint8Array(readFileSync(path.join(dir, file))), "wheel", { extractDir: site });
}
// then collect: an object left for the collector (a ZipFile of an import) would be freed
// in the browser, whose file descriptors are not Node's ("Bad file descriptor")
pyodide.runPython(`import importlib\nimportlib.invalidate_caches()\n${imports.map((m) => `import ${m}`).join("\n")}\nimport gc\ngc.collect()`);
const bytes = snapshots.makeSnapshot(pyodide);

function write(file, data) {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, file);
}
// gzip for every browser; brotli (smaller: ~5.5 vs ~6.9 MiB) where the browser takes it
write(`${outPrefix}.gz`, gzipSync(bytes, { level: 6 }));
write(`${outPrefix}.br`, brotliCompressSync(bytes, {
  params: { [constants.BROTLI_PARAM_QUALITY]: 5, [constants.BROTLI_PARAM_SIZE_HINT]: bytes.length },
}));
process.stdout.write(JSON.stringify({ buildId: snapshots.snapshotBuildId(bytes), bytes: bytes.length }));
