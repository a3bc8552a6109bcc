// The tutorial's page (docs/tutorial.md) in Chromium, as the reader builds it: its
// `public/index.html` and `public/tools.py` taken from the markdown, served by a plain
// static server on its own origin, the loader loaded from a Core started with
// `--allow-origin` that origin. The commands around it run in tests/docs/test_tutorial.py.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, PYODIDE, SNAPSHOT, callTool, startCore } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);

test.describe.configure({ mode: "default" }); // one Core and one static server for the file

const TOKEN = "tutorial-token";
const TUTORIAL = readFileSync(new URL("../../docs/tutorial.md", import.meta.url), "utf8");
const TUTORIAL_CORE = "http://127.0.0.1:8765"; // as the tutorial writes it

/** The blocks the tutorial marks `<!-- doc: file PATH -->`, by path (tests/docs/docrun.py). */
function tutorialFiles() {
  const files = {};
  for (const [, path, body] of TUTORIAL.matchAll(/<!-- doc: file (\S+) -->\n```[^\n]*\n([\s\S]*?)\n```/g)) {
    files[path] = body + "\n";
  }
  return files;
}

let core;
let server;
let allowed; // http://127.0.0.1:PORT, the app's origin, which Core allows
let refused; // http://localhost:PORT, the same app under an origin Core does not allow

function listen(srv) {
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve(srv.address().port)));
}

test.beforeAll(async () => {
  const files = tutorialFiles();
  expect(Object.keys(files)).toEqual(expect.arrayContaining(["public/index.html", "public/tools.py"]));
  const probe = createServer();
  const corePort = await listen(probe);
  await new Promise((resolve) => probe.close(resolve));
  const coreUrl = `http://127.0.0.1:${corePort}`;
  const types = { html: "text/html", py: "text/x-python" };
  server = createServer((request, response) => {
    let path = new URL(request.url, "http://x").pathname;
    if (path === "/") path = "/index.html";
    const body = files[`public${path}`];
    if (body === undefined) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { "content-type": types[path.split(".").pop()] ?? "text/plain" });
    response.end(body.replaceAll(TUTORIAL_CORE, coreUrl));
  });
  const appPort = await listen(server);
  allowed = `http://127.0.0.1:${appPort}`;
  refused = `http://localhost:${appPort}`;
  core = await startCore({
    port: corePort, token: TOKEN, pedelec: ".venv/bin/pedelec", pyodide: PYODIDE,
    args: ["--allow-origin", allowed, "--quiet"], timeoutMs: 60_000,
  });
});

test.afterAll(async () => {
  await core?.stop();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
});

test("the tutorial's page starts on its own origin and its tools change its DOM", async ({ page }) => {
  await page.goto(`${allowed}/`);
  await expect(page.locator("#status")).toHaveText(/^Ready: session [\w-]+$/, { timeout: 45_000 });
  const sessionId = (await page.locator("#status").textContent()).split(" ").pop();

  const added = await callTool(core, sessionId, "add_item", { text: "buy milk" });
  expect(added).toMatchObject({ result: { items: ["buy milk"] }, handledBy: "inline" });
  await expect(page.locator("#items li")).toHaveText(["buy milk"]);

  const refusedArgs = await callTool(core, sessionId, "add_item", { text: 42 });
  expect(refusedArgs.result.error).toMatchObject({ code: "INVALID_ARGS", retryable: true });
  expect(refusedArgs.handledBy).toBe("none");

  const turn = await fetch(`${core.url}/pedelec/v1/sessions/${sessionId}/turns`, {
    method: "POST", headers: { authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify({ text: "/call list_items" }),
  }).then((r) => r.json());
  expect(turn).toMatchObject({ status: "completed", text: 'list_items → {"items": ["buy milk"]}' });
});

test("the tutorial's page on an origin Core does not allow says which option to give", async ({ page }) => {
  await page.goto(`${refused}/`);
  await expect(page.locator("#status")).toHaveText(
    `pedelec: connecting to Core: Core at ${core.url}/ does not let pages from ${refused} open a session: start it with --allow-origin ${refused}`,
    { timeout: 45_000 });
});
