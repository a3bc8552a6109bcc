/**
 * Pyodide's memory snapshots, behind one small module: the only place that names
 * Pyodide's underscore (experimental, undocumented) options and the snapshot's layout.
 * Used by the page loader (restore) and by provisioning under Node (make); pinned to the
 * Pyodide below by tests/pyodide/snapshot-pin.mjs, which fails when an upgrade changes any
 * of it.
 *
 * What a snapshot is: the whole wasm heap of an interpreter, after our wheels were
 * installed and our modules imported, plus Pyodide's table of the JS objects Python held.
 * It restores memory, not files (the wheels must be unpacked again), and only into the
 * exact same pyodide.asm.wasm build (its build id is in the header).
 */

/** The Pyodide these options were checked against (its npm version). */
export const PINNED_PYODIDE = "314.0.6";

/** The snapshot's header (pyodide.asm.mjs: makeSnapshot/restoreSnapshot). */
export const SNAPSHOT_MAGIC = 1886286592;
const HEADER_BYTES = 48;
const BUILD_ID_WORDS = [4, 12]; // Uint32 words holding the 32-byte build id

/**
 * `sys.executable` in a browser boot of Pyodide (Emscripten's `thisProgram`): the snapshot
 * is made with it, so a page restored from one sees what a page booted without one sees.
 */
export const BROWSER_EXECUTABLE = "./this.program";

/** loadPyodide options that make an interpreter whose memory can be snapshot (Node). */
export function makingOptions() {
  return { _makeSnapshot: true, _sysExecutable: BROWSER_EXECUTABLE };
}

/** The snapshot of `pyodide`'s memory (loaded with `makingOptions()`), as bytes. */
export function makeSnapshot(pyodide) {
  return pyodide.makeMemorySnapshot();
}

/**
 * loadPyodide options that restore from `snapshot` (bytes, or a promise of them, which
 * loadPyodide awaits before instantiating the wasm).
 *
 * With `indexURL` (the runtime's directory), a snapshot larger than the wasm's initial
 * memory (30 MiB; Pyodide sets INITIAL_MEMORY for it, which this build ignores, and then
 * fails with "offset is out of bounds") restores too: the wasm module is instantiated by
 * a factory that first grows its memory to the snapshot's size (Emscripten's own
 * resize_heap; the restore then overwrites the whole heap).
 */
export function restoringOptions(snapshot, { indexURL } = {}) {
  const options = { _loadSnapshot: snapshot, _sysExecutable: BROWSER_EXECUTABLE };
  if (indexURL === undefined) return options;
  const factory = import(new URL("pyodide.asm.mjs", indexURL).href).then((module) => module.default);
  factory.catch(() => {}); // loadPyodide awaits it and reports
  options.createPyodideModule = async (settings) => {
    const module = await (await factory)(settings);
    const bytes = await snapshot;
    if (bytes.byteLength > module.HEAP8.length && !module._emscripten_resize_heap(bytes.byteLength)) {
      throw new Error(`cannot grow the wasm memory to the snapshot's ${bytes.byteLength} bytes`);
    }
    return module;
  };
  return options;
}

/**
 * What a restored interpreter needs to be the one a boot would give: the snapshot was
 * made under Node, once, for every page (or notebook kernel). `random` was seeded then
 * (reseed from the browser's crypto); LANG came from Node (set it from the browser as
 * Emscripten does at boot). `hash()`'s seed stays the snapshot's: the same everywhere.
 */
export function afterRestore(pyodide) {
  const seed = [...crypto.getRandomValues(new Uint32Array(8))].map((w) => w.toString(16).padStart(8, "0")).join("");
  const lang = `${(globalThis.navigator?.language ?? "C").replace("-", "_")}.UTF-8`;
  const scope = pyodide.toPy({ seed, lang });
  try {
    pyodide.runPython(`
import locale, os, random
random.seed(int(seed, 16))
os.environ["LANG"] = lang
locale.setlocale(locale.LC_CTYPE, "")
`, { globals: scope });
  } finally {
    scope.destroy();
  }
}

/** The build id in a snapshot's header (hex), or null when `bytes` is not a snapshot. */
export function snapshotBuildId(bytes) {
  if (bytes.byteLength < HEADER_BYTES) return null;
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, HEADER_BYTES / 4);
  if (words[0] !== SNAPSHOT_MAGIC) return null;
  // eight native-endian words of eight hex digits each, as Pyodide writes them
  return [...words.subarray(...BUILD_ID_WORDS)].map((w) => w.toString(16).padStart(8, "0")).join("");
}

/** The build id of the pyodide.mjs module `source` (its text), or null. */
export function runtimeBuildId(source) {
  return /BUILD_ID:"([0-9a-f]{64})"/.exec(source)?.[1] ?? null;
}
