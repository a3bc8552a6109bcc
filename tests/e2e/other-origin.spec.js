// An app on its own origin (issue 14): served by a plain static server on another loopback
// port, it loads the loader (module and classic script) straight from a Core started with
// `--allow-origin` that origin. The same server reached as `localhost` is another origin,
// which Core does not allow. Core's side without a browser: tests/core/test_cross_origin.py.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { expect, test } from "@playwright/test";
import { PYODIDE, SNAPSHOT, callTool, consoleOf, startCore, waitForReady } from "./helpers.js";

test.describe.configure({ mode: "default" }); // one Core and one static server for the file

const TOKEN = "other-origin-token";
const DEAD = "http://127.0.0.1:9"; // nothing listens there
let core;
let server;
let allowed; // http://127.0.0.1:PORT, the origin Core allows
let refused; // http://localhost:PORT, the same server under another origin

const TOOL = `<script type="pedelec/python">
from pedelec_pyodide import define_tool

@define_tool
def get_origin() -> str:
    """The page's origin."""
    import js
    return js.location.origin

session.add_tool(get_origin)
</script>`;

// The pages of the app, by path; CORE is Core's URL.
const pages = {
  "/module.html": (c) => `<script type="module" src="${c}/pedelec/pedelec-pyodide.js"></script>${TOOL}`,
  "/classic.html": (c) => `<script src="${c}/pedelec/pedelec-pyodide.classic.js"></script>${TOOL}`,
  // a copy of the loader in the app, pointed at Core
  "/copied.html": (c) => `<script type="module" src="/lib/pedelec-pyodide.js" data-core="${c}"></script>${TOOL}`,
  "/copied-dead.html": () => `<script type="module" src="/lib/pedelec-pyodide.js" data-core="${DEAD}"></script>${TOOL}`,
  // the snippet docs/how-to/own-origin.md gives for a module script that cannot load at all
  // the page is on `refused`; the loader comes from a server that sends no CORS headers
  "/classic-nocors.html": () => `<script src="${allowed}/nocors/pedelec/pedelec-pyodide.classic.js"></script>`,
  "/copied-nocors.html": (c) => `<script type="module" src="/lib/pedelec-pyodide.js" data-core="${c}"
    data-pyodide="${refused}/nocors/pedelec/pyodide/pyodide.mjs"></script>${TOOL}`,
  "/snippet.html": () => `<script type="module" src="${DEAD}/pedelec/pedelec-pyodide.js"
    onerror="window.pedelecReady = Promise.reject(new Error('pedelec: cannot load ' + this.src + ': is Core running there? (the console has the reason)'))"></script>`,
};

function listen(srv) {
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve(srv.address().port)));
}

test.beforeAll(async () => {
  const loader = readFileSync(new URL("../../web/pedelec-pyodide.js", import.meta.url));
  server = createServer(async (request, response) => {
    const path = new URL(request.url, "http://x").pathname;
    if (path.startsWith("/nocors/")) { // Core's files, as a proxy that drops CORS headers serves them
      const upstream = await fetch(`${core.url}/${path.slice("/nocors/".length)}`);
      response.writeHead(upstream.status, { "content-type": upstream.headers.get("content-type") });
      response.end(Buffer.from(await upstream.arrayBuffer()));
    } else if (path === "/lib/pedelec-pyodide.js") {
      response.writeHead(200, { "content-type": "text/javascript" });
      response.end(loader);
    } else if (pages[path]) {
      response.writeHead(200, { "content-type": "text/html" });
      response.end(`<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><title>app</title>${pages[path](core.url)}`);
    } else {
      response.writeHead(404).end();
    }
  });
  const appPort = await listen(server);
  allowed = `http://127.0.0.1:${appPort}`;
  refused = `http://localhost:${appPort}`;
  const probe = createServer();
  const corePort = await listen(probe);
  await new Promise((resolve) => probe.close(resolve));
  core = await startCore({
    port: corePort, token: TOKEN, pedelec: ".venv/bin/pedelec", pyodide: PYODIDE,
    args: ["--allow-origin", allowed, "--quiet"], timeoutMs: 60_000,
  });
});

test.afterAll(async () => {
  await core?.stop();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
});

async function rejection(page, url) {
  await page.goto(url);
  await page.waitForFunction(() => window.pedelecReady !== undefined, null, { timeout: 30_000 });
  return page.evaluate(() => window.pedelecReady.then(() => null, (e) => e.message));
}

for (const kind of ["module", "classic", "copied"]) {
  test(`${kind}: an allowed origin loads from Core and gets a session`, async ({ page }) => {
    await page.goto(`${allowed}/${kind}.html`);
    const { sessionId } = await waitForReady(page);
    const { result } = await callTool(core, sessionId, "get_origin");
    expect(result).toBe(allowed);
    // the snapshot, its manifest and its module come from Core across origins too
    expect(await page.evaluate(() => window.pedelec.snapshot)).toBe(SNAPSHOT);
  });
}

for (const kind of ["module", "classic"]) {
  test(`${kind}: a refused origin is told its origin and --allow-origin`, async ({ page }) => {
    const lines = consoleOf(page);
    const error = await rejection(page, `${refused}/${kind}.html`);
    expect(error).toBe(`pedelec: connecting to Core: Core at ${core.url}/ does not let pages from ${refused} open a session: start it with --allow-origin ${refused}`);
    expect(lines.some((l) => l.type === "error" && l.text === error)).toBe(true);
  });
}

test("classic: a loader that cannot be imported rejects with the step and the likely causes", async ({ page }) => {
  const error = await rejection(page, `${refused}/classic-nocors.html`);
  expect(error).toMatch(/^pedelec: loading pedelec-pyodide\.js: cannot import http:\/\/127\.0\.0\.1:\d+\/nocors\/pedelec\/pedelec-pyodide\.js: /);
  expect(error).toContain("Access-Control-Allow-Origin");
  expect(error).toContain("Failed to fetch dynamically imported module");
});

test("copied loader: Pyodide without CORS headers is named as the cause", async ({ page }) => {
  const error = await rejection(page, `${allowed}/copied-nocors.html`);
  expect(error).toBe(`pedelec: loading Pyodide: cannot import ${refused}/nocors/pedelec/pyodide/pyodide.mjs: ${refused} answers without the CORS header Access-Control-Allow-Origin, so the browser does not let ${allowed} use it: load it from a pedelec Core (which sends that header), or add the header where it is served`);
});

test("copied loader: no Core there is said so", async ({ page }) => {
  const error = await rejection(page, `${allowed}/copied-dead.html`);
  expect(error).toBe(`pedelec: loading Pyodide: cannot import ${DEAD}/pedelec/pyodide/pyodide.mjs: the browser cannot reach ${DEAD}: is Core running there, and is the URL right? (the console has the browser's reason)`);
});

test("copied loader: a runtime still being provisioned is quoted", async ({ page }) => {
  await page.route("**/pedelec/pyodide/pyodide.mjs", (route) => route.fulfill({
    status: 503, body: "Pyodide runtime provisioning: fetching the Pyodide runtime and wheels\n",
    headers: { "access-control-allow-origin": "*", "content-type": "text/plain" },
  }));
  const error = await rejection(page, `${allowed}/copied.html`);
  expect(error).toBe(`pedelec: loading Pyodide: cannot import ${core.url}/pedelec/pyodide/pyodide.mjs: ${core.url} answers HTTP 503: Pyodide runtime provisioning: fetching the Pyodide runtime and wheels`);
});

test("module script that cannot load: the documented onerror snippet rejects pedelecReady", async ({ page }) => {
  const error = await rejection(page, `${allowed}/snippet.html`);
  expect(error).toBe(`pedelec: cannot load ${DEAD}/pedelec/pedelec-pyodide.js: is Core running there? (the console has the reason)`);
});

test("Python connect() on another origin asks Core's origin check first", async ({ page }) => {
  await page.goto(`${allowed}/module.html`);
  await waitForReady(page);
  const run = (code) => page.evaluate((c) => window.pedelec.runPython(c), code);
  // allowed: a second session from the page's own Python
  expect(await run(`
import pedelec_pyodide
extra = await pedelec_pyodide.connect("${core.url}", storage=False)
connected = extra.session_id is not None
extra.close()
connected`)).toBe(true);
  // refused (Core's answer, as a Core without --allow-origin gives it): said before any socket
  await page.route("**/pedelec/v1/origin-check", (route) => route.fulfill({
    status: 200, body: '{"allowed": false}',
    headers: { "access-control-allow-origin": "*", "content-type": "application/json" },
  }));
  expect(await run(`
from pedelec_pyodide.browser import OriginRefusedError
try:
    await pedelec_pyodide.connect("${core.url}", storage=False)
    said = None
except OriginRefusedError as exc:
    said = str(exc)
said`)).toBe(`Core at ${core.url} does not let pages from ${allowed} open a session: start it with --allow-origin ${allowed}`);
});
