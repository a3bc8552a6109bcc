import { createRequire } from "node:module";
import { expect, test } from "@playwright/test";
import { callTool, callWebMCPTool, coreAt, openPage, webmcpTools } from "pedelec-pyodide/web/testing.js";

const core = coreAt(Number(process.env.APP_PORT ?? 8790), "test-token");
// the polyfill's standalone build, for a Chromium without WebMCP of its own
const POLYFILL = createRequire(import.meta.url).resolve("@mcp-b/webmcp-polyfill/iife");

test.beforeEach(async ({ page }, testInfo) => {
  if (testInfo.project.name !== "webmcp-native") await page.addInitScript({ path: POLYFILL });
});

test("the browser's agent lists and calls update_counter", async ({ page }) => {
  const { sessionId } = await openPage(page, "/");  // index.html has data-webmcp
  const [tool] = (await webmcpTools(page)).filter((t) => t.name === "update_counter");
  expect(tool.inputSchema.required).toEqual(["delta"]);
  expect(await callWebMCPTool(page, "update_counter", { delta: 2 })).toEqual({ value: 2 });
  await expect(page.locator("#counter")).toHaveText("2");
  // the same result a call through Core gets
  const { result } = await callTool(core, sessionId, "update_counter", { delta: "x" });
  expect(await callWebMCPTool(page, "update_counter", { delta: "x" })).toEqual(result);
});
