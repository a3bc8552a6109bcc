// Start-up: each failure rejects window.pedelecReady with a clear message (also logged).
import { expect, test } from "@playwright/test";
import { SNAPSHOT, app, consoleOf, openPage, runPython } from "./helpers.js";

async function failure(page, url) {
  const lines = consoleOf(page);
  await page.goto(url);
  const error = await page.evaluate(() => window.pedelecReady.then(() => null, (e) => e.message));
  expect(error).not.toBeNull();
  expect(lines.some((l) => l.type === "error" && l.text.startsWith("pedelec: "))).toBe(true);
  expect(await page.evaluate(() => window.pedelec)).toBeUndefined();
  return error;
}

test("ready: window.pedelec, pedelec:ready, state and id", async ({ page }) => {
  await page.addInitScript(() => {
    document.addEventListener("pedelec:ready", (e) => {
      window.readyDetail = e.detail.session.id;
      window.jsonschemaAtReady = e.detail.pyodide.runPython("import sys; 'jsonschema' in sys.modules");
    });
  });
  const { sessionId } = await openPage(page, `${app.url}/tools.html`);
  expect(await page.evaluate(() => window.readyDetail)).toBe(sessionId);
  expect(await page.evaluate(() => ({ state: window.pedelec.session.state, hasPyodide: !!window.pedelec.pyodide }))).toEqual({ state: "idle", hasPyodide: true });
  // restored from the snapshot, jsonschema is imported already (at no cost); without
  // one, it is not imported on the way to ready
  expect(await page.evaluate(() => [window.pedelec.snapshot, window.jsonschemaAtReady])).toEqual([SNAPSHOT, SNAPSHOT]);
});

test("two tools under one name", async ({ page }) => {
  const error = await failure(page, `${app.url}/duplicate.html`);
  expect(error).toContain("page code");
  expect(error).toContain("two tools are defined under the name 'twin'");
});

test("a Python error in the page's code names the block", async ({ page }) => {
  const error = await failure(page, `${app.url}/python-error.html`);
  // the page's frames with their source lines and the error; nothing of Pyodide's own
  expect(error).toBe([
    "pedelec: page code: Python error in inline block #2, line 3:",
    "Traceback (most recent call last):",
    '  File "<pedelec/python #2>", line 5, in <module>',
    "    broken()",
    '  File "<pedelec/python #2>", line 3, in broken',
    "    return 1 / 0",
    "ZeroDivisionError: division by zero",
  ].join("\n"));
});

test("a syntax error in a src= block names the file and the line", async ({ page }) => {
  const error = await failure(page, `${app.url}/python-error-src.html`);
  expect(error).toContain('Python error in block src="syntax-error.py.txt", line 5:');
  expect(error).toContain("    def f(:");
  expect(error).toContain("SyntaxError: invalid syntax");
  expect(error).not.toContain("pyodide/");
});

test("Core unreachable", async ({ page }) => {
  const error = await failure(page, `${app.url}/no-core.html`);
  expect(error).toContain("connecting to Core");
  expect(error).toContain("127.0.0.1:9");
});

test("our wheel missing", async ({ page }) => {
  await page.route("**/pedelec_pyodide-*.whl", (route) => route.fulfill({ status: 404, body: "gone" }));
  const error = await failure(page, `${app.url}/tools.html`);
  expect(error).toContain("pedelec-pyodide");
});

test("micropip stays usable for the page's own packages", async ({ page }) => {
  await openPage(page, `${app.url}/micropip.html`);
  expect(await runPython(page, "micropip_version")).toMatch(/^\d+\.\d+/);
});
