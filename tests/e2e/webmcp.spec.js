// WebMCP (issue 24): a page's Python tools on document.modelContext, for the browser's own
// agent. Run twice (playwright.config.js): in the project "chromium-webmcp", Chromium with
// WebMCP on (native; calls through Playwright's page.webmcp), and in "chromium", Chromium
// as it ships, where each page gets the MCP-B polyfill first (and one test gets none:
// nothing happens, nothing fails). The pages: tests/e2e/app/webmcp*.html.
import { fileURLToPath } from "node:url";
import { expect, test } from "@playwright/test";
import {
  PYODIDE, SNAPSHOT, app, callTool, demo, callWebMCPTool, consoleOf, freePort, getSession, openPage, runPython,
  startCore,
  waitForState, webmcpImplementation, webmcpTools,
} from "./helpers.js";

const POLYFILL = fileURLToPath(new URL("../../node_modules/@mcp-b/webmcp-polyfill/dist/index.iife.js", import.meta.url));
const PAGE = `${app.url}/webmcp.html`;
const OFFERED = ["add", "broken", "pause", "polite", "remove_note", "stubborn"]; // not `secret`
const ABORTED = "the browser's agent aborted the call";

const native = () => test.info().project.metadata.webmcp === "native";
const calls = (page) => page.evaluate(() => window.calls);
const approvals = (page) => page.evaluate(() => window.approvals.map((event) => event.detail));

/**
 * A call as an agent inside the browser makes it: `executeTool` on document.modelContext,
 * with the input in the implementation's form (native: an object; the polyfill: JSON text),
 * optionally aborted after `abortAfterMs` or before it starts; `nest`: the input is that
 * many objects one inside the other, made in the page (Playwright's own serialization of
 * an argument that deep does not finish). `{ result }` (the result JSON value) or
 * `{ rejected: error name }`.
 */
function execute(page, name, input, { abortAfterMs, preAborted = false, raw = false, nest = 0 } = {}) {
  return page.evaluate(async ({ name, input, abortAfterMs, preAborted, raw, nest }) => {
    for (let i = 0; i < nest; i++) input = { a: input };
    const context = document.modelContext;
    const tool = (await context.getTools()).find((t) => t.name === name);
    const controller = new AbortController();
    if (preAborted) controller.abort();
    if (abortAfterMs !== undefined) setTimeout(() => controller.abort(), abortAfterMs);
    const form = context.__isWebMCPPolyfill && !raw ? JSON.stringify(input) : input;
    try {
      const text = await context.executeTool(tool, form, { signal: controller.signal });
      try {
        return { result: JSON.parse(text) };
      } catch {
        return { result: text };
      }
    } catch (error) {
      return { rejected: error.name, message: error.message };
    }
  }, { name, input, abortAfterMs, preAborted, raw, nest });
}


test.describe("with WebMCP", () => {
  test.beforeEach(async ({ page }) => {
    if (!native()) await page.addInitScript({ path: POLYFILL });
  });

  test("the tools are listed with name, description, schema, title and read-only hint; webmcp=False stays out", async ({ page }) => {
    const { sessionId } = await openPage(page, PAGE);
    expect(await webmcpImplementation(page)).toBe(native() ? "native" : "polyfill");
    expect(await page.evaluate(() => window.pedelec.webmcp)).toBe(true);
    const tools = await webmcpTools(page);
    expect(tools.map((t) => t.name)).toEqual(OFFERED);
    const core = Object.fromEntries((await getSession(app, sessionId)).tools.map((t) => [t.name, t]));
    expect(Object.keys(core).sort()).toEqual([...OFFERED, "secret"].sort()); // Core still has it
    const [add] = tools;
    expect(add).toMatchObject({
      name: "add", title: "Add numbers", description: "Add two integers.",
      inputSchema: core.add.argsSchema, annotations: { readOnlyHint: true },
    });
    const removeNote = tools.find((t) => t.name === "remove_note");
    expect(removeNote.inputSchema).toEqual(core.remove_note.argsSchema);
    expect(removeNote.title || "").toBe("");
    expect(removeNote.annotations?.readOnlyHint ?? false).toBe(false);
    if (native()) { // what Playwright's own listing (an agent's view) says
      const listed = await page.webmcp.tools();
      expect(listed.map((t) => t.name).sort()).toEqual(OFFERED);
      expect(listed.find((t) => t.name === "add")).toMatchObject({ description: "Add two integers.", annotations: { readOnly: true } });
    }
  });

  test("a call gets the result a call through Core gets (errors resolve), and shows in the tool events with its source", async ({ page }) => {
    const { sessionId } = await openPage(page, PAGE);
    for (const [name, args] of [["add", { a: 2, b: 3 }], ["add", { a: "2" }], ["add", {}], ["broken", {}]]) {
      const { result: viaCore } = await callTool(app, sessionId, name, args);
      expect(await callWebMCPTool(page, name, args)).toEqual(viaCore);
    }
    const refused = await callWebMCPTool(page, "add", { a: "2" });
    expect(refused.error).toMatchObject({ code: "INVALID_ARGS", retryable: true });
    const failed = await callWebMCPTool(page, "broken");
    expect(failed.error.code).toBe("TOOL_HANDLER_ERROR");
    expect(failed.error.message).toContain("the notes store is gone");
    const seen = (await calls(page)).map((c) => [c.tool, c.source, c.handledBy]);
    expect(seen.slice(0, 2)).toEqual([["add", "core", "inline"], ["add", "webmcp", "inline"]]);
    expect(seen.filter(([, source]) => source === "webmcp")).toHaveLength(6);
    const webmcpCall = (await calls(page)).find((c) => c.source === "webmcp");
    expect(webmcpCall.toolRequestId).toMatch(/^webmcp-/);
    expect(webmcpCall.turnId).toBeNull();
    const statuses = await page.evaluate(() => window.statuses.filter((s) => s.toolRequestId === window.calls[1].toolRequestId));
    expect(statuses.map((s) => [s.status, s.source])).toEqual([["running", "webmcp"], ["done", "webmcp"]]);
  });

  test("a tool that needs approval asks the page's approver: approved runs, denied is TOOL_DENIED", async ({ page }) => {
    await openPage(page, PAGE);
    const approved = callWebMCPTool(page, "remove_note", { note: "a" });
    await expect.poll(() => approvals(page)).toHaveLength(1);
    expect((await approvals(page))[0]).toMatchObject({ tool: "remove_note", args: { note: "a" }, source: "webmcp" });
    expect(await page.evaluate(() => window.pedelec.session.pending.map((p) => [p.status, p.source]))).toEqual([["awaiting_approval", "webmcp"]]);
    await page.evaluate(() => window.approvals[0].approve());
    expect(await approved).toEqual({ removed: "a" });

    const denied = callWebMCPTool(page, "remove_note", { note: "b" });
    await expect.poll(() => approvals(page)).toHaveLength(2);
    await page.evaluate(() => window.approvals[1].deny("not that one"));
    expect((await denied).error).toMatchObject({ code: "TOOL_DENIED", retryable: false, details: { reason: "not that one" } });
  });

  test("an abort: ctx.cancelled, and one that ignores it is answered TOOL_CANCELLED after the grace period", async ({ page }) => {
    await openPage(page, PAGE);
    // the agent's own promise rejects at once (the browser's doing, in both)
    expect(await execute(page, "polite", { limit_ms: native() ? 30_000 : 500 }, { abortAfterMs: 300 }))
      .toMatchObject({ rejected: "AbortError" });
    if (!native()) {
      // The polyfill gives execute no signal: the abort never reaches the page, the call
      // runs to its end (docs/how-to/webmcp.md).
      await expect.poll(async () => (await calls(page)).map((c) => c.result)).toEqual([{ cancelled: false }]);
      return;
    }
    await expect.poll(async () => (await calls(page)).map((c) => [c.tool, c.result])).toEqual([["polite", { cancelled: true }]]);
    expect(await execute(page, "stubborn", {}, { abortAfterMs: 300 })).toMatchObject({ rejected: "AbortError" });
    await expect.poll(async () => (await calls(page)).length, { timeout: 10_000 }).toBe(2);
    const [, cancelled] = await calls(page);
    expect(cancelled).toMatchObject({ tool: "stubborn", source: "webmcp" });
    expect(cancelled.result.error).toMatchObject({ code: "TOOL_CANCELLED", details: { reason: ABORTED } });
    expect(await page.evaluate(() => window.pedelec.session.pending)).toEqual([]);
  });

  test("an abort before the call starts runs nothing", async ({ page }) => {
    await openPage(page, PAGE);
    expect(await execute(page, "add", { a: 1 }, { preAborted: true })).toMatchObject({ rejected: "AbortError" });
    expect(await callWebMCPTool(page, "add", { a: 2 })).toEqual({ sum: 2 });
    expect((await calls(page)).map((c) => c.args)).toEqual([{ a: 2 }]);
  });

  test("registrations follow the session: dispose unregisters, a tool added again is registered again", async ({ page }) => {
    await openPage(page, PAGE);
    await runPython(page, `
from pedelec_pyodide import define_tool

@define_tool(name="note")
def note_v1(text: str) -> str:
    """Keep a note."""
    return "v1: " + text

dispose_note = session.add_tool(note_v1)`);
    await expect.poll(async () => (await webmcpTools(page)).map((t) => t.name)).toContain("note");
    expect(await callWebMCPTool(page, "note", { text: "x" })).toBe("v1: x");
    await page.evaluate(async () => { window.heldNote = (await document.modelContext.getTools()).find((t) => t.name === "note"); });
    await runPython(page, "dispose_note()");
    await expect.poll(async () => (await webmcpTools(page)).map((t) => t.name)).toEqual(OFFERED);
    await expect(callWebMCPTool(page, "note", { text: "x" })).rejects.toThrow(/no WebMCP tool named "note"|No WebMCP tool named "note"/);
    // an agent holding the old registration cannot call it any more
    const stale = await page.evaluate(async (isNative) => {
      try {
        await document.modelContext.executeTool(window.heldNote, isNative ? { text: "x" } : '{"text": "x"}');
        return "ran";
      } catch (error) {
        return error.name;
      }
    }, native());
    expect(stale).not.toBe("ran");
    await runPython(page, `
@define_tool(name="note", description="Keep a note, the second way.")
def note_v2(text: str) -> str:
    return "v2: " + text

session.add_tool(note_v2)`);
    await expect.poll(async () => (await webmcpTools(page)).find((t) => t.name === "note")?.description).toBe("Keep a note, the second way.");
    expect(await callWebMCPTool(page, "note", { text: "y" })).toBe("v2: y");
  });

  test("a stranger's agent: bad, huge and deep inputs, 100 calls at once", async ({ page }) => {
    await openPage(page, PAGE);
    // not an object: an array (the only non-object both implementations pass on)
    expect((await execute(page, "add", [1, 2])).result.error.code).toBe("INVALID_ARGS");
    const huge = await execute(page, "add", { a: 1, pad: "y".repeat(2 * 1024 * 1024) });
    expect(huge.result.error).toMatchObject({ code: "INVALID_ARGS" });
    expect(huge.result.error.message).toContain("the limit is");
    const tooDeep = await execute(page, "add", {}, { nest: 150 });
    expect(tooDeep.result.error).toMatchObject({ code: "INVALID_ARGS" });
    expect(tooDeep.result.error.message).toContain("nests deeper than 100");
    if (!native()) { // the polyfill's JSON text, as a bridge may send it: a number
      expect((await execute(page, "add", "5", { raw: true })).rejected).toBeTruthy();
    }
    await expect(callWebMCPTool(page, "secret")).rejects.toThrow(/secret/);
    await expect(callWebMCPTool(page, "no_such_tool")).rejects.toThrow(/no_such_tool/);
    const answers = await page.evaluate(async (isNative) => {
      const context = document.modelContext;
      const tools = await context.getTools();
      const run = (name, input) => context.executeTool(tools.find((t) => t.name === name),
        isNative ? input : JSON.stringify(input)).then((text) => JSON.parse(text), (e) => ({ rejected: e.name }));
      const adds = await Promise.all(Array.from({ length: 100 }, (_, i) => run("add", { a: i, b: 1 })));
      const pauses = await Promise.all(Array.from({ length: 100 }, () => run("pause", { ms: 200 })));
      return { adds, pauses };
    }, native());
    expect(answers.adds).toEqual(Array.from({ length: 100 }, (_, i) => ({ sum: i + 1 })));
    const paused = answers.pauses.filter((a) => a.paused === 200).length;
    const refused = answers.pauses.filter((a) => a.error?.code === "TOO_MANY_PENDING").length;
    expect(paused + refused).toBe(100); // each answered, none rejected
    expect(paused).toBeGreaterThanOrEqual(64); // the page runs 64 at once
    await expect.poll(() => page.evaluate(() => window.pedelec.session.pending.length)).toBe(0);
    expect(await callWebMCPTool(page, "add", { a: 1, b: 1 })).toEqual({ sum: 2 });
  });

  test("thousands of calls leave no proxies behind", async ({ page }) => {
    test.setTimeout(180_000);
    await openPage(page, PAGE);
    const counts = () => page.evaluate(() => {
      const m = window.pedelec.pyodide._module;
      window.pedelec.pyodide.runPython("import gc; gc.collect()");
      return { pyproxies: m.pyproxy_alloc_map.size, jsrefs: m._hiwire_num_refs() };
    });
    const run = (n) => page.evaluate(async ({ n, isNative }) => {
      const context = document.modelContext;
      const tools = await context.getTools();
      const form = (input) => (isNative ? input : JSON.stringify(input));
      const call = (name, input, signal) => context.executeTool(tools.find((t) => t.name === name), form(input), { signal })
        .then((text) => JSON.parse(text));
      for (let i = 0; i < n; i++) {
        const [sum, paused, refused] = await Promise.all([
          call("add", { a: i, b: 1 }),
          call("pause", { ms: 0 }, new AbortController().signal),
          call("add", { a: "x" }),
        ]);
        if (sum.sum !== i + 1 || paused.paused !== 0 || refused.error.code !== "INVALID_ARGS") throw new Error(`call ${i}`);
      }
    }, { n, isNative: native() });
    await page.evaluate(() => window.pedelec.pyodide._module.enable_pyproxy_allocation_tracing());
    await run(50); // warm up
    const before = await counts();
    await run(1_000);
    const after = await counts();
    expect(after.pyproxies - before.pyproxies).toBeLessThanOrEqual(2);
    expect(after.jsrefs - before.jsrefs).toBeLessThanOrEqual(2);
  });

  test("with Core stopped, the tools still answer, approvals included", async ({ page }) => {
    const token = "webmcp-token";
    const core = await startCore({
      app: "tests/e2e/app", port: await freePort(), token, pedelec: ".venv/bin/pedelec",
      pyodide: PYODIDE, args: ["--quiet"], timeoutMs: 60_000,
    });
    try {
      const { sessionId } = await openPage(page, `${core.url}/webmcp.html`);
      const { result } = await callTool(core, sessionId, "add", { a: 4, b: 5 });
      expect(await callWebMCPTool(page, "add", { a: 4, b: 5 })).toEqual(result);
      await core.stop();
      await waitForState(page, "connecting");
      expect(await callWebMCPTool(page, "add", { a: 4, b: 5 })).toEqual(result);
      const approved = callWebMCPTool(page, "remove_note", { note: "offline" });
      await expect.poll(() => approvals(page)).toHaveLength(1);
      await page.evaluate(() => window.approvals[0].approve());
      expect(await approved).toEqual({ removed: "offline" });
    } finally {
      await core.stop();
    }
  });

  test("a start whose connection to Core fails still registers the tools", async ({ page }) => {
    await page.goto(`${app.url}/webmcp-no-core.html`);
    const failure = await page.evaluate(async () => {
      while (!window.pedelecReady) await new Promise((r) => setTimeout(r, 50));
      return window.pedelecReady.then(() => "started", (error) => error.message);
    });
    expect(failure).toContain("connecting to Core");
    expect((await webmcpTools(page)).map((t) => t.name)).toEqual(OFFERED);
    expect(await callWebMCPTool(page, "add", { a: 1, b: 2 })).toEqual({ sum: 3 });
    // nobody can listen for approvals on a page whose start failed: denied, not hanging
    const denied = await callWebMCPTool(page, "remove_note", { note: "x" });
    expect(denied.error).toMatchObject({ code: "TOOL_DENIED", details: { reason: "no approver" } });
  });

  test("the demo offers its tools to the browser's agent, and says so", async ({ page }) => {
    await openPage(page, `${demo.url}/`);
    await expect(page.locator("#webmcp-note")).toHaveText(/offered to this browser's own agent too/);
    expect((await webmcpTools(page)).map((t) => t.name)).toContain("update_counter");
    const before = Number(await page.locator("#counter-value").textContent());
    expect(await callWebMCPTool(page, "update_counter", { delta: 2 })).toEqual({ value: before + 2 });
    await expect(page.locator("#counter-value")).toHaveText(String(before + 2));
    const row = page.locator("#log tr[data-tool=update_counter]");
    await expect(row.locator("span.source")).toHaveText("browser's agent");
    await expect(row.locator("span.tier")).toHaveText("inline");
  });

  test("off unless the page asks: no data-webmcp, or data-webmcp=\"off\", registers nothing", async ({ page }) => {
    for (const path of ["/tools.html", "/webmcp-off.html"]) {
      await openPage(page, `${app.url}${path}`);
      expect(await page.evaluate(() => window.pedelec.webmcp)).toBe(false);
      expect(await webmcpTools(page)).toEqual([]);
    }
  });
});

test("a browser without WebMCP: nothing happens and nothing fails", async ({ page }) => {
  test.skip(native(), "this browser has WebMCP");
  const lines = consoleOf(page);
  const { sessionId } = await openPage(page, PAGE);
  expect(await webmcpImplementation(page)).toBeNull();
  expect(await page.evaluate(() => window.pedelec.webmcp)).toBe(false);
  expect((await callTool(app, sessionId, "add", { a: 1 })).result).toEqual({ sum: 1 });
  // a runtime without a memory snapshot answers its files 404 (the documented fallback,
  // docs/how-to/fast-start.md), which the browser logs as errors: not this page's
  const snapshotAbsent = (l) => !SNAPSHOT && /\/pedelec-snapshot\.(json|bin)$/.test(l.url);
  expect(lines.filter((l) => l.type === "error" && !snapshotAbsent(l))).toEqual([]);
  expect(lines.map((l) => l.text)).toContainEqual(expect.stringContaining("no document.modelContext"));
  await expect(webmcpTools(page)).rejects.toThrow(/--enable-features=WebMCP/);
  await openPage(page, `${demo.url}/`);
  await expect(page.locator("#webmcp-note")).toHaveText(/this browser has no WebMCP/);
});
