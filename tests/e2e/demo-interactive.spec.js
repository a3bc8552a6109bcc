// The demo's interactive tools, driven like a user would: summarize_notes' live progress bar
// and Stop button in the tool log, delete_note's approval card (approve, deny, a reload while
// it is shown), and the same progress streamed to a control-API caller.
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, SNAPSHOT, callTool, demo, openPage, waitForReady } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);

const NOTES = 5;  // web/demo/tools.py's DEFAULT_NOTES

async function send(page, text) {
  await page.getByLabel("Message").fill(text);
  await page.getByRole("button", { name: "Send" }).click();
}

const idle = (page) => expect(page.getByLabel("Message")).toBeEnabled();
const noteIds = (page) => page.locator("#notes li").evaluateAll((items) => items.map((li) => li.dataset.id));
const card = (page) => page.getByRole("alertdialog", { name: "Allow delete_note?" });

/** Record every value the log's progress bars take (a bar is removed when its tool ends). */
function recordBars(page) {
  return page.evaluate(() => {
    window.barValues = [];
    new MutationObserver((records) => {
      for (const r of records) if (r.target.localName === "progress") window.barValues.push([r.target.value, r.target.max]);
    }).observe(document.getElementById("log"), { subtree: true, attributes: true, attributeFilter: ["value", "max"] });
  });
}

test("summarize_notes: a live progress bar in the tool log that moves to the end", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await expect(page.locator("#notes li")).toHaveCount(NOTES);
  await recordBars(page);
  await page.getByRole("button", { name: "Summarise the notes" }).click();
  const bar = page.getByRole("progressbar", { name: "Progress of summarize_notes" });
  await expect(bar).toBeVisible();
  await expect(page.getByRole("button", { name: "Stop summarize_notes" })).toBeVisible();
  await expect(page.locator("#log tr.live .progress-text")).toHaveText(/summarised note [1-4] of 5/);
  await idle(page);
  await expect(bar).toHaveCount(0);  // the live row gives way to the finished one
  const row = page.locator("#log tr[data-tool=summarize_notes]");
  await expect(row.locator("td.result")).toContainText('"summaries"');
  await expect(row).not.toHaveClass(/error/);
  const values = await page.evaluate(() => window.barValues.map(([value]) => value));
  expect(values.at(-1)).toBe(NOTES);
  expect(values.length).toBeGreaterThan(1);  // it moved: more than the final value
  expect([...values].sort((a, b) => a - b)).toEqual(values);
  expect(await page.evaluate(() => window.barValues.at(-1)[1])).toBe(NOTES);
  await expect(page.locator(".msg.agent").last()).toContainText("summarize_notes →");
});

test("Stop cancels summarize_notes: TOOL_CANCELLED with the summaries so far", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await send(page, "/call summarize_notes {}");
  await expect(page.locator("#log tr.live .progress-text")).toHaveText(/summarised note 1 of 5/);
  const stop = page.getByRole("button", { name: "Stop summarize_notes" });
  await stop.click();
  await idle(page);
  const result = page.locator("#log tr[data-tool=summarize_notes] td.result");
  await expect(result).toContainText("TOOL_CANCELLED");
  await expect(result).toContainText("stopped by the user after");
  await expect(page.locator("#log tr[data-tool=summarize_notes]")).toHaveClass(/error/);
  await expect(page.locator(".msg.agent").last()).toContainText("error TOOL_CANCELLED");
  await expect(stop).toHaveCount(0);
  expect(await page.evaluate(() => window.pedelec.session.pending)).toEqual([]);
});

test("delete_note asks with a card; approved, it runs once and the note is gone", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await page.getByRole("button", { name: "Delete note n1" }).click();
  await expect(card(page)).toBeVisible();
  await expect(card(page)).toContainText("Deletes note n1: “Pack the rain jacket");
  await expect(card(page)).toContainText('{"id":"n1"}');
  await expect(card(page)).toBeFocused();
  await expect(page.locator("#log tr.live .progress-text")).toHaveText("waiting for your approval");
  expect(await noteIds(page)).toContain("n1");  // nothing ran while asking
  await card(page).getByRole("button", { name: "Approve" }).click();
  await idle(page);
  await expect(card(page)).toHaveCount(0);
  await expect(page.locator("#log tr[data-tool=delete_note]")).toHaveCount(1);
  await expect(page.locator("#log tr[data-tool=delete_note] td.result")).toHaveText(`{"deleted":"n1","left":${NOTES - 1}}`);
  await expect(page.locator("#notes li")).toHaveCount(NOTES - 1);
  expect(await noteIds(page)).not.toContain("n1");
});

test("delete_note denied: TOOL_DENIED in the log and the chat, and the note stays", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await send(page, '/call delete_note {"id": "n3"}');
  await card(page).getByRole("button", { name: "Deny" }).click();
  await idle(page);
  await expect(card(page)).toHaveCount(0);
  const result = page.locator("#log tr[data-tool=delete_note] td.result");
  await expect(result).toContainText("TOOL_DENIED");
  await expect(result).toContainText("the user said no");
  await expect(page.locator(".msg.agent").last()).toContainText("error TOOL_DENIED");
  await expect(page.locator("#notes li")).toHaveCount(NOTES);
  expect(await noteIds(page)).toContain("n3");
});

test("a reload while the approval card is shown asks again after it; approved, the tool runs once", async ({ page }) => {
  const { sessionId } = await openPage(page, `${demo.url}/`);
  const call = callTool(demo, sessionId, "delete_note", { id: "n2" });
  await expect(card(page)).toBeVisible();
  await page.reload();
  expect((await waitForReady(page)).sessionId).toBe(sessionId);
  await expect(card(page)).toHaveCount(1);  // asked again, once
  expect(await noteIds(page)).toContain("n2");
  await card(page).getByRole("button", { name: "Approve" }).click();
  expect((await call).result).toEqual({ deleted: "n2", left: NOTES - 1 });
  await expect(page.locator("#notes li")).toHaveCount(NOTES - 1);
  // ran once: a second run would have found no n2 and answered NOTE_NOT_FOUND
  await expect(page.locator("#log tr[data-tool=delete_note]")).toHaveCount(1);
  await expect(page.locator("#log tr[data-tool=delete_note] td.result")).toHaveText(`{"deleted":"n2","left":${NOTES - 1}}`);
  await expect(card(page)).toHaveCount(0);
});

test("the same from the chat: the agent's delete_note is asked again after a reload and runs once", async ({ page }) => {
  const { sessionId } = await openPage(page, `${demo.url}/`);
  await page.getByRole("button", { name: "Delete note n1" }).click();  // in words: Delete note "n1"
  await expect(card(page)).toBeVisible();
  await page.reload();
  expect((await waitForReady(page)).sessionId).toBe(sessionId);
  await expect(card(page)).toHaveCount(1);
  await card(page).getByRole("button", { name: "Approve" }).click();
  await expect(page.locator("#log tr[data-tool=delete_note] td.result")).toHaveText(`{"deleted":"n1","left":${NOTES - 1}}`);
  await expect(page.locator("#notes li")).toHaveCount(NOTES - 1);
  await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");  // the turn ended
  await expect(page.locator("#log tr[data-tool=delete_note]")).toHaveCount(1);
});

test("a control-API caller asking for text/event-stream gets summarize_notes' progress from the page", async ({ page }) => {
  const { sessionId } = await openPage(page, `${demo.url}/`);
  const response = await fetch(`${demo.url}/pedelec/v1/sessions/${encodeURIComponent(sessionId)}/tool-calls`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${demo.token}`, "content-type": "application/json", accept: "text/event-stream",
    },
    body: JSON.stringify({ tool: "summarize_notes", args: {}, timeoutMs: 30_000 }),
  });
  expect(response.status).toBe(200);
  expect(response.headers.get("content-type")).toMatch(/^text\/event-stream/);
  const events = (await response.text()).split(/\r?\n\r?\n/).filter((block) => block.trim()).map((block) => {
    const fields = Object.fromEntries(block.split(/\r?\n/).map((line) => {
      const at = line.indexOf(":");
      return [line.slice(0, at), line.slice(at + 1).trimStart()];
    }));
    return { event: fields.event, data: JSON.parse(fields.data) };
  });
  const progress = events.filter((e) => e.event === "progress").map((e) => e.data);
  expect(progress.length).toBeGreaterThan(1);
  expect(progress.at(-1)).toEqual({ progress: NOTES, total: NOTES, message: `summarised note ${NOTES} of ${NOTES}` });
  const values = progress.map((p) => p.progress);
  expect([...values].sort((a, b) => a - b)).toEqual(values);
  expect(events.at(-1).event).toBe("result");
  expect(events.filter((e) => e.event === "result")).toHaveLength(1);
  const { data } = events.at(-1);
  expect(data.handledBy).not.toBe("none");  // its handler ran
  expect(data.result.summaries).toHaveLength(NOTES);
});

test("the delete suggestion names a note that is there, and goes when none is", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  const suggestion = page.locator("#suggest-delete");
  await expect(suggestion).toHaveText("Delete note n1");
  await suggestion.click();
  await card(page).getByRole("button", { name: "Approve" }).click();
  await idle(page);
  expect(await noteIds(page)).not.toContain("n1");
  await expect(suggestion).toHaveText("Delete note n2");  // not n1, which is gone
  await expect(suggestion).toHaveAttribute("data-text", 'Delete note "n2"');
  // no note left (stored by the page's Python, rendered on the next tool call)
  await page.evaluate(() => window.pedelec.runPython("store_notes([])"));
  await send(page, "/call list_notes {}");
  await idle(page);
  await expect(page.locator("#notes li")).toHaveCount(0);
  await expect(suggestion).toBeHidden();
});

test("while a call awaits approval the pill says so, and the log counts every row it shows", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  const pill = page.locator("#status-text");
  const count = page.locator("#log-count");
  const rows = page.locator("#log tr:not(.empty)");
  await page.getByRole("button", { name: "Delete note n1" }).click();
  await expect(card(page)).toBeVisible();
  await expect(pill).toHaveText("Waiting for your approval");  // not "Running a tool…"
  await expect(count).toHaveText("1 in progress");
  await expect(rows).toHaveCount(1);
  await expect(page.locator("#log tr.live progress")).toBeHidden();  // nothing is worked on
  await card(page).getByRole("button", { name: "Approve" }).click();
  await idle(page);
  await expect(pill).toHaveText("Ready");
  await expect(count).toHaveText("1 call");
  await page.getByRole("button", { name: "Summarise the notes" }).click();
  await expect(page.locator("#log tr.live progress")).toBeVisible();
  await expect(pill).toHaveText("Running a tool…");
  await expect(count).toHaveText("1 call, 1 in progress");
  await expect(rows).toHaveCount(2);
  await idle(page);
  await expect(count).toHaveText("2 calls");
  await expect(rows).toHaveCount(2);
});

test("a long message being typed, or an approval card, leaves the layout where it is", async ({ page }) => {
  await page.setViewportSize({ width: 1280, height: 900 });
  await openPage(page, `${demo.url}/`);
  const boxes = () => Promise.all([".editor-card", ".chat-card", ".log-card", "#chat-send"]
    .map((selector) => page.locator(selector).boundingBox()));
  const before = await boxes();
  const input = page.getByLabel("Message");
  await input.fill(Array.from({ length: 30 }, (_, i) => `line ${i + 1}`).join("\n"));
  await input.dispatchEvent("input");  // the page grows the box to its text, up to its limit
  expect((await input.boundingBox()).height).toBeGreaterThan(80);
  const [editor, chat, logCard] = await boxes();
  expect([editor, chat, logCard]).toEqual(before.slice(0, 3));
  await input.fill("");
  await input.dispatchEvent("input");
  expect(await boxes()).toEqual(before);
  await page.getByRole("button", { name: "Delete note n1" }).click();
  await expect(card(page)).toBeVisible();
  // the log below has a row more (the call waiting); the cards above have not moved
  expect((await boxes()).slice(0, 2)).toEqual(before.slice(0, 2));
  await expect(card(page).getByRole("button", { name: "Approve" })).toBeInViewport({ ratio: 1 });
});
