#!/usr/bin/env node
// Real Chromium demo pages for the fault run (tests/core/faultrun.py drives it):
//   node tests/core/fault_browsers.mjs URL COUNT
// opens COUNT demo pages at URL (HAProxy in front of the Core nodes) in Debian's
// /usr/bin/chromium (never a downloaded browser), a context each, and prints one JSON
// line once every page is ready: {"ready": [sessionId, ...]}. Then each line "state" on
// stdin is answered with one JSON line: per page its session id and state, the counter
// the DOM shows and every update_counter row of the demo's tool-call log as [args.delta,
// result]. The browser is closed on "close", at the end of stdin, or on SIGTERM/SIGINT;
// every wait has a deadline.
import { chromium } from "playwright";
import { createInterface } from "node:readline";
import { waitForReady } from "../../web/testing.js";

const [url, count] = [process.argv[2], Number(process.argv[3])];
const READY_TIMEOUT_MS = 240_000;  // COUNT Pyodide start-ups on a busy 2-core machine
const ARGS = [  // the flags of playwright.config.js
  "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ARGS });
const errors = [];
async function close(code) {
  await browser.close().catch(() => {});
  process.exit(code);
}
for (const signal of ["SIGINT", "SIGTERM"]) process.once(signal, () => close(130));

function state(page) {
  return page.evaluate(() => ({
    sessionId: window.pedelec.session.id,
    state: window.pedelec.session.state,
    counter: Number(document.getElementById("counter-value").dataset.value),
    runs: [...document.querySelectorAll('#log tr[data-tool="update_counter"]')].map((row) => {
      const cells = row.querySelectorAll("td");
      return [JSON.parse(cells[2].textContent).delta, JSON.parse(cells[3].textContent)];
    }),
  }));
}

try {
  const pages = await Promise.all(Array.from({ length: count }, async (_, index) => {
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on("pageerror", (err) => errors.push(`page ${index}: ${err.message}`));
    await page.goto(`${url}/`, { timeout: READY_TIMEOUT_MS });
    await waitForReady(page, { timeout: READY_TIMEOUT_MS });
    return page;
  }));
  const ready = await Promise.all(pages.map((page) => page.evaluate(() => window.pedelec.session.id)));
  console.log(JSON.stringify({ ready }));
  for await (const line of createInterface({ input: process.stdin })) {
    if (line === "state") {
      console.log(JSON.stringify({ pages: await Promise.all(pages.map(state)), errors }));
    } else if (line === "close") {
      break;
    }
  }
  await close(0);
} catch (err) {
  console.log(JSON.stringify({ failed: String(err?.stack ?? err), errors }));
  await close(1);
}
