import { expect, test } from "@playwright/test";

test("first attempt", async ({ page }, info) => {
  await page.setContent("<p>a page</p>");
  const mode = process.env.MODE;
  if (mode === "fails" || (info.retry === 0 && mode === "fails-once")) expect("an assertion").toBe("failing");
  if (info.retry === 0 && mode === "crashes-once") {
    const devtools = await page.context().newCDPSession(page);
    devtools.send("Page.crash").catch(() => {}); // (answered only by the crash)
    await page.evaluate(() => new Promise((resolve) => setTimeout(resolve, 10_000)));
  }
});
