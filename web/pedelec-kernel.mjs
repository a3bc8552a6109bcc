/**
 * The Pyodide module a `pedelec lite` site's notebook kernel imports (its `pyodideUrl`):
 * Pyodide's own, but its `loadPyodide` restores the interpreter from the site's memory
 * snapshot of the kernel's libraries (IPython, jedi, comm, traitlets, pygments unpacked
 * and imported under Node by `pedelec lite`), instead of booting it and importing them
 * (the larger part of the kernel's start). The kernel's wheels still load as it asks
 * (`loadPyodideOptions.packages`), once the memory is restored (loadPyodide cannot load
 * packages into an interpreter it restores): a snapshot holds memory, not files.
 *
 * When the snapshot cannot be used (absent, another Pyodide build, a browser without
 * DecompressionStream), the kernel boots the usual way, saying why in the console.
 * Lives next to pyodide.mjs and pyodide-snapshot.js in the site's static/pyodide/.
 */
import { loadPyodide as boot } from "./pyodide.mjs";
import { afterRestore, restoringOptions } from "./pyodide-snapshot.js";

export * from "./pyodide.mjs";

/** Stored gzipped: any static server serves it as is, the worker inflates it. */
const SNAPSHOT = new URL("pedelec-kernel-snapshot.bin.gz", import.meta.url);

async function snapshotBytes() {
  if (typeof DecompressionStream !== "function") throw new Error("this browser has no DecompressionStream");
  const response = await fetch(SNAPSHOT);
  if (!response.ok) throw new Error(`${SNAPSHOT} answers HTTP ${response.status}`);
  const inflated = response.body.pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(inflated).arrayBuffer());
}

export async function loadPyodide(options = {}) {
  const snapshot = snapshotBytes();
  snapshot.catch(() => {}); // reported below, by the restore that awaits it
  try {
    const indexURL = options.indexURL ?? new URL(".", import.meta.url).href;
    const pyodide = await boot({ ...options, packages: [], ...restoringOptions(snapshot, { indexURL }) });
    afterRestore(pyodide);
    await pyodide.loadPackage(options.packages ?? []);
    return pyodide;
  } catch (err) {
    console.warn(`pedelec: the notebook kernel starts without its memory snapshot (slower): ${String(err.message ?? err).trim().split("\n")[0]}`);
    return boot(options);
  }
}
