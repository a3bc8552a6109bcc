// Every rule of spec/tool-handlers.md, in the real page: Core -> page -> Core.
import { expect, test } from "@playwright/test";
import { app, callTool, callViaAgent, openPage, runPython, sessionState, waitForState } from "./helpers.js";

let sessionId;
test.beforeEach(async ({ page }) => {
  ({ sessionId } = await openPage(page, `${app.url}/tools.html`));
});

const call = (tool, args = {}) => callTool(app, sessionId, tool, args);

test("the page's blocks ran in order and the session is idle", async ({ page }) => {
  expect(await runPython(page, "','.join(block_order)")).toBe("tools.py,inline");
  expect(await sessionState(page)).toBe("idle");
  expect(sessionId).toMatch(/\S+/);
});

test("priority: named > inline > fallback > TOOL_HANDLER_NOT_FOUND, and disposers", async ({ page }) => {
  expect(await call("echo", { x: 1 })).toMatchObject({ result: { inline: { x: 1 } }, handledBy: "inline" });

  await runPython(page, `off_named = session.on_tool("echo", lambda args: {"named": args})`);
  expect(await call("echo", { x: 2 })).toMatchObject({ result: { named: { x: 2 } }, handledBy: "named" });

  await runPython(page, `off_fallback_1 = session.on_tool(lambda tool, args, ctx: {"fallback": 1, "tool": tool})`);
  expect(await call("echo", {})).toMatchObject({ handledBy: "named" });
  expect(await call("undeclared", { y: 1 })).toMatchObject({ result: { fallback: 1, tool: "undeclared" }, handledBy: "fallback" });

  // a new fallback replaces the old; the old disposer no longer removes anything
  await runPython(page, `off_fallback_2 = session.on_tool(lambda tool: {"fallback": 2})`);
  await runPython(page, "off_fallback_1()");
  expect(await call("undeclared")).toMatchObject({ result: { fallback: 2 }, handledBy: "fallback" });

  // disposing the named handler brings the inline one back; disposing twice is harmless
  await runPython(page, "off_named(); off_named()");
  expect(await call("echo", { x: 3 })).toMatchObject({ result: { inline: { x: 3 } }, handledBy: "inline" });

  // a replaced named handler's disposer does not remove its successor
  await runPython(page, `off_a = session.on_tool("echo", lambda: "a")
off_b = session.on_tool("echo", lambda: "b")
off_a()`);
  expect(await call("echo")).toMatchObject({ result: "b", handledBy: "named" });
  await runPython(page, "off_b()");

  await runPython(page, "off_fallback_2()");
  const missing = await call("undeclared");
  expect(missing.handledBy).toBe("none");
  expect(missing.result.error.code).toBe("TOOL_HANDLER_NOT_FOUND");
});

test("sync and async handlers; waiting_tool_result while one is pending", async ({ page }) => {
  expect(await call("add", { a: 2, b: 3 })).toMatchObject({ result: 5, handledBy: "inline" });

  const pending = call("wait_for", { gate_name: "g1" });
  await waitForState(page, "waiting_tool_result");
  expect(await runPython(page, "runs.get('wait_for', 0)")).toBe(1);
  await runPython(page, "release('g1')");
  expect(await pending).toMatchObject({ result: { opened: "g1" }, handledBy: "inline" });
  await waitForState(page, "idle");
});

test("a DOM node or a JS function is TOOL_RESULT_INVALID", async () => {
  for (const tool of ["dom_node", "js_function"]) {
    const { result } = await call(tool);
    expect(result.error.code).toBe("TOOL_RESULT_INVALID");
    expect(result.error.message).toContain("$");
  }
});

test("a domain error is a normal result, as the handler built it", async () => {
  expect(await call("no_selection")).toEqual(expect.objectContaining({
    handledBy: "inline",
    result: { error: { code: "NO_SELECTION", message: "There is no active editor selection.", details: { documentId: "doc-1" } } },
  }));
});

test("an exception is TOOL_HANDLER_ERROR, and sendText() still resolves", async ({ page }) => {
  const { result } = await call("boom");
  expect(result.error.code).toBe("TOOL_HANDLER_ERROR");
  expect(result.error.message).toBe("RuntimeError: kaboom");

  const calls = [];
  await page.exposeFunction("recordCall", (c) => calls.push(c));
  await page.evaluate(() => window.pedelec.session.addEventListener("toolcall", (e) => window.recordCall(e.detail)));
  const reply = await callViaAgent(page, "/call boom {}");
  expect(typeof reply).toBe("string");
  expect(reply).toContain("TOOL_HANDLER_ERROR");
  expect(calls.map((c) => [c.tool, c.result.error.code])).toEqual([["boom", "TOOL_HANDLER_ERROR"]]);
  expect(await sessionState(page)).toBe("idle");
  expect(await call("add", { a: 1, b: 1 })).toMatchObject({ result: 2 });
});

test("a declared tool with no handler is TOOL_HANDLER_NOT_FOUND", async () => {
  const { result, handledBy } = await call("declared_only");
  expect(handledBy).toBe("none");
  expect(result.error.code).toBe("TOOL_HANDLER_NOT_FOUND");
});

test("disposing during a running call: the call finishes, the handler sees it is inactive", async ({ page }) => {
  await runPython(page, `
async def held(args, ctx):
    seen["active_before"] = ctx.active
    await gate("held").wait()
    seen["active_after"] = ctx.active
    return {"done": True}

off_held = session.on_tool("held", held)`);
  const pending = call("held");
  await waitForState(page, "waiting_tool_result");
  await runPython(page, "off_held()");
  expect(await call("held")).toMatchObject({ handledBy: "none" });
  await runPython(page, "release('held')");
  expect(await pending).toMatchObject({ result: { done: true }, handledBy: "named" });
  expect(await runPython(page, "import json; json.dumps([seen['active_before'], seen['active_after']])")).toBe("[true, false]");
});

test("invalid args are INVALID_ARGS with JSON paths, before the handler runs", async ({ page }) => {
  const { result } = await call("add", { a: "two", b: 3 });
  expect(result.error.code).toBe("INVALID_ARGS");
  expect(result.error.retryable).toBe(true);
  expect(result.error.details.errors[0].path).toBe("$.a");
  const missing = await call("add", { a: 1 });
  expect(missing.result.error.code).toBe("INVALID_ARGS");
  const extra = await call("wait_for", { gate_name: "x", extra: 1 });
  expect(extra.result.error.code).toBe("INVALID_ARGS");
  expect(await runPython(page, "runs.get('wait_for', 0)")).toBe(0);
});
