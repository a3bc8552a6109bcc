#!/usr/bin/env node
// Pins web/pyodide-snapshot.js to the Pyodide in node_modules: fails loudly when an upgrade
// changes the underscore options or the snapshot's layout it relies on.
//   node tests/pyodide/snapshot-pin.mjs [PYODIDE_DIR]   (default node_modules/pyodide)
// Checks, on the real runtime: the version is the pinned one; the options are still declared;
// a snapshot made with makingOptions() carries the runtime's build id where
// snapshotBuildId() reads it; restoringOptions() brings back Python's memory (a global set
// before the snapshot), with the browser's sys.executable; and a snapshot whose build id
// was changed is refused by Pyodide (the loader's fallback relies on that); and Python
// holding a JS object at snapshot time makes it fail (so our modules, imported in the
// snapshot, must hold none: provisioning would fail loudly, not restore a dead reference);
// a snapshot larger than the wasm's initial memory does not restore plainly ("offset is
// out of bounds") but does with restoringOptions(bytes, { indexURL }) (the notebook
// kernel's, ~45 MB, is such a one).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import * as snap from "../../web/pyodide-snapshot.js";

const dir = path.resolve(process.argv[2] ?? "node_modules/pyodide");
const fail = (what) => {
  console.error(`web/pyodide-snapshot.js no longer fits Pyodide in ${dir}: ${what}.\n`
    + "Its underscore options are experimental: check them against the new Pyodide, then "
    + "update the module and PINNED_PYODIDE.");
  process.exit(1);
};
const version = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")).version;
if (version !== snap.PINNED_PYODIDE) fail(`its version is ${version}, pinned ${snap.PINNED_PYODIDE}`);
const types = readFileSync(path.join(dir, "pyodide.d.ts"), "utf8");
for (const declared of ["_makeSnapshot?: boolean;", "_loadSnapshot?: Uint8Array | ArrayBuffer | PromiseLike<Uint8Array | ArrayBuffer>;",
  "_sysExecutable?: string;", "static makeMemorySnapshot("]) {
  if (!types.includes(declared)) fail(`pyodide.d.ts no longer declares ${declared}`);
}
const buildId = snap.runtimeBuildId(readFileSync(path.join(dir, "pyodide.mjs"), "utf8"));
if (!buildId) fail("no BUILD_ID found in pyodide.mjs");

const { loadPyodide } = await import(pathToFileURL(path.join(dir, "pyodide.mjs")).href);
const quiet = { indexURL: dir + path.sep, stdout: () => {}, stderr: () => {} };
let bytes;
try {
  const maker = await loadPyodide({ ...quiet, ...snap.makingOptions() });
  maker.runPython("import json\nmarker = 'made before the snapshot'");
  bytes = snap.makeSnapshot(maker);
} catch (err) {
  fail(`making a snapshot failed: ${err.message}`);
}
if (snap.snapshotBuildId(bytes) !== buildId) {
  fail(`the snapshot's header has build id ${snap.snapshotBuildId(bytes)}, pyodide.mjs ${buildId}`);
}
try {
  const restored = await loadPyodide({ ...quiet, ...snap.restoringOptions(Promise.resolve(bytes)) });
  assert.equal(restored.runPython("marker"), "made before the snapshot");
  assert.equal(restored.runPython("import sys; sys.executable"), "/home/pyodide/this.program");
} catch (err) {
  fail(`restoring the snapshot failed: ${err.message}`);
}
const foreign = bytes.slice();
foreign[16] ^= 0xff; // the first byte of the build id
assert.equal(snap.snapshotBuildId(foreign) === buildId, false);
await assert.rejects(loadPyodide({ ...quiet, ...snap.restoringOptions(foreign) }), /build id mismatch/,
  "Pyodide must refuse a snapshot of another build");
let big;
try {
  const maker = await loadPyodide({ ...quiet, ...snap.makingOptions() });
  maker.runPython("ballast = bytearray(48 << 20)\nballast[-1] = 7\nmarker = 'a big one'");
  big = snap.makeSnapshot(maker);
} catch (err) {
  fail(`making a big snapshot failed: ${err.message}`);
}
await assert.rejects(loadPyodide({ ...quiet, ...snap.restoringOptions(big) }), /out of bounds/,
  "a snapshot over the initial memory restores plainly now: restoringOptions may not need its factory");
try {
  const restored = await loadPyodide({ ...quiet, ...snap.restoringOptions(big, { indexURL: pathToFileURL(dir + path.sep).href }) });
  assert.equal(restored.runPython("marker + str(ballast[-1])"), "a big one7");
} catch (err) {
  fail(`restoring a snapshot over the initial memory failed: ${err.message}`);
}
const holder = await loadPyodide({ ...quiet, ...snap.makingOptions() });
holder.runPython("from js import Object\nheld = Object.new()");
assert.throws(() => snap.makeSnapshot(holder), "Pyodide must refuse to snapshot a JS object Python holds");
console.log(`web/pyodide-snapshot.js fits Pyodide ${version} (build ${buildId.slice(0, 12)})`);
