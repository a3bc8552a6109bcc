// Security in the page (issue 7, item 5). demo.spec.js already checks a successful result
// carrying markup (the page title) is shown as text; these add markup arriving through an
// error result (INVALID_ARGS quoting the argument), a tool's result read from the page's
// own editor, and the chat (the user's message and the agent's reply): shown literally,
// never parsed, never run.
import { expect, test } from "@playwright/test";
import { demo, openPage } from "./helpers.js";

const MARKUP = "<img src=x onerror=window.__pwned=1>";

async function ask(page, text) {
  await page.getByLabel("Message").fill(text);
  await page.getByRole("button", { name: "Send" }).click();
  await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");
  await expect(page.getByLabel("Message")).toBeEnabled();
}

async function expectInert(page) {
  // A canary <img src=x> made now: once its load has failed, an <img src=x> made from the
  // markup before it has failed too (and run its onerror), however slow the machine.
  await page.evaluate(() => new Promise((resolve) => {
    const canary = new Image();
    canary.onerror = resolve;
    canary.src = "x";
  }));
  expect(await page.evaluate(() => window.__pwned)).toBeUndefined();
  expect(await page.locator("#log img, .messages img").count()).toBe(0);
}

test("markup in an error result, a tool result and the chat is shown as text", async ({ page }) => {
  await openPage(page, `${demo.url}/`);
  await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");

  // an error result quoting the argument
  await ask(page, `/call update_counter ${JSON.stringify({ delta: MARKUP })}`);
  const error = page.locator("#log tr[data-tool=update_counter] td.result");
  await expect(error).toContainText("INVALID_ARGS");
  await expect(error).toContainText(MARKUP);
  await expectInert(page);

  // a tool's result carrying markup the page itself holds
  await page.locator("#editor").evaluate((el, markup) => {
    el.value = markup; el.focus(); el.setSelectionRange(0, markup.length);
  }, MARKUP);
  await ask(page, "/call get_selection {}");
  await expect(page.locator("#log tr[data-tool=get_selection] td.result")).toContainText(MARKUP);
  await expectInert(page);

  // the chat: the user's text and whatever the agent says back
  await ask(page, MARKUP);
  await expect(page.locator(".messages").getByText(MARKUP).first()).toBeVisible();
  await expectInert(page);
});
