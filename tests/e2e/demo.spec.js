// The demo app (`pedelec demo`), driven like a user would: chat with the offline agent.
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, SNAPSHOT, demo, openPage } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);

async function ask(page, text) {
  await page.getByLabel("Message").fill(text);
  await page.getByRole("button", { name: "Send" }).click();
  await expect(page.getByLabel("Message")).toBeEnabled();
}

test("the conversation with the offline agent runs the page's Python tools", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");

  await ask(page, '/call update_counter {"delta": 3}');
  await expect(page.locator("#counter-value")).toHaveText("3");
  const row = page.locator("#log tr[data-tool=update_counter]");
  await expect(row.locator("td.result")).toHaveText('{"value":3}');
  await expect(row.locator("span.tier")).toHaveText("inline");
  await expect(page.locator(".msg.agent").last()).toContainText("3");

  // nothing selected: the domain error, shown in the log
  await page.locator("#editor").evaluate((el) => el.setSelectionRange(0, 0));
  await ask(page, "/call get_selection {}");
  await expect(page.locator("#log tr[data-tool=get_selection] td.result")).toContainText("NO_SELECTION");

  // a selection: its text
  await page.locator("#editor").evaluate((el) => { el.focus(); el.setSelectionRange(5, 8); });
  await page.getByRole("button", { name: "Read my selection" }).click();
  await expect(page.locator("#log tr[data-tool=get_selection]").first().locator("td.result")).toContainText('"text":"the"');

  // async save, then the broken tool
  await ask(page, "/call save_document {}");
  await expect(page.locator("#log tr[data-tool=save_document] td.result")).toContainText('"savedAt"');
  await expect(page.locator("#save-state")).toContainText("Saved");
  await ask(page, "/call word_stats {}");
  await expect(page.locator("#log tr[data-tool=word_stats] td.result")).toContainText("TOOL_HANDLER_ERROR");
  await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");

  // several calls in one message, in order
  await ask(page, '/call update_counter {"delta": -1}\n/call get_current_page {}');
  await expect(page.locator("#counter-value")).toHaveText("2");
  await expect(page.locator("#log tr").first()).toHaveAttribute("data-tool", "get_current_page");
});

test("results are rendered as text, never as HTML", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await page.evaluate(() => { document.title = '<img src=x id=injected onerror="window.pwned=1"><b>bold</b>'; });
  await ask(page, "/call get_current_page {}");
  const cell = page.locator("#log tr[data-tool=get_current_page] td.result");
  await expect(cell).toContainText("<img src=x id=injected");
  await expect(cell).toContainText("<b>bold</b>");
  expect(await page.locator("#injected").count()).toBe(0);
  expect(await page.evaluate(() => window.pwned)).toBeUndefined();
  await expect(page.locator(".msg.agent").last()).not.toHaveText("");
  expect(await page.locator(".messages b").count()).toBe(0);
});

test("streamed deltas appear in the chat before the turn ends", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await page.evaluate(() => {
    window.deltas = [];
    window.pedelec.session.addEventListener("delta", (e) => window.deltas.push(e.detail.text));
  });
  await ask(page, "/call get_current_page {}");
  const deltas = await page.evaluate(() => window.deltas);
  expect(deltas.length).toBeGreaterThan(0);
  await expect(page.locator(".msg.agent").last()).toContainText(deltas.join("").trim().slice(0, 20));
});

test("a delta the counter cannot hold exactly is refused before any handler runs", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await ask(page, '/call update_counter {"delta": 99999999999999999999999}');
  const row = page.locator("#log tr[data-tool=update_counter]");
  await expect(row.locator("td.result")).toContainText("INVALID_ARGS");
  await expect(row.locator("span.tier")).toHaveText("none");  // no handler ran
  await expect(page.locator("#counter-value")).toHaveText("0");
  await ask(page, '/call update_counter {"delta": 9007199254740991}');
  await expect(page.locator("#counter-value")).toHaveText("9007199254740991");
  await ask(page, '/call update_counter {"delta": 1}');
  await expect(row.first().locator("td.result")).toContainText("COUNTER_OUT_OF_RANGE");
  await expect(page.locator("#counter-value")).toHaveText("9007199254740991");
});

test("a message too large for Core: a plain error, and the bubble shows only its start", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  const huge = "word ".repeat(320_000);  // 1.6 MB, over Core's 1 MiB frame limit
  await page.getByLabel("Message").evaluate((el, text) => { el.value = text; }, huge);
  await page.getByRole("button", { name: "Send" }).click();
  await expect(page.getByLabel("Message")).toBeEnabled();
  const failed = page.locator(".msg.agent.failed").last();
  await expect(failed).toContainText("too large to send");
  await expect(failed).not.toContainText("pedelec_pyodide");
  await expect(failed).not.toContainText("TurnError");
  const bubble = page.locator(".msg.user").last();
  await expect(bubble.locator(".clipped")).toContainText("1,600,000 characters");
  expect((await bubble.textContent()).length).toBeLessThan(5_000);
  // sendText's rejection carries the code for pages that want it
  const error = await page.evaluate((t) => window.pedelec.session.sendText(t).then(
    () => null, (e) => ({ name: e.name, code: e.code, status: e.status, message: e.message })), huge);
  expect(error).toMatchObject({ name: "TurnError", code: "FRAME_TOO_LARGE", status: "failed" });
  expect(error.message).toMatch(/^turn failed: FRAME_TOO_LARGE: frame is \d+ bytes/);
  // and the session goes on
  await ask(page, "/call get_current_page {}");
  await expect(page.locator(".msg.agent").last()).not.toHaveClass(/failed/);
});
