// The page-result family of the bad-input corpus (tests/corpus/page-results.jsonl), in
// Chromium: a Python handler in the page returns a JS value (pyodide.code.run_js(expr));
// Core must get the case's error result (or its JSON value), and after each case the
// session still answers a normal call and is idle again.
import { readFileSync } from "node:fs";
import { expect, test } from "@playwright/test";
import { app, callTool, openPage, runPython, sessionState } from "./helpers.js";

const CASES = readFileSync(new URL("../corpus/page-results.jsonl", import.meta.url), "utf8")
  .split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));

test.describe.configure({ mode: "serial" });

let page;
let sessionId;
test.beforeAll(async ({ browser }) => {
  page = await browser.newPage();
  ({ sessionId } = await openPage(page, `${app.url}/tools.html`));
  await runPython(page, `from pyodide.code import run_js
off_corpus = session.on_tool("corpus_value", lambda args: run_js(args["js"]))`);
});
test.afterAll(async () => { await page?.close(); });

test("the page-result family has its cases", () => {
  expect(CASES.length).toBeGreaterThanOrEqual(30);
  for (const c of CASES) expect(c.applies).toBe("page");
});

for (const c of CASES) {
  test(c.id, async () => {
    const { result, handledBy } = await callTool(app, sessionId, "corpus_value", { js: c.input.js });
    expect(handledBy).toBe("named");
    if ("code" in c.expect) {
      expect(result?.error?.code, JSON.stringify(result)).toBe(c.expect.code);
      expect(result.error.message).not.toContain("Traceback");
    } else {
      expect(result).toEqual(c.expect.value);
    }
    // the session still works, and is idle again
    const echo = await callTool(app, sessionId, "echo", { after: c.id });
    expect(echo).toMatchObject({ result: { inline: { after: c.id } }, handledBy: "inline" });
    expect(await sessionState(page)).toBe("idle");
  });
}
