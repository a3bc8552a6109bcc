// The page of the page benchmarks (bench/page/calls.html) in headless Chromium, on a Core
// of its own on loopback: the page's Python session, and beside it the plain-JS one and two
// bare-Python ones (see the page).
import { chromium } from "playwright";
import { openPage, startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";

/** The page's sessions, the page's own (pedelec-pyodide) first. */
export const VARIANTS = ["python", "js", "bare", "floor"];

/**
 * Provision, start Core on `port` (`--max-pending maxPending`), open the page; resolves to
 * `{ core, browser, page, sessions: { python, js, bare, floor } }`. `close()` stops the browser and Core.
 */
export async function openCallsPage({ port, maxPending = 64 }) {
  execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/bench"], { stdio: "ignore" });
  const core = await startCore({
    app: "bench/page", port, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide",
    args: ["--quiet", "--max-pending", String(maxPending)],
  });
  let browser;
  try {
    browser = await chromium.launch({
      executablePath: "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    const page = await browser.newPage();
    const sessions = { python: (await openPage(page, `${core.url}/calls.html`)).sessionId };
    for (const name of VARIANTS.slice(1)) {  // each sets window.<name>SessionId once welcomed
      sessions[name] = await page.waitForFunction((n) => window[`${n}SessionId`], name).then((h) => h.jsonValue());
    }
    const close = async () => { await browser.close(); await core.stop(); };
    return { core, browser, page, sessions, close };
  } catch (err) {
    await browser?.close();
    await core.stop();
    throw err;
  }
}

export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** `names` starting from the `k`th (wrapping round): each round of a bench its own first. */
export const rotated = (names, k) => names.map((_, i) => names[(i + k) % names.length]);
