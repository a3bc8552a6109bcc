// Resume across reload: id + token in sessionStorage, handlers re-registered by the page's
// Python, pending requests re-sent by Core, the sessionStorage ledger preventing a 2nd run.
import { expect, test } from "@playwright/test";
import { app, callTool, getSession, openPage, runPython, waitForReady, waitForState } from "./helpers.js";

const runs = (page, tool) => page.evaluate((t) => Number(localStorage.getItem(`runs:${t}`) ?? 0), tool);

async function reload(page) {
  await page.reload();
  return waitForReady(page);
}

test("a reload keeps the session (id from sessionStorage, resumed by Core)", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  const again = await reload(page);
  expect(again.sessionId).toBe(sessionId);
  const info = await getSession(app, sessionId);
  expect(info.connected).toBe(true);
});

// A side-effecting tool's start and result are both in sessionStorage; a read-only one's
// start is not (run again if cut short, it does no harm): its result is, and the reloaded
// page finds it among the storage's keys.
for (const [tool, gateName, result] of [
  ["write_once", "w1", { written: "w1" }],
  ["read_value", "r0", { read: "r0" }],
]) {
  test(`${tool} finished in the tab, not yet delivered, then reload: result delivered once, handler run once`, async ({ page }) => {
    const { sessionId } = await openPage(page, `${app.url}/resume.html`);
    const pending = callTool(app, sessionId, tool, { gate_name: gateName });
    await expect.poll(() => runs(page, tool)).toBe(1);
    // cut the link to Core (no reconnect), then let the handler finish: the result stays
    // in the ledger (sessionStorage), undelivered
    await runPython(page, `
from pedelec_pyodide.browser import bridge_of
bridge_of(session).stop()
gate("${gateName}").set()`);
    await waitForState(page, "connecting");
    expect(await runs(page, tool)).toBe(1);

    const again = await reload(page);
    expect(again.sessionId).toBe(sessionId);
    expect(await pending).toMatchObject({ result, handledBy: "inline" });
    await waitForState(page, "idle");
    expect(await runs(page, tool)).toBe(1);
  });
}

test("reload while a side-effecting call runs: TOOL_OUTCOME_UNKNOWN, never a second run", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  const pending = callTool(app, sessionId, "write_once", { gate_name: "w2" });
  await expect.poll(() => runs(page, "write_once")).toBe(1);
  await reload(page);
  const { result } = await pending;
  expect(result.error.code).toBe("TOOL_OUTCOME_UNKNOWN");
  expect(result.error.retryable).toBe(false);
  expect(await runs(page, "write_once")).toBe(1);
});

test("reload while a read-only call runs: it runs again after the reload and delivers once", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  const pending = callTool(app, sessionId, "read_value", { gate_name: "r1" });
  await expect.poll(() => runs(page, "read_value")).toBe(1);
  await reload(page);
  await expect.poll(() => runs(page, "read_value")).toBe(2);
  await runPython(page, `gate("r1").set()`);
  expect(await pending).toMatchObject({ result: { read: "r1" }, handledBy: "inline" });
});

test("a dropped connection reconnects with backoff and resumes", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  await runPython(page, `
from pedelec_pyodide.browser import bridge_of
bridge_of(session)._socket.close()`);
  // the close event comes later: until then the state is still "idle"
  await expect.poll(() => runPython(page, "bridge_of(session).connections")).toBe(2);
  await waitForState(page, "idle");
  expect(await page.evaluate(() => window.pedelec.session.id)).toBe(sessionId);
  const pending = callTool(app, sessionId, "read_value", { gate_name: "r2" });
  await waitForState(page, "waiting_tool_result");
  await runPython(page, `gate("r2").set()`);
  expect(await pending).toMatchObject({ result: { read: "r2" } });
});

test("results near 1 MiB fill sessionStorage: every call still answered, none run twice", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  await runPython(page, `
import js
from pedelec_pyodide import define_tool

def big(args):
    name = "runs:big:" + str(args["n"])
    js.localStorage.setItem(name, str(int(js.localStorage.getItem(name) or 0) + 1))
    return {"n": args["n"], "text": "x" * 900_000}

session.add_tool(define_tool(name="big", description="A large result.",
                             args_schema={"type": "object"}, handler=big))`);
  // a dozen 900 KB results: more than the browser's sessionStorage quota holds
  for (let n = 0; n < 12; n++) {
    const response = await callTool(app, sessionId, "big", { n }, { timeoutMs: 10_000 });
    expect(response.result.n).toBe(n);
    expect(response.result.text.length).toBe(900_000);
  }
  // a side effect after that: its "started" mark still finds room
  await runPython(page, `gate("after").set()`);
  const small = await callTool(app, sessionId, "write_once", { gate_name: "after" });
  expect(small.result).toEqual({ written: "after" });
  const reloaded = await reload(page);
  expect(reloaded.sessionId).toBe(sessionId);
  const counts = await page.evaluate(() => Array.from({ length: 12 }, (_, n) => localStorage.getItem(`runs:big:${n}`)));
  expect(counts).toEqual(Array(12).fill("1"));
});

const connections = (page, name) => runPython(page, `from pedelec_pyodide.browser import bridge_of\nbridge_of(${name}).connections`);

test("two sessions in one page keep their own ids, also across a reload", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  const connectSecond = () => runPython(page, `
import pedelec_pyodide
second = await pedelec_pyodide.connect("${app.url}")
second.session_id`);
  const secondId = await connectSecond();
  expect(secondId).not.toBe(sessionId);
  await page.waitForTimeout(1500);  // before the fix they took the session from each other
  expect(await connections(page, "session")).toBe(1);
  expect(await connections(page, "second")).toBe(1);
  const again = await reload(page);
  expect(again.sessionId).toBe(sessionId);
  expect(await connectSecond()).toBe(secondId);
});

test("a duplicated tab takes the session over; the first tab starts a new one, no reconnect storm", async ({ page, context }) => {
  const { sessionId } = await openPage(page, `${app.url}/resume.html`);
  // Chromium's "Duplicate tab" copies sessionStorage: the id and the resume token with it
  const copied = await page.evaluate(() => JSON.stringify(Object.entries(sessionStorage)));
  const duplicate = await context.newPage();
  await duplicate.addInitScript((entries) => {
    if (sessionStorage.getItem("e2e:copied")) return;
    for (const [key, value] of JSON.parse(entries)) sessionStorage.setItem(key, value);
    sessionStorage.setItem("e2e:copied", "1");
  }, copied);
  const taken = await openPage(duplicate, `${app.url}/resume.html`);
  expect(taken.sessionId).toBe(sessionId);
  await expect.poll(() => page.evaluate(() => window.pedelec.session.id)).not.toBe(sessionId);
  await waitForState(page, "idle");
  await page.waitForTimeout(1500);
  expect(await connections(page, "session")).toBe(2);
  expect(await connections(duplicate, "session")).toBe(1);
  const info = await getSession(app, sessionId);
  expect(info.connected).toBe(true);
  await duplicate.close();
});
