import { expect, test } from "@playwright/test";
import { callTool, callViaAgent, coreAt, openPage, runPython } from "pedelec-pyodide/web/testing.js";

const core = coreAt(Number(process.env.APP_PORT ?? 8790), "test-token");

test("update_counter, directly and through the agent", async ({ page }) => {
  const { sessionId } = await openPage(page, "/");  // waits for window.pedelecReady
  // through Core's control API: exactly the result the agent would get
  const { result, handledBy } = await callTool(core, sessionId, "update_counter", { delta: 2 });
  expect(result).toEqual({ value: 2 });
  expect(handledBy).toBe("inline");
  await expect(page.locator("#counter")).toHaveText("2");
  // through the offline agent's /call lines, as a chat would
  expect(await callViaAgent(page, [["update_counter", { delta: 1 }]])).toContain("3");
  // bad args never reach the handler
  const refused = await callTool(core, sessionId, "update_counter", { delta: "x" });
  expect(refused.result.error.code).toBe("INVALID_ARGS");
  expect(refused.handledBy).toBe("none");
  // Python in the page's namespace: values come back; keep Python objects there
  expect(await runPython(page, "sorted(session.tools)")).toEqual(["update_counter"]);
});
