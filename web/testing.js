/**
 * pedelec-pyodide test kit for Playwright (Node side). See docs/how-to/testing.md.
 *
 *   import { coreWebServer, openPage, callTool, callViaAgent } from "pedelec-pyodide/web/testing.js";
 *
 * (No registry serves pedelec-pyodide: `npm install --save-dev /path/to/pedelec-pyodide`.)
 *
 * - `coreWebServer({ app, port, token, pedelec, pyodide, args, env, readyTimeoutMs })`: a
 *   Playwright `webServer` entry that starts Core (`pedelec serve --app DIR`) on a loopback
 *   port with a fixed admin token, ready once pages can load (health's `ready`).
 * - `startCore(...)`: the same from code (globalSetup, a plain Node script); `stop()` it.
 * - `openPage(page, url)`: go to a page that loads pedelec-pyodide.js and wait for it to be
 *   ready; returns `{ sessionId, core }`. A start failure fails with its clear message.
 * - `callTool(core, sessionId, tool, args)`: call a page tool through Core's control API
 *   (exactly what the agent would get back): `{ toolRequestId, result, handledBy }`.
 * - `getSession(core, sessionId)`: the session as Core sees it (state, connected, tools).
 * - `callViaAgent(page, lines)`: send `/call TOOL {json}` lines to the offline agent from
 *   the page (`session.sendText`); returns the agent's reply text.
 * - `sessionState(page)`, `waitForState(page, state)`: `window.pedelec.session.state`.
 * - `runPython(page, code)`: run Python in the page's namespace; JSON-like values back.
 * - WebMCP, as the browser's own agent sees a page that offers its tools (`data-webmcp`):
 *   `webmcpImplementation(page)` ("native", "polyfill" or null), `webmcpTools(page)` (the
 *   tools listed), `callWebMCPTool(page, name, input)` (a call's result).
 *
 * Every wait ends before Playwright's default test timeout (30 s) with the kit's message.
 * Node 18+ (global fetch). No dependency besides Node itself.
 */
import { spawn } from "node:child_process";
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";

export const DEFAULT_TOKEN = "pedelec-test-token";

/** `{ url, token }` of a Core on 127.0.0.1:port. */
export function coreAt(port, token = DEFAULT_TOKEN) {
  return { url: `http://127.0.0.1:${port}`, token };
}

/**
 * The kit's waits, each shorter than Playwright's default test timeout (30 s), so a test
 * that fails on one of them fails with the kit's message, not with "Test timeout of
 * 30000ms exceeded". Raise one (its `timeout`/`timeoutMs` option) only together with the
 * test timeout (`timeout` in playwright.config.js, or `test.setTimeout`).
 */
export const PAGE_START_TIMEOUT_MS = 20_000;   // openPage / waitForReady: the whole start
export const LOADER_TIMEOUT_MS = 10_000;       // ... of which: the loader script running
export const TOOL_CALL_TIMEOUT_MS = 15_000;    // callTool: the call's deadline at Core
export const STATE_TIMEOUT_MS = 10_000;        // waitForState
/** How long Core may take to become ready (a first start provisions the runtime). */
export const CORE_READY_TIMEOUT_MS = 300_000;
const OUTPUT_TAIL_CHARS = 8_000;  // how much of Core's output a start failure quotes

const KIT = fileURLToPath(import.meta.url);

/**
 * A Playwright `webServer` entry starting Core for `app` (a directory served at `/`).
 * `pedelec`: the CLI to run (default `pedelec` on PATH, e.g. ".venv/bin/pedelec");
 * `pyodide`: a provisioned runtime directory (else Core provisions one into its cache on
 * first start); `args`: more `pedelec serve` options (`"--quiet"` keeps Core's events out
 * of the test output, where Playwright echoes them as `[WebServer] ...`); `env`: more
 * environment for Core (e.g. `PEDELEC_CACHE_DIR`).
 *
 * The server counts as started once pages can load (health says `ready`, i.e. the runtime
 * is served), not when Core first answers: a first start downloads the runtime. The kit
 * runs Core through a small Node wrapper (this file) that waits for that and, when
 * provisioning fails or takes over `readyTimeoutMs`, stops with a message saying why.
 */
export function coreWebServer({
  app, port, token = DEFAULT_TOKEN, pedelec = "pedelec", pyodide, args = [], env = {},
  readyTimeoutMs = CORE_READY_TIMEOUT_MS,
}) {
  const options = { app, port, token, pedelec, pyodide, args, readyTimeoutMs };
  return {
    command: [process.execPath, KIT, "serve", JSON.stringify(options)].map(shellQuote).join(" "),
    // 503 until the runtime is served: the same readiness as health's `ready`
    url: `http://127.0.0.1:${port}/pedelec/pyodide/pyodide.mjs`,
    env: { ...env, PEDELEC_ADMIN_TOKEN: token },
    reuseExistingServer: false,
    timeout: readyTimeoutMs + 30_000,  // the wrapper's own message comes first
    stdout: "pipe",
    stderr: "pipe",
  };
}

function shellQuote(word) {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", "'\\''")}'`;
}

// The Cores startCore started and that still run: stopped if this process exits first (a
// test run that dies on an uncaught error, or on a closed stdout, leaves no Core behind).
const running = new Set();
process.once("exit", () => { for (const child of running) child.kill("SIGTERM"); });

/**
 * Start Core from code (globalSetup, a plain Node script); resolves to
 * `{ url, token, process, stop() }` once pages can load (health's `ready`). Rejects with
 * Core's reason if it exits, if provisioning fails, or after `timeoutMs`.
 * `env`: more environment for Core (e.g. `PEDELEC_CACHE_DIR`).
 * `echo: true` passes Core's output through to this process's stdout/stderr.
 */
export async function startCore({
  app, port, token = DEFAULT_TOKEN, pedelec = "pedelec", pyodide, args = [],
  env = {}, timeoutMs = CORE_READY_TIMEOUT_MS, echo = false,
}) {
  const argv = ["serve", "--host", "127.0.0.1", "--port", String(port)];
  if (app) argv.push("--app", app);
  if (pyodide) argv.push("--pyodide", pyodide);
  argv.push(...args);
  const child = spawn(pedelec, argv, {
    env: { ...process.env, ...env, PEDELEC_ADMIN_TOKEN: token },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const keep = (chunk) => { output = (output + chunk).slice(-OUTPUT_TAIL_CHARS); };
  child.stdout.on("data", (chunk) => { keep(chunk); if (echo) process.stdout.write(chunk); });
  child.stderr.on("data", (chunk) => { keep(chunk); if (echo) process.stderr.write(chunk); });
  let spawnError = null;
  child.once("error", (err) => { spawnError = err; });
  running.add(child);
  child.once("exit", () => running.delete(child));
  const core = { ...coreAt(port, token), process: child };
  core.stop = () => new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null || spawnError) return resolve();
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
  });
  const fail = async (reason) => {
    await core.stop();
    throw new Error(`pedelec test kit: ${reason}${output ? `\nCore's output:\n${output}` : ""}`);
  };
  const deadline = Date.now() + timeoutMs;
  let health = null;
  while (Date.now() < deadline) {
    if (spawnError) {
      return fail(`cannot run ${JSON.stringify(pedelec)} (${spawnError.code ?? spawnError.message}): `
        + "pass `pedelec: \".venv/bin/pedelec\"` (the CLI inside your virtualenv)");
    }
    if (child.exitCode !== null) return fail(`pedelec serve exited (${child.exitCode}) before it was ready`);
    try {
      const response = await fetch(`${core.url}/pedelec/v1/health`, { signal: AbortSignal.timeout(5_000) });
      if (response.ok) health = await response.json();
    } catch {
      // not listening yet
    }
    if (health?.ready) return core;
    if (health && (health.pyodide === "error" || health.pyodide === "missing")) {
      return fail(`Core at ${core.url} is up, but pages cannot load: ${await runtimeDetail(core)}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const where = health
    ? `Core answers, but its Pyodide runtime is still "${health.pyodide}" (a first start downloads it: `
      + "give `readyTimeoutMs`/`timeoutMs` more, or provision once beforehand with "
      + "`python -m pedelec_pyodide.build.provision DIR` and pass `pyodide: \"DIR/pyodide\"`)"
    : "Core never answered on its health URL";
  return fail(`Core at ${core.url} was not ready within ${timeoutMs} ms: ${where}`);
}

/** Core's own words on why its runtime is not served (the 503 text of /pedelec/pyodide/). */
async function runtimeDetail(core) {
  try {
    const response = await fetch(`${core.url}/pedelec/pyodide/pyodide.mjs`, { signal: AbortSignal.timeout(5_000) });
    return (await response.text()).trim().slice(0, 2_000);
  } catch (err) {
    return err.message;
  }
}

/** `node testing.js serve '{json options}'`: what coreWebServer runs (see there). */
async function serveMain(json) {
  const options = JSON.parse(json);
  let core;
  try {
    core = await startCore({ ...options, timeoutMs: options.readyTimeoutMs, echo: true });
  } catch (err) {
    process.stderr.write(`${err.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`pedelec test kit: Core is ready at ${core.url}\n`);
  let stopping = false;
  for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
    process.once(signal, () => {
      stopping = true;
      core.stop().then(() => process.exit(0));
    });
  }
  core.process.once("exit", (code) => {
    if (stopping) return;
    process.stderr.write(`pedelec test kit: Core exited (${code}) while the tests ran\n`);
    process.exit(1);
  });
}

/** Open `url` in `page` and wait for pedelec-pyodide to be ready. */
export async function openPage(page, url, { timeout = PAGE_START_TIMEOUT_MS } = {}) {
  const started = Date.now();
  await page.goto(url, { timeout });
  return waitForReady(page, { timeout: Math.max(1_000, timeout - (Date.now() - started)) });
}

/**
 * Wait for `window.pedelecReady`; returns `{ sessionId, core }`, or throws the start's
 * own error, or says what was still missing after `timeout` ms.
 *
 * The waiting runs in the page, on its own timers: a page busy booting Pyodide answers
 * late, which must not read as "the loader never ran".
 */
export async function waitForReady(page, { timeout = PAGE_START_TIMEOUT_MS } = {}) {
  const loaderWait = Math.min(LOADER_TIMEOUT_MS, timeout);
  const outcome = await page.evaluate(async ([loaderMs, totalMs]) => {
    const started = performance.now();
    const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
    while (window.pedelecReady === undefined) {
      if (performance.now() - started > loaderMs) return { noLoader: true };
      await sleep(50);
    }
    const left = Math.max(1_000, totalMs - (performance.now() - started));
    return Promise.race([
      window.pedelecReady.then(
        (p) => ({ sessionId: p.session.id, core: p.core }),
        (e) => ({ error: e.message }),
      ),
      sleep(left).then(() => ({ late: true })),
    ]);
  }, [loaderWait, timeout]);
  if (outcome.error) throw new Error(outcome.error);
  if (outcome.noLoader) {
    throw new Error(
      `pedelec test kit: window.pedelecReady is not defined ${loaderWait} ms after ${page.url()} loaded: `
      + "the page did not run the loader. Check its <script type=\"module\" src=...pedelec-pyodide.js> "
      + "(when Core serves the app: src=\"/pedelec/pedelec-pyodide.js\") and the browser console.",
    );
  }
  if (outcome.late) {
    throw new Error(
      `pedelec test kit: pedelec-pyodide did not start within ${timeout} ms on ${page.url()} `
      + "(window.pedelecReady still pending). On a slow machine pass { timeout } to openPage/"
      + "waitForReady and raise Playwright's test timeout above it.",
    );
  }
  return outcome;
}

/** `fetch` from Core, failing with words when nothing answers there (not a bare ECONNREFUSED). */
async function fetchCore(core, url, init) {
  try {
    return await fetch(url, init);
  } catch (err) {
    const why = err.cause?.code ?? err.cause?.message ?? err.message;
    throw new Error(`pedelec test kit: Core is not reachable at ${core.url} (${why}): is it running, `
      + "on that port? (coreWebServer/startCore start it; coreAt(port) must name its port)", { cause: err });
  }
}

/** Call a page tool through Core's control API (as the agent would). */
export async function callTool(core, sessionId, tool, args = {}, { timeoutMs = TOOL_CALL_TIMEOUT_MS } = {}) {
  const body = { tool, args, timeoutMs };
  const response = await fetchCore(core, `${core.url}/pedelec/v1/sessions/${encodeURIComponent(sessionId)}/tool-calls`, {
    method: "POST",
    headers: { authorization: `Bearer ${core.token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`control API: HTTP ${response.status}: ${await response.text()}`);
  return response.json();
}

/** GET a session's state from Core (`state`, `connected`, tool metadata, ...). */
export async function getSession(core, sessionId) {
  const response = await fetch(`${core.url}/pedelec/v1/sessions/${encodeURIComponent(sessionId)}`, {
    headers: { authorization: `Bearer ${core.token}` },
  });
  if (!response.ok) throw new Error(`control API: HTTP ${response.status}: ${await response.text()}`);
  return response.json();
}

/**
 * Send `/call TOOL {json}` lines to the offline agent from the page; returns its reply.
 * `calls`: a string (sent as is) or a list of `[tool, args]`.
 */
export async function callViaAgent(page, calls) {
  const text = typeof calls === "string"
    ? calls
    : calls.map(([tool, args]) => `/call ${tool} ${JSON.stringify(args ?? {})}`).join("\n");
  return page.evaluate((t) => window.pedelec.session.sendText(t), text);
}

/** `window.pedelec.session.state` now. */
export function sessionState(page) {
  return page.evaluate(() => window.pedelec.session.state);
}

/** Wait until `window.pedelec.session.state` is `state`. */
export async function waitForState(page, state, { timeout = STATE_TIMEOUT_MS } = {}) {
  await page.waitForFunction((s) => window.pedelec?.session.state === s, state, { timeout });
}

/**
 * Run Python in the page's namespace (where the blocks ran and `session` is bound) and
 * return the value of its last expression, converted to JSON-like JS (dict -> object,
 * list/tuple -> array, None -> null inside them). A value with no such form (a function
 * such as a disposer, a DOM proxy) cannot cross to the test and comes back `undefined`:
 * keep it in the namespace instead (`runPython(page, "dispose = session.on_tool(...)")`,
 * later `runPython(page, "dispose()")`).
 */
export async function runPython(page, code) {
  return page.evaluate(async (c) => {
    const value = await window.pedelec.runPython(c);
    if (value === null || typeof value?.toJs !== "function") return value;  // already JS
    try {
      let plain;
      try {
        plain = value.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
      } catch {
        return undefined;  // no JSON-like form
      }
      if (typeof plain?.toJs === "function") return undefined;
      // None inside a container converts to undefined, which the test would not see
      const nulls = (v) => (v === undefined ? null : Array.isArray(v) ? v.map(nulls)
        : v && typeof v === "object" ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, nulls(x)]))
          : v);
      return nulls(plain);
    } finally {
      value.destroy();
    }
  }, code);
}

/**
 * Which WebMCP the page has: `"native"` (the browser's own `document.modelContext`, e.g.
 * Chromium launched with `--enable-features=WebMCP`), `"polyfill"` (the MCP-B polyfill's),
 * or `null` (none: the page's tools are not offered to the browser's agent).
 */
export function webmcpImplementation(page) {
  return page.evaluate(() => {
    const context = document.modelContext;
    if (!context) return null;
    return context.__isWebMCPPolyfill ? "polyfill" : "native";
  });
}

/**
 * The page's WebMCP tools, as the browser's agent is given them: `[{ name, title,
 * description, inputSchema, annotations }]`, sorted by name, from `document.modelContext`
 * (native where the browser has it, else the polyfill's registry). `title` is `""` or
 * absent, and `annotations` absent, when the tool has none. Throws when the page has no
 * WebMCP.
 */
export async function webmcpTools(page) {
  const tools = await page.evaluate(async () => {
    const context = document.modelContext;
    if (!context) return null;
    return (await context.getTools()).map((tool) => ({
      name: tool.name,
      title: tool.title,
      description: tool.description,
      // the draft keeps a tool's input schema as JSON text; implementations give either
      inputSchema: typeof tool.inputSchema === "string" && tool.inputSchema
        ? JSON.parse(tool.inputSchema) : tool.inputSchema,
      annotations: tool.annotations,
    }));
  });
  if (tools === null) throw new Error(`pedelec test kit: ${page.url()} has no document.modelContext (WebMCP): ${WEBMCP_HINT}`);
  return tools.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

const WEBMCP_HINT = "launch Chromium with --enable-features=WebMCP, or load the MCP-B polyfill "
  + "(@mcp-b/webmcp-polyfill) in the page first (page.addInitScript({ path }))";

/**
 * Call the page's WebMCP tool `name` with `input` (an object) as the browser's agent does;
 * returns the result (the tool's result JSON value: an error result is
 * `{ error: { code, message, ... } }`, not a throw; a string result comes back as it is,
 * as the browser passes it on, so a string that is JSON text reads as its value). Native
 * WebMCP is called through Playwright's `page.webmcp.callTool`, the polyfill through its
 * `executeTool(tool, jsonText)`. Throws when no such tool is registered, or the call
 * itself fails.
 */
export async function callWebMCPTool(page, name, input = {}) {
  const implementation = await webmcpImplementation(page);
  if (implementation === null) throw new Error(`pedelec test kit: ${page.url()} has no document.modelContext (WebMCP): ${WEBMCP_HINT}`);
  if (implementation === "native") return page.webmcp.callTool(name, input);
  const outcome = await page.evaluate(async ([tool, text]) => {
    const context = document.modelContext;
    const tools = await context.getTools();
    const found = tools.find((t) => t.name === tool);
    if (!found) return { missing: tools.map((t) => t.name) };
    return { text: await context.executeTool(found, text) };
  }, [name, JSON.stringify(input)]);
  if (outcome.missing) {
    throw new Error(`pedelec test kit: no WebMCP tool named "${name}" on ${page.url()}`
      + ` (registered: ${outcome.missing.join(", ") || "none"})`);
  }
  return resultOf(outcome.text);
}

/** The value of a result as `executeTool` gives it: JSON text, except that both Chromium
 * and the polyfill pass a string result on as it is (Playwright reads it the same way). */
function resultOf(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

if (process.argv[2] === "serve" && process.argv[1] && realpathSync(process.argv[1]) === KIT) {
  await serveMain(process.argv[3]);
}
