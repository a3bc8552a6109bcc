// Example for users: test your own page's Python tools with the kit (web/testing.js).
// In your project: copy this, point `coreWebServer({ app: "your/app/dir", port })` in your
// playwright.config.js at your app, and import from "<path to pedelec-pyodide>/web/testing.js".
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, SNAPSHOT, app, callTool, callViaAgent, openPage } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);

test("my page's tool, directly and through the offline agent", async ({ page }) => {
  // a classic <script src=".../pedelec-pyodide.classic.js"> page
  const { sessionId } = await openPage(page, `${app.url}/classic.html`);

  const direct = await callTool(app, sessionId, "get_title", {});
  expect(direct).toMatchObject({ result: "e2e: classic script tag", handledBy: "inline" });

  const reply = await callViaAgent(page, [["get_title", {}]]);
  expect(reply).toContain("e2e: classic script tag");
});
