// MCP end to end: the official `mcp` Python client (tests/e2e/mcp_client.py) lists and
// calls the demo page's tools through Core's MCP endpoint while the page runs in Chromium.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, SNAPSHOT, demo, openPage } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);

const run = promisify(execFile);

async function mcpClient(sessionId, calls, token = demo.token) {
  const url = `${demo.url}/pedelec/v1/sessions/${sessionId}/mcp`;
  const { stdout } = await run(
    ".venv/bin/python",
    ["tests/e2e/mcp_client.py", url, token, ...calls.map((c) => JSON.stringify(c))],
    { timeout: 60_000, killSignal: "SIGKILL" },
  );
  return JSON.parse(stdout);
}

test("an MCP client lists and calls the demo page's tools, and the page changes", async ({ page }) => {
  const { sessionId } = await openPage(page, `${demo.url}/`);
  await expect(page.locator("#counter-value")).toHaveText("0");
  const title = await page.title();

  const outcome = await mcpClient(sessionId, [
    { tool: "get_current_page", args: {} },
    { tool: "update_counter", args: { delta: 5 } },
    { tool: "update_counter", args: { delta: "five" } },
  ]);

  const names = outcome.tools.map((t) => t.name);
  expect(names).toEqual(expect.arrayContaining(["get_current_page", "update_counter"]));
  const counter = outcome.tools.find((t) => t.name === "update_counter");
  expect(counter.inputSchema.type).toBe("object");
  expect(counter.inputSchema.properties.delta.type).toBe("integer");

  const [current, updated, invalid] = outcome.calls;
  expect(current.isError).toBe(false);
  expect(current.structuredContent).toEqual({ title, url: `${demo.url}/` });
  expect(JSON.parse(current.text[0])).toEqual(current.structuredContent);
  expect(updated).toEqual({ isError: false, structuredContent: { value: 5 }, text: ['{"value":5}'] });
  expect(invalid.isError).toBe(true);
  expect(invalid.text[0]).toMatch(/^INVALID_ARGS: /);

  // the DOM changed, and the page's own log shows the calls
  await expect(page.locator("#counter-value")).toHaveText("5");
  const rows = page.locator("#log tr[data-tool=update_counter] td.result");
  await expect(rows.filter({ hasText: '{"value":5}' })).toHaveCount(1);
});

test("the MCP endpoint refuses a client without the admin token", async ({ page }) => {
  const { sessionId } = await openPage(page, `${demo.url}/`);
  await expect(mcpClient(sessionId, [], "wrong-token")).rejects.toThrow();
  const response = await page.request.post(`${demo.url}/pedelec/v1/sessions/${sessionId}/mcp`, {
    data: { jsonrpc: "2.0", id: 1, method: "tools/list" },
  });
  expect(response.status()).toBe(401);
  expect((await response.json()).error.code).toBe("UNAUTHORIZED");
});
