/**
 * pedelec-pyodide test kit for Playwright (Node side). See docs/testing.md.
 *
 *   import { coreWebServer, openPage, callTool, callViaAgent } from "pedelec-pyodide/web/testing.js";
 *
 * - `coreWebServer({ app, port, token })`: a Playwright `webServer` entry that starts
 *   Core (`pedelec serve --app DIR`) on a loopback port with a fixed admin token.
 * - `startCore(...)`: the same from code (globalSetup, a plain Node script); `stop()` it.
 * - `openPage(page, url)`: go to a page that loads pedelec-pyodide.js and wait for it to be
 *   ready; returns `{ sessionId, core }`. A start failure fails with its clear message.
 * - `callTool(core, sessionId, tool, args)`: call a page tool through Core's control API
 *   (exactly what the agent would get back): `{ toolRequestId, result, handledBy }`.
 * - `callViaAgent(page, lines)`: send `/call TOOL {json}` lines to the offline agent from
 *   the page (`session.sendText`); returns the agent's reply text.
 * - `sessionState(page)`, `waitForState(page, state)`: `window.pedelec.session.state`.
 *
 * Node 18+ (global fetch). No dependency besides Node itself.
 */
import { spawn } from "node:child_process";

export const DEFAULT_TOKEN = "pedelec-test-token";

/** `{ url, token }` of a Core on 127.0.0.1:port. */
export function coreAt(port, token = DEFAULT_TOKEN) {
  return { url: `http://127.0.0.1:${port}`, token };
}

/**
 * A Playwright `webServer` entry starting Core for `app` (a directory served at `/`).
 * `pedelec`: the CLI to run (default `pedelec` on PATH); `pyodide`: a provisioned runtime
 * directory (else Core provisions one into its cache on first use).
 */
export function coreWebServer({ app, port, token = DEFAULT_TOKEN, pedelec = "pedelec", pyodide, args = [] }) {
  const command = [pedelec, "serve", "--host", "127.0.0.1", "--port", String(port)];
  if (app) command.push("--app", app);
  if (pyodide) command.push("--pyodide", pyodide);
  command.push(...args);
  return {
    command: command.map(shellQuote).join(" "),
    url: `http://127.0.0.1:${port}/pedelec/v1/health`,
    env: { PEDELEC_ADMIN_TOKEN: token },
    reuseExistingServer: false,
    timeout: 180_000,
    stdout: "pipe",
    stderr: "pipe",
  };
}

function shellQuote(word) {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", "'\\''")}'`;
}

/** Start Core from code; resolves once its health endpoint answers. */
export async function startCore({ app, port, token = DEFAULT_TOKEN, pedelec = "pedelec", pyodide, args = [], timeoutMs = 180_000 }) {
  const argv = ["serve", "--host", "127.0.0.1", "--port", String(port)];
  if (app) argv.push("--app", app);
  if (pyodide) argv.push("--pyodide", pyodide);
  argv.push(...args);
  const child = spawn(pedelec, argv, {
    env: { ...process.env, PEDELEC_ADMIN_TOKEN: token },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (chunk) => { output += chunk; });
  child.stderr.on("data", (chunk) => { output += chunk; });
  const core = { ...coreAt(port, token), process: child };
  core.stop = () => new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
  });
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`pedelec serve exited (${child.exitCode}):\n${output}`);
    try {
      const response = await fetch(`${core.url}/pedelec/v1/health`);
      if (response.ok) return core;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  await core.stop();
  throw new Error(`pedelec serve did not answer on ${core.url} within ${timeoutMs} ms:\n${output}`);
}

/** Open `url` in `page` and wait for pedelec-pyodide to be ready. */
export async function openPage(page, url, { timeout = 60_000 } = {}) {
  await page.goto(url);
  return waitForReady(page, { timeout });
}

/** Wait for `window.pedelecReady`; returns `{ sessionId, core }` or throws its error. */
export async function waitForReady(page, { timeout = 60_000 } = {}) {
  await page.waitForFunction(() => window.pedelecReady !== undefined, null, { timeout });
  const outcome = await page.evaluate(() => window.pedelecReady.then(
    (p) => ({ sessionId: p.session.id, core: p.core }),
    (e) => ({ error: e.message }),
  ));
  if (outcome.error) throw new Error(outcome.error);
  return outcome;
}

/** Call a page tool through Core's control API (as the agent would). */
export async function callTool(core, sessionId, tool, args = {}, { timeoutMs } = {}) {
  const body = { tool, args };
  if (timeoutMs !== undefined) body.timeoutMs = timeoutMs;
  const response = await fetch(`${core.url}/pedelec/v1/sessions/${encodeURIComponent(sessionId)}/tool-calls`, {
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
export async function waitForState(page, state, { timeout = 10_000 } = {}) {
  await page.waitForFunction((s) => window.pedelec?.session.state === s, state, { timeout });
}

/** Run Python in the page's namespace (where the blocks ran and `session` is bound). */
export function runPython(page, code) {
  return page.evaluate((c) => window.pedelec.runPython(c), code);
}
