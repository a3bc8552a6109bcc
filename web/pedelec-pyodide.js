/**
 * pedelec-pyodide: the page loader and JS bridge (an ES module).
 *
 * As a script tag (the usual way):
 *
 *   <script type="module" src="http://127.0.0.1:8765/pedelec/pedelec-pyodide.js"></script>
 *   <script type="pedelec/python"> ...your tools... </script>
 *
 * it loads Pyodide from Core (or `data-pyodide`) and our wheels, listed in our own
 * pyodide-lock.json (downloaded while the runtime boots, unpacked once it has), runs the
 * page's `<script type="pedelec/python">` blocks in document order (inline or `src=`),
 * connects the session to Core, sets `window.pedelec` and dispatches `pedelec:ready` on
 * `document`.
 * `window.pedelecReady` is a promise of the same `window.pedelec`; any failure rejects it
 * (and is logged to the console and dispatched as `pedelec:error`).
 * Pages that cannot use module scripts load `pedelec-pyodide.classic.js` instead.
 *
 * As a module: `import { start } from ".../pedelec-pyodide.js"; const pedelec = await
 * start({ core: "http://127.0.0.1:8765" });` (no script tag needed; blocks still run).
 *
 * Data attributes on the script tag (all optional): `data-core` (Core's URL; default:
 * the origin that served this file), `data-pyodide` (URL of pyodide.mjs; default: Core's
 * /pedelec/pyodide/pyodide.mjs), `data-lock` (URL of pyodide-lock.json; default: next to
 * pyodide.mjs), `data-packages` (extra packages from the lock, comma-separated),
 * `data-manual` (do not start by itself: call `start()`), `data-snapshot="off"` (start
 * without Core's memory snapshot), `data-webmcp` (any value but "off": offer the page's
 * tools to the browser's own agent on `document.modelContext`, WebMCP; see WebMCPTools).
 *
 * By default the runtime is restored from Core's memory snapshot of an interpreter that has
 * our packages installed and imported (`pedelec-snapshot.bin` next to pyodide.mjs; see
 * pyodide-snapshot.js), ~3x sooner than booting it. When there is none, or it does not fit
 * this runtime or our lock, or restoring fails, the page starts the usual way and the
 * console says why.
 *
 * Only strings cross between JS and Python: events arrive here as a type and JSON text.
 */

export const SCRIPT_TYPE = "pedelec/python";
export const PACKAGE = "pedelec-pyodide";

const moduleUrl = import.meta.url;
let started = null;

/**
 * An `approval` event: a tool that needs the user's approval is waiting for it. Call
 * `approve()` or `deny(reason)` once (later calls, and calls after the request was
 * answered otherwise, do nothing and return false). A request answered while it is asked
 * (cancelled, Core's deadline, the session closed) is withdrawn: `withdrawn` becomes true
 * and the session fires `approvalwithdrawn` with the same detail: take the question down.
 * A listener that throws, or returns a promise that rejects, before a verdict denies the
 * request (TOOL_DENIED, reason "the approval listener failed: ...").
 */
export class ApprovalEvent extends CustomEvent {
  constructor(detail, decide) {
    super("approval", { detail });
    this._decide = decide;
    /** True once the request was answered without this page's verdict. */
    this.withdrawn = false;
    this._heard = false; // set by the first listener called (see PedelecSession._hearer)
  }

  /** Run the tool. */
  approve() {
    return this._decide(this.detail.toolRequestId, { approved: true });
  }

  /** Do not run it: the agent gets TOOL_DENIED with `details.reason`. */
  deny(reason = "denied by the user") {
    return this._decide(this.detail.toolRequestId, { approved: false, reason: String(reason) });
  }
}

/** The page's session: state mirrored from Python, events, and sendText(). */
export class PedelecSession extends EventTarget {
  constructor() {
    super();
    /** connecting | idle | running | waiting_tool_result | closed */
    this._state = "connecting"; // until Python's session is there to ask (see the getters)
    this._sendText = null;
    this._close = null;
    // {pending, cancel, decide, state, id, listen}: Python methods, taken once (no proxy per call)
    this._page = null;
    // The types listened to: Python emits only those (each event costs every tool call
    // its JSON, a call into JS and a dispatch). A listener's removal is not followed
    // (`{once: true}`, an aborted `{signal}` remove one unseen): a type stays listened.
    this._listened = new Set();
    this._asked = new Map(); // toolRequestId -> its ApprovalEvent, until withdrawn or decided
    this._hearers = new WeakMap(); // approval listener -> its wrapper (_hearer)
    this._webmcp = null; // the WebMCPTools Python's registrations go to (data-webmcp)
  }

  /** Core's session id (null until welcomed). */
  get id() {
    return this._page?.id() ?? null;
  }

  /** The session's state: one of those beside `_state` in the constructor. */
  get state() {
    return this._page ? this._page.state() : this._state;
  }

  addEventListener(type, listener, options) {
    super.addEventListener(type, type === "approval" && listener ? this._hearer(listener) : listener,
      options);
    if (listener && !this._listened.has(type)) {
      this._listened.add(type);
      this._page?.listen(type);
    }
  }

  removeEventListener(type, listener, options) {
    super.removeEventListener(type, (type === "approval" && listener && this._hearers.get(listener))
      || listener, options);
  }

  // An approval listener, wrapped to mark the event heard. Only the EventTarget knows which
  // listeners remain (`{once: true}`, an aborted `{signal}` remove them without a
  // removeEventListener call), so whether anyone was asked is learnt by dispatching.
  // A listener that throws (or whose promise rejects) before a verdict denies: it will
  // never show its question, and the request must not wait for the user-wait limit.
  _hearer(listener) {
    let wrapper = this._hearers.get(listener);
    if (!wrapper) {
      wrapper = function (event) {
        event._heard = true;
        const failed = (error) => event.deny(`the approval listener failed: ${String(error).slice(0, 200)}`);
        let outcome;
        try {
          outcome = typeof listener === "function" ? listener.call(this, event) : listener.handleEvent(event);
        } catch (error) {
          failed(error);
          throw error; // still reported, as any listener's error is
        }
        if (outcome && typeof outcome.then === "function") {
          outcome.then(undefined, (error) => {
            failed(error);
            if (typeof reportError === "function") reportError(error);
          });
        }
        return outcome;
      };
      this._hearers.set(listener, wrapper);
    }
    return wrapper;
  }

  /**
   * The tool requests in flight: `{toolRequestId, tool, turnId, status, progress}`, status
   * `awaiting_approval` | `running` | `waiting_for_user`, progress null or
   * `{progress, total, message}` (the latest reported).
   */
  get pending() {
    return this._page ? JSON.parse(this._page.pending()) : [];
  }

  /**
   * Cancel a tool request in flight (a Stop button): its handler sees `ctx.cancelled`;
   * one still running after the grace period (2 s) is answered TOOL_CANCELLED. Returns
   * false if no such request is in flight.
   */
  cancelTool(toolRequestId) {
    return this._page ? this._page.cancel(String(toolRequestId)) : false;
  }

  /** Approve a request awaiting approval (as the `approval` event's approve()). */
  approveTool(toolRequestId) {
    return this._decide(String(toolRequestId), { approved: true });
  }

  /** Deny a request awaiting approval (as the `approval` event's deny(reason)). */
  denyTool(toolRequestId, reason = "denied by the user") {
    return this._decide(String(toolRequestId), { approved: false, reason: String(reason) });
  }

  _decide(toolRequestId, decision) {
    const decided = this._page ? this._page.decide(toolRequestId, JSON.stringify(decision)) : false;
    if (decided) this._asked.delete(toolRequestId);
    return decided;
  }

  /**
   * Start a turn of the agent; resolves to its final reply text. A turn that failed, was
   * cancelled or could not start rejects with an Error whose `message` is for people
   * ("turn failed: FRAME_TOO_LARGE: ...") and `name`, `code`, `status` for code.
   */
  async sendText(text) {
    if (!this._sendText) throw new Error("pedelec: the session is not ready yet (await window.pedelecReady)");
    const outcome = JSON.parse(await this._sendText(String(text)));
    if (outcome.error) {
      const { name, code, status, message } = outcome.error;
      throw Object.assign(new Error(message), { name, code, status });
    }
    return outcome.reply;
  }

  /**
   * Close the session for good (no reconnect). Every request in flight is settled: one
   * awaiting approval is withdrawn (`approvalwithdrawn`) and answered TOOL_CANCELLED; a
   * running handler sees `ctx.cancelled` and is answered TOOL_CANCELLED if it has not
   * finished within the grace period.
   */
  close() {
    if (this._close) this._close();
  }

  /** Called from Python with a type and a JSON string. */
  _receive(type, json) {
    const detail = JSON.parse(json);
    if (type === "webmcpregister" || type === "webmcpunregister") {
      this._webmcp?.receive(type, detail);
      return;
    }
    if (type === "approval") {
      const event = new ApprovalEvent(detail, (id, decision) => this._decide(id, decision));
      this._asked.set(detail.toolRequestId, event);
      this.dispatchEvent(event);
      // Nobody heard it: denied at once, saying so (never a silent run, never a hang).
      if (!event._heard) {
        this._asked.delete(detail.toolRequestId);
        this._decide(detail.toolRequestId, { approved: false, noApprover: true });
      }
      return;
    }
    if (type === "approvalwithdrawn") {
      const asked = this._asked.get(detail.toolRequestId);
      this._asked.delete(detail.toolRequestId);
      if (asked) asked.withdrawn = true;
    }
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

/**
 * The page's tools on WebMCP: the browser's own agent lists them on
 * `document.modelContext` and calls them. Python says what to register and unregister
 * (`webmcpregister`, `webmcpunregister`: the tools of the session, as they come and go);
 * each registration is `registerTool(tool, {signal})`, unregistered by aborting its signal.
 * `execute(input, options)` passes the call to Python as strings (the input as JSON text)
 * and resolves with the result's JSON value, error results included: a handler's failure
 * is its error result, never a rejection. `options.signal` (native Chromium passes one;
 * the MCP-B polyfill does not) aborting cancels the call (`ctx.cancelled`, then
 * TOOL_CANCELLED after the grace period).
 */
class WebMCPTools {
  constructor(context, page) {
    this._context = context;
    this._page = page;
    this._call = page.webmcp_call; // taken once: no proxy per call
    this._abort = page.webmcp_abort;
    this._maxInput = 0;
    this._registrations = new Map(); // registration id -> its AbortController
    this._calls = 0;
  }

  /** Register the session's tools now (Python emits them) and follow it from now on. */
  start() {
    const start = this._page.webmcp_start;
    try {
      this._maxInput = JSON.parse(start()).maxInputBytes;
    } finally {
      start.destroy();
    }
  }

  receive(type, detail) {
    if (type === "webmcpregister") {
      this._register(detail);
      return;
    }
    const controller = this._registrations.get(detail.registration);
    this._registrations.delete(detail.registration);
    controller?.abort();
  }

  _register({ registration, name, title, description, inputSchema, annotations }) {
    const controller = new AbortController();
    this._registrations.set(registration, controller);
    const tool = {
      name, description, inputSchema,
      execute: (input, options) => this._execute(registration, input, options),
    };
    if (title !== undefined) tool.title = title;
    if (annotations !== undefined) tool.annotations = annotations;
    // the draft rejects the registration's promise when its signal aborts: no warning then
    const refused = (err) => {
      if (!controller.signal.aborted) console.warn(`pedelec: WebMCP refused the tool ${name}: ${err?.message ?? err}`);
    };
    try {
      Promise.resolve(this._context.registerTool(tool, { signal: controller.signal })).catch(refused);
    } catch (err) {
      refused(err);
    }
  }

  _execute(registration, input, options) {
    const id = String(++this._calls);
    const signal = options?.signal;
    // The draft's input is an object; a string is taken as its JSON text. An input with
    // no JSON form (a cycle, a BigInt) goes as null: Python answers INVALID_ARGS.
    let text;
    if (typeof input === "string") text = input;
    else if (input === undefined) text = "{}";
    else {
      try {
        text = JSON.stringify(input) ?? null;
      } catch {
        text = null;
      }
    }
    // Longer than the limit: cut, so that no more than that crosses (Python refuses it
    // as too large, unread). UTF-16 units never outnumber the UTF-8 bytes Python counts.
    if (text !== null && text.length > this._maxInput) text = text.slice(0, this._maxInput + 1);
    const aborted = signal?.aborted === true;
    const answer = this._call(id, registration, text, aborted ? "aborted" : "");
    const onAbort = () => this._abort(id);
    if (signal && !aborted) signal.addEventListener("abort", onAbort, { once: true });
    return (async () => {
      try {
        return JSON.parse(await answer);
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
    })();
  }
}

/** `document.modelContext` (WebMCP), native or a polyfill's; null when the page has none. */
function modelContext() {
  // navigator.modelContext: where Chromium's origin trial (149-150) had it
  const context = globalThis.document?.modelContext ?? globalThis.navigator?.modelContext;
  return context && typeof context.registerTool === "function" ? context : null;
}

/** Offer the page's tools on WebMCP, when the page opted in and the browser has it. */
function offerToWebMCP(page, session) {
  const context = modelContext();
  if (!context) {
    console.info("pedelec: WebMCP is on for this page, but this browser has no document.modelContext: its tools are not offered to the browser's agent");
    return false;
  }
  const tools = new WebMCPTools(context, page);
  session._webmcp = tools;
  tools.start();
  return true;
}

function scriptElement() {
  if (typeof document === "undefined") return null;
  for (const el of document.querySelectorAll("script[src]")) {
    if (el.src === moduleUrl) return el;
  }
  return null;
}

function optionsFrom(el) {
  if (!el) return {};
  const d = el.dataset;
  const options = {};
  if (d.core) options.core = d.core;
  if (d.pyodide) options.pyodide = d.pyodide;
  if (d.lock) options.lock = d.lock;
  if (d.packages) options.packages = d.packages.split(",").map((p) => p.trim()).filter(Boolean);
  if (d.snapshot === "off") options.snapshot = false;
  if (d.webmcp !== undefined && d.webmcp !== "off") options.webmcp = true;
  return options;
}

function resolveConfig(options) {
  const base = typeof location !== "undefined" ? location.href : moduleUrl;
  const core = new URL(options.core ?? new URL(moduleUrl).origin, base).href;
  const pyodide = options.pyodide
    ? new URL(options.pyodide, base).href
    : new URL("/pedelec/pyodide/pyodide.mjs", core).href;
  const lock = new URL(options.lock ?? "pyodide-lock.json", pyodide).href;
  return {
    core,
    pyodide,
    indexURL: new URL(".", pyodide).href,
    lock,
    packages: options.packages ?? [],
    storage: options.storage ?? true,
    snapshot: options.snapshot ?? true,
    webmcp: options.webmcp === true,
  };
}

export class PedelecError extends Error {
  constructor(step, message, cause) {
    super(`pedelec: ${step}: ${message}`, cause ? { cause } : undefined);
    this.name = "PedelecError";
    this.step = step;
  }
}

async function blockSources() {
  if (typeof document === "undefined") return [];
  const blocks = [...document.querySelectorAll(`script[type="${SCRIPT_TYPE}"]`)];
  return Promise.all(blocks.map(async (el, i) => {
    const label = el.src ? `block src="${el.getAttribute("src")}"` : `inline block #${i + 1}`;
    if (!el.src) return { label, filename: `<pedelec/python #${i + 1}>`, code: el.textContent };
    const response = await fetchOk(el.src, "page code");
    return { label, filename: el.src, code: await response.text() };
  }));
}

// A traceback frame's first line: `  File "<name>", line <n>[, in <function>]`.
const FRAME = /^  File "(.*)", line (\d+)(?:, in .*)?$/;
// Frames of Pyodide's own code (`_pyodide/_base.py`: running a block), never the page's.
const PYODIDE_FRAME = /^\/lib\/python[^/]*\/_?pyodide\//;

/**
 * A page block's Python error as its author needs it: the traceback without Pyodide's
 * frames, each frame of a page block with its source line (Python has no file to read it
 * from), headed by the block and its innermost line in the traceback.
 */
function pythonError(block, blocks, traceback) {
  const sources = new Map(blocks.map((b) => [b.filename, b.code.split("\n")]));
  const kept = [];
  let line = null;
  let dropping = false;
  let missing = null; // the source line the last kept frame lacks, if it is a block's
  for (const text of traceback.trimEnd().split("\n")) {
    const body = text.startsWith("    ");
    if (missing !== null && !body) kept.push(`    ${missing}`);
    missing = null;
    const frame = FRAME.exec(text);
    if (frame) {
      dropping = PYODIDE_FRAME.test(frame[1]);
      if (dropping) continue;
      kept.push(text);
      if (frame[1] === block.filename) line = frame[2];
      missing = sources.get(frame[1])?.[Number(frame[2]) - 1]?.trim() || null;
    } else if (!(dropping && body)) {
      dropping = false;
      kept.push(text);
    }
  }
  return `Python error in ${block.label}${line ? `, line ${line}` : ""}:\n${kept.join("\n")}`;
}

/**
 * Why `url` could not be fetched or imported (`err`), from a second look at it: what the
 * server answers, or that the browser could not reach it at all, or that it answers
 * without CORS headers (so this page may not read it). A failed fetch or import tells JS
 * no more than "Failed to fetch".
 */
async function whyNot(url, err) {
  const origin = new URL(url).origin;
  try {
    const response = await fetch(url, { cache: "no-store" });
    if (response.ok) return `${origin} serves it, but: ${err.message}`;
    const text = (await response.text()).trim().slice(0, 300);
    return `${origin} answers HTTP ${response.status}${text ? `: ${text}` : ""}`;
  } catch {
    try {
      await fetch(url, { mode: "no-cors", cache: "no-store" });
    } catch {
      return `the browser cannot reach ${origin}: is Core running there, and is the URL right? (the console has the browser's reason)`;
    }
    const page = globalThis.location?.origin ?? "this page";
    return `${origin} answers without the CORS header Access-Control-Allow-Origin, so the browser does not let ${page} use it: load it from a pedelec Core (which sends that header), or add the header where it is served`;
  }
}

/** `fetch`, or a PedelecError of `step` naming the URL and why it failed. */
async function fetchOk(url, step, { init, label = "", why = "" } = {}) {
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    throw new PedelecError(step, `${label}cannot fetch ${url}${why}: ${await whyNot(url, err)}`, err);
  }
  if (!response.ok) throw new PedelecError(step, `${label}cannot fetch ${url}: HTTP ${response.status}`);
  return response;
}

/** Our pyodide-lock.json: fetched at once, for loadPyodide and for our wheels. */
function fetchLock(config) {
  const lock = fetchOk(config.lock, "loading packages").then((response) => response.json());
  lock.catch(() => {}); // reported by loadPyodide, which awaits it
  return lock;
}

/**
 * Resolves once the runtime's pyodide.asm.wasm has downloaded. Our wheels are fetched
 * then, as Pyodide's own package loading would: fetched at once, they competed with the
 * wasm for Core and delayed the boot (~50 ms cold).
 */
function wasmDownloaded(config) {
  const wasm = new URL("pyodide.asm.wasm", config.indexURL).href;
  return new Promise((resolve) => {
    const observer = new PerformanceObserver((entries) => {
      if (!entries.getEntriesByName(wasm).length) return;
      observer.disconnect();
      resolve();
    });
    observer.observe({ type: "resource", buffered: true });
  });
}

/** The wheels our lock lists for our package and its dependencies, fetched after `after`. */
async function fetchOurWheels(config, lock, after) {
  const { packages } = await lock;
  const names = [];
  const add = (name) => {
    if (names.includes(name)) return;
    if (!packages[name]) throw new PedelecError("loading packages", `${name} is not in ${config.lock}`);
    names.push(name);
    packages[name].depends.forEach(add);
  };
  add(PACKAGE);
  await after;
  return Promise.all(names.map((name) => fetchWheel(config.lock, packages[name])));
}

/** One wheel of the lock, checked against the lock's sha256 as loadPackage does (SRI). */
async function fetchWheel(lockUrl, entry) {
  const url = new URL(entry.file_name, lockUrl).href;
  const digest = entry.sha256.match(/../g).map((hex) => parseInt(hex, 16));
  const integrity = `sha256-${btoa(String.fromCharCode(...digest))}`;
  const response = await fetchOk(url, "loading packages", {
    init: { integrity },
    label: `${entry.name}: `,
    why: " (unreachable, or not the file whose sha256 the lock has)",
  });
  return { name: entry.name, buffer: await response.arrayBuffer() };
}

/**
 * Unpack our wheels into site-packages. Pyodide's installer (loadPackage) imports
 * tarfile, importlib.metadata and email the first time it runs (~80 ms on the page's one
 * thread, after boot, which no download overlaps); unpackArchive does not. Each package is
 * then recorded in loadedPackages as loadPackage would have ("default channel": from the
 * lock), so loadPackage and micropip see it installed and do not install it again.
 */
function installWheels(pyodide, wheels) {
  const scope = pyodide.toPy({});
  try {
    const site = pyodide.runPython("import site; site.getsitepackages()[0]", { globals: scope });
    for (const { name, buffer } of wheels) {
      if (pyodide.loadedPackages[name]) continue; // a data-packages package depends on it
      pyodide.unpackArchive(buffer, "wheel", { extractDir: site });
      pyodide.loadedPackages[name] = "default channel";
    }
    // A finder that listed site-packages in the same millisecond would miss the new files
    // (loadPackage calls importlib.invalidate_caches(), which imports importlib.metadata).
    pyodide.runPython("finder = __import__('sys').path_importer_cache.get(site)\nif finder: finder.invalidate_caches()", { globals: scope });
  } finally {
    scope.destroy();
  }
}

/** The page cannot start from the memory snapshot (`absent`: Core has none). */
class SnapshotUnusable extends Error {
  constructor(message, absent = false) {
    super(message);
    this.absent = absent;
  }
}

/**
 * The memory snapshot's bytes, once its manifest (fetched at the same time) says it holds
 * exactly the wheels our lock has; rejects with SnapshotUnusable otherwise.
 */
async function fetchSnapshot(config, lock) {
  const manifestUrl = new URL("pedelec-snapshot.json", config.indexURL).href;
  const snapshotUrl = new URL("pedelec-snapshot.bin", config.indexURL).href;
  const get = (url) => fetch(url, { cache: "no-cache" }).then((response) => {
    if (!response.ok) throw new SnapshotUnusable(`${url} answers HTTP ${response.status}`, response.status === 404);
    return response;
  }, (err) => { throw new SnapshotUnusable(`cannot fetch ${url}: ${err.message}`); });
  const bytes = get(snapshotUrl).then((response) => response.arrayBuffer());
  bytes.catch(() => {}); // the manifest's verdict comes first
  const manifest = await (await get(manifestUrl)).json();
  const { packages } = await lock;
  for (const [name, sha256] of Object.entries(manifest.packages ?? {})) {
    if (packages[name]?.sha256 !== sha256) {
      throw new SnapshotUnusable(`it was made with another ${name} than ${config.lock} lists (stale: Core remakes it when provisioning)`);
    }
  }
  if (!manifest.packages?.[PACKAGE]) throw new SnapshotUnusable(`it does not hold ${PACKAGE}`);
  return new Uint8Array(await bytes);
}

/** loadPyodide as configured, plus `extra` options (the snapshot's). */
async function bootPyodide(loadPyodide, config, lock, problems, extra = {}) {
  return loadPyodide({
    indexURL: config.indexURL,
    lockFileContents: lock,
    packageBaseUrl: new URL(".", config.lock).href,
    packages: config.packages,
    stderr: (line) => { problems.push(line); console.warn(line); },
    ...extra,
  });
}

async function loadRuntime(config, lock) {
  let loadPyodide;
  // Pyodide's snapshot options, pinned in one module of Core's (not beside this file: a
  // copy of the loader kept with an app works without it), imported alongside Pyodide
  const snapshotUrl = new URL("/pedelec/pyodide-snapshot.js", config.core).href;
  const snapshotOptions = config.snapshot ? import(snapshotUrl).catch((err) => {
    throw new SnapshotUnusable(`cannot import ${snapshotUrl}: ${err.message}`);
  }) : null;
  snapshotOptions?.catch(() => {}); // reported by the boot, which awaits it
  try {
    ({ loadPyodide } = await import(config.pyodide));
  } catch (err) {
    throw new PedelecError("loading Pyodide", `cannot import ${config.pyodide}: ${await whyNot(config.pyodide, err)}`, err);
  }
  const problems = [];
  let snapshot = config.snapshot ? fetchSnapshot(config, lock) : null;
  snapshot?.catch(() => {}); // reported by the boot, which awaits it
  let booting = snapshot ? snapshotOptions.then((options) => bootPyodide(loadPyodide, config, lock, problems,
    options.restoringOptions(snapshot, { indexURL: config.indexURL })))  // a snapshot over 30 MiB too
    : bootPyodide(loadPyodide, config, lock, problems);
  // At the latest once the runtime has booted, should the wasm's download go unobserved.
  const wheels = fetchOurWheels(config, lock, Promise.race([wasmDownloaded(config), booting.catch(() => {})]));
  wheels.catch(() => {}); // reported below, after the boot
  let pyodide;
  if (snapshot) {
    try {
      pyodide = await booting;
      installWheels(pyodide, await wheels);
      (await snapshotOptions).afterRestore(pyodide);  // pyodide-snapshot.js
    } catch (err) {
      if (err instanceof PedelecError) throw err; // our wheels: the same without a snapshot
      const reason = err instanceof SnapshotUnusable ? err.message : `restoring it failed: ${err.message.trim().split("\n")[0]}`;
      (err.absent ? console.info : console.warn)(`pedelec: starting without the memory snapshot (slower): ${reason}`);
      snapshot = null;
      problems.length = 0;
      pyodide = null;
      booting = bootPyodide(loadPyodide, config, lock, problems);
    }
  }
  if (!snapshot) {
    try {
      pyodide = await booting;
    } catch (err) {
      throw err instanceof PedelecError ? err : new PedelecError("loading Pyodide", err.message, err);
    }
    try {
      installWheels(pyodide, await wheels);
    } catch (err) {
      if (err instanceof PedelecError) throw err;
      throw new PedelecError("loading packages", `cannot install our wheels: ${err.message.trim().split("\n").pop()}`, err);
    }
  }
  const missing = config.packages.filter((name) => !pyodide.loadedPackages[name]);
  if (missing.length) {
    await pyodide.loadPackage(missing, { errorCallback: (message) => problems.push(message) });
    const still = missing.filter((name) => !pyodide.loadedPackages[name]);
    if (still.length) {
      throw new PedelecError("loading packages", `${still.join(", ")} not loaded from ${config.lock}: ${problems.join("; ") || "no reason given"}`);
    }
  }
  return { pyodide, snapshot: Boolean(snapshot) };
}

/**
 * After ready, when the page is idle: import jsonschema (~450 ms), which the first
 * argument validation would otherwise pay for. Kept off the path to ready.
 */
function warmUp(pyodide) {
  const idle = globalThis.requestIdleCallback ?? ((fn) => setTimeout(fn, 50));
  idle(() => {
    pyodide.runPythonAsync("import jsonschema.validators").catch((err) => {
      console.warn(`pedelec: jsonschema is not importable: ${err.message.trim().split("\n").pop()}`);
    });
  });
}

/**
 * A page on another origin than Core's asks Core whether its bridge will take this origin
 * (`GET /pedelec/v1/origin-check`): a refused WebSocket handshake tells JS nothing. Rejects
 * with a PedelecError naming the origin and `--allow-origin`; resolves when allowed, or
 * when Core cannot say (unreachable, or a Core without the check: connecting says why).
 */
async function admission(config) {
  const page = globalThis.location?.origin;
  // Not asked: Core's rule (core/bridge.py origin_allowed, the only one) lets in an Origin
  // whose host is the Host it was reached at, so a page of Core's own origin always; an
  // opaque origin cannot be named in --allow-origin. Python's browser.check_origin is this.
  if (!page || page === "null" || page === new URL(config.core).origin) return;
  let answer;
  try {
    const response = await fetch(new URL("/pedelec/v1/origin-check", config.core), { cache: "no-store" });
    if (!response.ok) return;
    answer = await response.json();
  } catch {
    return;
  }
  if (answer.allowed === false) {
    throw new PedelecError("connecting to Core", `Core at ${config.core} does not let pages from ${page} open a session: start it with --allow-origin ${page}`);
  }
}

/** Performance marks `pedelec:<step>` (see the page-start benchmark). */
function mark(step) {
  globalThis.performance?.mark?.(`pedelec:${step}`);
}

async function boot(options) {
  mark("start");
  const config = resolveConfig(options);
  const sources = blockSources();
  sources.catch(() => {});
  // the admission fails the start as soon as it is refused, and costs nothing otherwise
  const [{ pyodide, snapshot }] = await Promise.all([loadRuntime(config, fetchLock(config)), admission(config)]);
  mark("runtime");
  const session = new PedelecSession();
  let page;
  try {
    const browser = pyodide.pyimport("pedelec_pyodide.browser");
    page = browser.PageSession(config.core, (type, json) => session._receive(type, json),
      JSON.stringify({ storage: config.storage, events: [...session._listened] }));
    browser.destroy();
  } catch (err) {
    const reason = err.message.trim().split("\n").pop();
    throw new PedelecError("loading packages", `cannot import pedelec_pyodide: ${reason}`, err);
  }
  mark("imported");
  const namespace = page.namespace;
  try {
    const blocks = await sources;
    for (const block of blocks) {
      await pyodide.loadPackagesFromImports(block.code, {
        messageCallback: () => {},
        errorCallback: (message) => console.warn(`pedelec: ${block.label}: ${message}`),
      });
      try {
        await pyodide.runPythonAsync(block.code, { globals: namespace, filename: block.filename });
      } catch (err) {
        throw new PedelecError("page code", pythonError(block, blocks, err.message), err);
      }
    }
  } finally {
    namespace.destroy();
  }
  mark("blocks");
  // Approvals are decided through these (a WebMCP call may ask one before Core answers).
  session._page = {
    pending: page.pending, cancel: page.cancel, decide: page.decide, state: page.state,
    id: page.session_id, listen: page.listen,
  };
  for (const type of session._listened) session._page.listen(type); // any since the page was made
  // Before and independent of Core: with Core down, the browser's agent still calls them.
  const webmcp = config.webmcp && offerToWebMCP(page, session);
  const ready = page.ready;
  const connect = page.connect;
  try {
    await connect(); // session.id and state are read from Python from now on
  } catch (err) {
    // The start fails, and no app listens to this session: approvals WebMCP's calls need
    // are answered now (by the page's Python approver, else denied: no approver).
    if (webmcp) ready();
    ready.destroy();
    const message = err.message.trim().split("\n").pop();
    throw new PedelecError("connecting to Core", message, err);
  } finally {
    connect.destroy();
  }
  mark("connected");
  session._sendText = page.send_text;
  session._close = page.close;
  const pedelec = {
    pyodide,
    session,
    core: config.core,
    /** Whether the runtime was restored from Core's memory snapshot. */
    snapshot,
    /** Whether the page's tools are offered to the browser's agent (WebMCP). */
    webmcp,
    /** Run Python in the namespace of the page's blocks (where `session` is bound). */
    async runPython(code) {
      const globals = page.namespace;
      try {
        return await pyodide.runPythonAsync(code, { globals });
      } finally {
        globals.destroy();
      }
    },
  };
  if (typeof window !== "undefined") window.pedelec = pedelec;
  if (typeof document !== "undefined") {
    document.dispatchEvent(new CustomEvent("pedelec:ready", { detail: pedelec }));
  }
  // Approvals asked before now (a request Core re-sent as the page reloaded) are shown
  // once the app's listeners are attached: after `pedelec:ready` and the promise's
  // continuations (`await start()`, `pedelecReady.then`), all of which run before a timer.
  setTimeout(() => { ready(); ready.destroy(); }, 0);
  warmUp(pyodide);
  return pedelec;
}

/**
 * Load Pyodide and our packages, run the page's Python blocks, connect to Core.
 * Resolves to `window.pedelec`; called twice, returns the same promise.
 */
export function start(options = {}) {
  if (started) return started;
  started = boot(options).catch((err) => {
    const error = err instanceof PedelecError ? err : new PedelecError("start", err.message, err);
    console.error(error.message);
    if (typeof document !== "undefined") {
      document.dispatchEvent(new CustomEvent("pedelec:error", { detail: error }));
    }
    throw error;
  });
  if (typeof window !== "undefined") window.pedelecReady = started;
  return started;
}

const own = scriptElement();
if (own && !("manual" in own.dataset)) start(optionsFrom(own)).catch(() => {}); // logged above
