// Shared set-up for the e2e specs: the two Cores of playwright.config.js, and the kit.
import { coreAt } from "../../web/testing.js";
import { APP_PORT, DEMO_PORT, TOKEN } from "../../playwright.config.js";

export const app = coreAt(APP_PORT, TOKEN);
export const demo = coreAt(DEMO_PORT, TOKEN);
export * from "../../web/testing.js";

/** Collect console messages of `page` (type and text). */
export function consoleOf(page) {
  const lines = [];
  page.on("console", (m) => lines.push({ type: m.type(), text: m.text() }));
  return lines;
}
