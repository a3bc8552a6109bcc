// Interactive tools in a real page: the JS approval event (approve, deny, across a
// reload), toolprogress events, and cancelTool.
import { expect, test } from "@playwright/test";
import { app, callTool, openPage, waitForReady } from "./helpers.js";

const URL = `${app.url}/interactive.html`;
const runs = (page, tool) => page.evaluate((t) => Number(localStorage.getItem(`runs:${t}`) ?? 0), tool);
const approvals = (page) => page.evaluate(() => window.approvals.map((event) => event.detail));

test("an approval event approved runs the tool; denied is TOOL_DENIED with the reason", async ({ page }) => {
  const { sessionId } = await openPage(page, URL);
  const approved = callTool(app, sessionId, "remove_note", { note: "a" });
  await expect.poll(() => approvals(page)).toHaveLength(1);
  const [asked] = await approvals(page);
  expect(asked).toMatchObject({ tool: "remove_note", args: { note: "a" } });
  expect(await page.evaluate(() => window.pedelec.session.pending.map((p) => p.status))).toEqual(["awaiting_approval"]);
  expect(await runs(page, "remove_note")).toBe(0);
  expect(await page.evaluate(() => window.approvals[0].approve())).toBe(true);
  expect(await approved).toMatchObject({ result: { removed: "a" } });

  const denied = callTool(app, sessionId, "remove_note", { note: "b" });
  await expect.poll(() => approvals(page)).toHaveLength(2);
  await page.evaluate(() => window.approvals[1].deny("not that one"));
  expect(await page.evaluate(() => window.approvals[1].approve())).toBe(false); // decided already
  const { result } = await denied;
  expect(result.error).toMatchObject({ code: "TOOL_DENIED", retryable: false, details: { reason: "not that one" } });
  expect(await runs(page, "remove_note")).toBe(1);
});

test("a reload while an approval is asked asks again after it, and the tool runs once", async ({ page }) => {
  const { sessionId } = await openPage(page, URL);
  const pending = callTool(app, sessionId, "remove_note", { note: "r" });
  await expect.poll(() => approvals(page)).toHaveLength(1);
  await page.reload();
  const again = await waitForReady(page);
  expect(again.sessionId).toBe(sessionId);
  await expect.poll(() => approvals(page)).toHaveLength(1); // the new page's listener got it
  await page.evaluate(() => window.approvals[0].approve());
  expect(await pending).toMatchObject({ result: { removed: "r" } });
  expect(await runs(page, "remove_note")).toBe(1);
});

test("an approval asked is withdrawn when it is cancelled or the session closes", async ({ page }) => {
  const { sessionId } = await openPage(page, URL);
  await page.evaluate(() => {
    window.withdrawn = [];
    window.pedelec.session.addEventListener("approvalwithdrawn", (event) => window.withdrawn.push(event.detail.toolRequestId));
  });
  const cancelled = callTool(app, sessionId, "remove_note", { note: "c" });
  await expect.poll(() => approvals(page)).toHaveLength(1);
  const [first] = await approvals(page);
  expect(await page.evaluate((id) => window.pedelec.session.cancelTool(id), first.toolRequestId)).toBe(true);
  expect((await cancelled).result.error).toMatchObject({ code: "TOOL_CANCELLED" });
  await expect.poll(() => page.evaluate(() => window.withdrawn)).toEqual([first.toolRequestId]);
  expect(await page.evaluate(() => [window.approvals[0].withdrawn, window.approvals[0].approve()])).toEqual([true, false]);

  const orphan = callTool(app, sessionId, "remove_note", { note: "d" }, { timeoutMs: 3000 });
  await expect.poll(() => approvals(page)).toHaveLength(2);
  const second = (await approvals(page))[1];
  await page.evaluate(() => window.pedelec.session.close());
  await expect.poll(() => page.evaluate(() => window.withdrawn)).toEqual([first.toolRequestId, second.toolRequestId]);
  expect(await page.evaluate(() => [window.approvals[1].withdrawn, window.approvals[1].approve(), window.pedelec.session.state]))
    .toEqual([true, false, "closed"]);
  expect(await page.evaluate(() => window.pedelec.session.pending)).toEqual([]);
  await orphan; // Core answers its caller at its deadline: the page is gone
  expect(await runs(page, "remove_note")).toBe(0);
});

test("with no approval listener on the page, a tool that needs approval is denied at once", async ({ page }) => {
  const { sessionId } = await openPage(page, `${URL}?no-approver`);
  const { result } = await callTool(app, sessionId, "remove_note", { note: "x" });
  expect(result.error).toMatchObject({ code: "TOOL_DENIED", retryable: false, details: { reason: "no approver" } });
  expect(result.error.message).toContain("no approver is registered");
  expect(await runs(page, "remove_note")).toBe(0);
});

test("once its only approval listener is gone ({once: true}), a request is denied at once, not left hanging", async ({ page }) => {
  const { sessionId } = await openPage(page, `${URL}?once`);
  const first = callTool(app, sessionId, "remove_note", { note: "a" });
  await expect.poll(() => approvals(page)).toHaveLength(1);
  await page.evaluate(() => window.approvals[0].approve());
  expect(await first).toMatchObject({ result: { removed: "a" } });
  const { result } = await callTool(app, sessionId, "remove_note", { note: "b" }, { timeoutMs: 15000 });
  expect(result.error).toMatchObject({ code: "TOOL_DENIED", details: { reason: "no approver" } });
  expect(await runs(page, "remove_note")).toBe(1);
});

test("an approval listener that throws, or whose promise rejects, denies at once", async ({ page }) => {
  const errors = [];
  page.on("pageerror", (error) => errors.push(error.message));
  const { sessionId } = await openPage(page, `${URL}?throwing`);
  for (const [note, message] of [["sync", "TypeError: card is undefined"], ["async", "Error: no card template"]]) {
    const { result } = await callTool(app, sessionId, "remove_note", { note }, { timeoutMs: 15000 });
    expect(result.error).toMatchObject({ code: "TOOL_DENIED", retryable: false,
      details: { reason: `the approval listener failed: ${message}` } });
  }
  expect(await runs(page, "remove_note")).toBe(0);
  await expect.poll(() => errors.length).toBeGreaterThanOrEqual(2); // still reported
  expect(await page.evaluate(() => window.pedelec.session.pending)).toEqual([]);
});

test("progress arrives as toolprogress events, the last one before the result", async ({ page }) => {
  const { sessionId } = await openPage(page, URL);
  const response = await callTool(app, sessionId, "count_up", { steps: 12 });
  expect(response.result).toEqual({ counted: 12 });
  const progress = await page.evaluate(() => window.progress);
  expect(progress.length).toBeGreaterThan(0);
  expect(progress.at(-1)).toMatchObject({ tool: "count_up", progress: 12, total: 12, message: "step 12" });
  const values = progress.map((p) => p.progress);
  expect([...values].sort((a, b) => a - b)).toEqual(values);
  expect(await page.evaluate(() => window.statuses)).toEqual(["running", "done"]);
});

test("cancelTool: a handler that ignores it is answered TOOL_CANCELLED after the grace period", async ({ page }) => {
  const { sessionId } = await openPage(page, URL);
  const pending = callTool(app, sessionId, "stubborn", {});
  await expect.poll(() => page.evaluate(() => window.pedelec.session.pending.map((p) => p.status))).toEqual(["running"]);
  const cancelled = await page.evaluate(() => {
    const [{ toolRequestId }] = window.pedelec.session.pending;
    return window.pedelec.session.cancelTool(toolRequestId);
  });
  expect(cancelled).toBe(true);
  const { result } = await pending;
  expect(result.error).toMatchObject({ code: "TOOL_CANCELLED", retryable: false });
  expect(await page.evaluate(() => window.pedelec.session.pending)).toEqual([]);
  expect(await page.evaluate(() => window.pedelec.session.cancelTool("nope"))).toBe(false);
});
