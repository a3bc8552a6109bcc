// Shared set-up for the e2e specs: the two Cores of playwright.config.js, and the kit.
import {
  callTool as kitCallTool, coreAt, openPage as kitOpenPage, waitForReady as kitWaitForReady,
} from "../../web/testing.js";
import { createServer } from "node:net";
import { APP_PORT, DEMO_PORT, PYODIDE, SNAPSHOT, TOKEN } from "../../playwright.config.js";

/** Whether this run's pages start from Core's memory snapshot (PEDELEC_E2E_SNAPSHOT), and
 * the runtime directory (with or without one) a spec's own Core serves. */
export { PYODIDE, SNAPSHOT };
/** Why a spec runs only in the pass with the snapshot: what it tests (the demo's UI, an
 * agent, an MCP client, the tutorial's steps) happens once its pages have started, and
 * the other specs start pages both ways. */
export const ONCE_STARTED = "tests what follows a page's start: run in the pass with the snapshot";

export const app = coreAt(APP_PORT, TOKEN);
export const demo = coreAt(DEMO_PORT, TOKEN);
export * from "../../web/testing.js";

// This suite's test timeout is 60 s (playwright.config.js) and its workers share a small
// machine: a page start may take longer than the kit's default, still well inside the test.
const PAGE_START_MS = 45_000;
export const openPage = (page, url, options = {}) => kitOpenPage(page, url, { timeout: PAGE_START_MS, ...options });
export const waitForReady = (page, options = {}) => kitWaitForReady(page, { timeout: PAGE_START_MS, ...options });
// Likewise a tool call's deadline: a call that spans a page's reload waits for the page to
// start again, which here may take longer than the kit's default deadline.
const TOOL_CALL_MS = 40_000;
export const callTool = (core, sessionId, tool, args = {}, options = {}) =>
  kitCallTool(core, sessionId, tool, args, { timeoutMs: TOOL_CALL_MS, ...options });

/** Collect console messages of `page` (type and text). */
export function consoleOf(page) {
  const lines = [];
  page.on("console", (m) => lines.push({ type: m.type(), text: m.text(), url: m.location().url }));
  return lines;
}

/** A free loopback port, for a Core (or an agent) a spec starts and stops itself. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}
