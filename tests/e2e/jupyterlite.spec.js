// JupyterLite: `pedelec lite` builds the site (clean; the runtime and wheels come from the
// provisioning cache), `pedelec serve --app` serves it next to Core on a free loopback
// port, and headless Chromium runs the example notebook in the Pyodide kernel (a Web
// Worker). The control API then calls a tool the notebook defined. Every request the
// browser makes is logged: none may leave 127.0.0.1.
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { expect, test } from "@playwright/test";
import { SNAPSHOT, TOKEN } from "../../playwright.config.js";

const SITE = ".cache/e2e-lite/site";
const NOTEBOOK = "pedelec-example.ipynb";

test.describe.configure({ mode: "serial" });
// the kernel starts from the site's own runtime and its own snapshot, whichever runtime
// the suite's Cores serve: once is enough
test.skip(!SNAPSHOT, "the site has its own runtime: run in the pass with the snapshot");

/** Run a command to its end; rejects with its output when it fails. */
function run(command, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (d) => { output += d; });
    child.stderr.on("data", (d) => { output += d; });
    child.on("error", reject);
    child.on("exit", (code) => (code === 0 ? resolve(output) : reject(new Error(`${command} ${args.join(" ")} exited ${code}:\n${output}`))));
  });
}

/** Start Core (serving the site unless `options` say otherwise); resolves to { url, stop }
 * once it printed its URL. */
function serve(options = ["--app", SITE]) {
  const child = spawn(".venv/bin/pedelec", [
    "serve", "--host", "127.0.0.1", "--port", "0", ...options,
    "--pyodide", `${SITE}/static/pyodide`, "--tool-timeout", "20000", "--quiet",
  ], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PEDELEC_ADMIN_TOKEN: TOKEN } });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  let output = "";
  const started = new Promise((resolve, reject) => {
    child.stdout.on("data", (d) => {
      output += d;
      const found = /pedelec serve: (http:\/\/127\.0\.0\.1:\d+)\//.exec(output);
      if (found) resolve(found[1]);
    });
    child.stderr.on("data", (d) => { output += d; });
    child.on("exit", (code) => reject(new Error(`pedelec serve exited ${code}:\n${output}`)));
  });
  const stop = async () => {
    if (child.exitCode === null) child.kill("SIGTERM");
    await exited;
  };
  return started.then((url) => ({ url, stop }), async (error) => { await stop(); throw error; });
}

let core;

test.beforeAll(async () => {
  test.setTimeout(300_000);
  await run(".venv/bin/pedelec", ["lite", SITE]);
  core = await serve();
});

test.afterAll(async () => {
  await core?.stop();
});

async function control(path, body, on = core) {
  const response = await fetch(`${on.url}/pedelec/v1${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  expect(response.status, `${path}: ${response.status}`).toBe(200);
  return response.json();
}

/** The text outputs of the notebook's code cells, in order. */
async function cellOutputs(page) {
  return page.locator(".jp-CodeCell").evaluateAll((cells) =>
    cells.map((cell) => Array.from(cell.querySelectorAll(".jp-OutputArea-output"))
      .map((o) => o.textContent).join("")));
}

/** Run > Run All Cells once the notebook's kernel is connected and idle. Before that,
 * JupyterLab's run commands return without running anything (a cell's execute() needs the
 * session's kernel), which on a loaded machine left every cell without output. */
async function runAllCells(page) {
  await expect(page.locator(".jp-Notebook .jp-Cell").first()).toBeVisible({ timeout: 60_000 });
  // the kernel's name shows once the session has its kernel; the indicator says "idle"
  // briefly before that too (with "No Kernel"), so both are needed
  await expect(page.locator(".jp-Toolbar-kernelName")).toHaveText("Python (Pyodide)", { timeout: 60_000 });
  await expect(page.locator(".jp-Notebook-ExecutionIndicator")).toHaveAttribute("data-status", "idle", { timeout: 90_000 });
  await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
  await page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ }).click();
}

/** Wait for the last cell's output to contain `text`; if it does not within two minutes,
 * fail with every cell's output and the kernel's last console lines, which say which cell
 * stopped "Run All Cells" and why. */
async function untilLastCellShows(page, text, notes) {
  const deadline = Date.now() + 120_000;
  let outputs = [];
  while (Date.now() < deadline) {
    outputs = await cellOutputs(page);
    if (outputs.at(-1)?.includes(text)) return;
    await page.waitForTimeout(250);
  }
  throw new Error(`the last cell did not show ${JSON.stringify(text)} in 120 s.\n`
    + `cell outputs:\n${outputs.map((o, i) => `[${i}] ${o}`).join("\n")}\n`
    + `last console lines:\n${notes.slice(-30).join("\n")}`);
}

test("the example notebook runs offline and serves tool calls from Core", async ({ page, context }) => {
  test.setTimeout(180_000);
  const requests = [];
  context.on("request", (r) => requests.push(r.url()));
  page.on("websocket", (ws) => requests.push(ws.url()));
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  const notes = [];  // the kernel worker's console too
  page.on("console", (m) => notes.push(m.text()));

  await page.goto(`${core.url}/notebooks/index.html?path=${NOTEBOOK}`);
  // Run > Run All Cells, then wait for the last cell's output
  await runAllCells(page);
  const last = page.locator(".jp-CodeCell").last();
  await untilLastCellShows(page, "tool call(s)", notes);

  const [install, , connected, agent, dom, shown] = await cellOutputs(page);
  expect(install).not.toContain("Error");
  const sessionId = /session: (\S+) idle/.exec(connected)?.[1];
  expect(sessionId, connected).toBeTruthy();
  expect(agent).toContain("agent:");
  expect(agent).toContain("apples");
  expect(dom).toContain("page_title: TOOL_HANDLER_ERROR");
  expect(dom).toContain("AttributeError: document");
  expect(dom).toContain("the notebook kernel has no DOM");
  expect(shown).toContain("shopping: [{'name': 'apples', 'quantity': 3}]");
  expect(shown).toContain("2 tool call(s)");

  // Core knows the notebook's tools; a tool call through the control API runs in the kernel
  const session = await control(`/sessions/${sessionId}`);
  expect(session.tools.map((t) => t.name).sort()).toEqual(["add_item", "list_items", "page_title"]);
  const call = await control(`/sessions/${sessionId}/tool-calls`, { tool: "add_item", args: { name: "pears", quantity: 2 } });
  expect(call.result).toEqual([{ name: "apples", quantity: 3 }, { name: "pears", quantity: 2 }]);
  expect(call.handledBy).toBe("inline");
  const listed = await control(`/sessions/${sessionId}/tool-calls`, { tool: "list_items", args: {} });
  expect(listed.result).toEqual(call.result);

  // the notebook saw it: run the last cell again (in place)
  await last.locator(".jp-InputArea-editor").click();
  await page.keyboard.press("Control+Enter");
  await expect(last.locator(".jp-OutputArea-output")).toContainText("4 tool call(s)");
  await expect(last.locator(".jp-OutputArea-output")).toContainText("add_item {'name': 'pears', 'quantity': 2}");

  // offline: every request (page, kernel worker, service worker, WebSocket) stayed on Core
  expect(requests.length).toBeGreaterThan(20);
  const origin = new URL(core.url);
  const away = requests.filter((u) => !/^(data|blob):/.test(u) && new URL(u).host !== origin.host);
  expect(away).toEqual([]);
  expect(requests.some((u) => u.endsWith("/static/pyodide/pyodide.asm.wasm"))).toBe(true);
  expect(requests.some((u) => /\/static\/pyodide\/pedelec_pyodide-.*\.whl$/.test(u))).toBe(true);
  expect(errors).toEqual([]);
  // the kernel was restored from the site's memory snapshot, and loaded its packages
  // while Pyodide started (loadPyodideOptions), not one by one through piplite
  expect(requests.some((u) => u.endsWith("/static/pyodide/pedelec-kernel-snapshot.bin.gz"))).toBe(true);
  expect(notes.filter((n) => n.includes("without its memory snapshot"))).toEqual([]);
  expect(notes.some((n) => n.startsWith("Loaded ") && n.includes("pyodide-kernel"))).toBe(true);
  expect(notes.filter((n) => /Exception ignored|Bad file descriptor/.test(n))).toEqual([]);
});

const TYPES = {
  ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css",
  ".json": "application/json", ".ipynb": "application/json", ".wasm": "application/wasm",
  ".svg": "image/svg+xml", ".png": "image/png", ".whl": "application/zip",
  ".zip": "application/zip", ".woff2": "font/woff2", ".woff": "font/woff",
};

/** A plain static server for the site on a loopback port of its own. `edit` changes the
 * notebook's text as a user would edit it before running it. It has no kernel snapshot
 * (404, as when it could not be made): the kernel boots the usual way. */
async function staticSite(edit) {
  const server = createServer(async (request, response) => {
    let path = decodeURIComponent(new URL(request.url, "http://x").pathname);
    if (path.endsWith("/")) path += "index.html";
    const file = normalize(join(SITE, path));
    if (!file.startsWith(normalize(SITE)) || path.endsWith("/pedelec-kernel-snapshot.bin.gz")) {
      return response.writeHead(404).end();
    }
    try {
      let body = await readFile(file);
      if (path === `/files/${NOTEBOOK}`) body = Buffer.from(edit(body.toString()));
      response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
      response.end(body);
    } catch {
      response.writeHead(404).end();
    }
  });
  const port = await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server.address().port)));
  return { url: `http://127.0.0.1:${port}`, stop: () => new Promise((resolve) => server.close(resolve)) };
}

test("the site on a plain static server talks to a Core elsewhere (the notebook's one edit)", async ({ page, context }) => {
  test.setTimeout(180_000);
  let elsewhere;
  let site;
  try {
    // Core's URL is known once it runs; the site's origin once the static server runs
    let coreUrl = "";
    site = await staticSite((text) => text.replace(
      "CORE_URL = js.location.origin", `CORE_URL = \\"${coreUrl}\\"`));
    elsewhere = await serve(["--allow-origin", site.url]);
    coreUrl = elsewhere.url;
    const sockets = [];
    page.on("websocket", (ws) => sockets.push(ws.url()));
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    const notes = [];
    page.on("console", (m) => notes.push(m.text()));

    await page.goto(`${site.url}/notebooks/index.html?path=${NOTEBOOK}`);
    await runAllCells(page);
    await untilLastCellShows(page, "tool call(s)", notes);

    const [install, , connected, agent] = await cellOutputs(page);
    expect(install).not.toContain("Error");
    const sessionId = /session: (\S+) idle/.exec(connected)?.[1];
    expect(sessionId, connected).toBeTruthy();
    expect(agent).toContain("apples");
    const call = await control(`/sessions/${sessionId}/tool-calls`,
      { tool: "add_item", args: { name: "pears", quantity: 2 } }, elsewhere);
    expect(call.result).toEqual([{ name: "apples", quantity: 3 }, { name: "pears", quantity: 2 }]);
    // the kernel's socket went to that Core, not to the site's origin
    expect(sockets.some((u) => u.startsWith(elsewhere.url.replace("http", "ws")))).toBe(true);
    expect(errors).toEqual([]);
    // no snapshot there: the kernel said so, booted, and ran every cell all the same
    expect(notes.filter((n) => n.startsWith("pedelec: the notebook kernel starts without its memory snapshot (slower): ")
      && n.includes("answers HTTP 404"))).toHaveLength(1);
  } finally {
    await elsewhere?.stop();
    await site?.stop();
  }
});
