#!/usr/bin/env node
// Page start to ready, side by side in one run (variants interleaved), headless Chromium:
//   bare:     loadPyodide() + one document.title read (the baseline)
//   pedelec:  loader + our wheel via our lock + page block + session connected (pedelec:ready)
//   pyscript: @pyscript/core from npm on the same Pyodide (config "interpreter"), the same
//             document.title read in a <script type="py">
// All on one Core on loopback, the same Pyodide files. Cold: a fresh browser context (its
// own empty HTTP cache) for every load of every variant. Warm: a second load in it.
// The machine is shared and noisy (bare cold varies 2x between loads), so each round's
// variants run back to back, in rotating order, and the figure is the median of the
// per-round ratios to bare, with their range.
// Usage: node bench/page-start.mjs [rounds]   (starts and stops its own Core on loopback)
import { chromium } from "playwright";
import { startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const rounds = Number(process.argv[2] ?? 7);
const port = 8797;
execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.core.provision", ".cache/bench"], { stdio: "ignore" });
// The app Core serves: the bench pages, and PyScript's dist at /pyscript/.
const app = mkdtempSync(join(tmpdir(), "pedelec-bench-"));
cpSync("bench/page", app, { recursive: true });
cpSync("node_modules/@pyscript/core/dist", join(app, "pyscript"), { recursive: true });
const core = await startCore({ app, port, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"] });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const variants = ["bare", "pedelec", "pyscript"];
const steps = [];
const offline = [];
const times = Object.fromEntries(["cold", "warm"].map((c) => [c, Object.fromEntries(variants.map((v) => [v, []]))]));
async function load(page, name) {
  await page.goto(`${core.url}/${name}.html`);
  await page.waitForFunction(() => window.benchReady !== undefined, null, { timeout: 60_000 });
  return page.evaluate(() => window.benchReady);
}
try {
  for (let r = 0; r < rounds; r += 1) {
    const order = variants.map((_, i) => variants[(i + r) % variants.length]);
    for (const name of order) {
      const context = await browser.newContext();
      // Requests are logged, not routed: route() would disable the HTTP cache.
      context.on("request", (request) => {
        if (!request.url().startsWith(core.url) && !request.url().startsWith("data:")) offline.push(`${name}: ${request.url()}`);
      });
      const page = await context.newPage();
      times.cold[name].push(await load(page, name));
      if (name === "pedelec") {
        steps.push(await page.evaluate(() => Object.fromEntries(
          performance.getEntriesByType("mark").filter((m) => m.name.startsWith("pedelec:")).map((m) => [m.name.slice(8), m.startTime]))));
      }
      times.warm[name].push(await load(page, name));
      await context.close();
    }
  }
} finally {
  await browser.close();
  await core.stop();
  rmSync(app, { recursive: true, force: true });
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const cache of ["cold", "warm"]) {
  const bare = times[cache].bare;
  for (const name of variants.slice(1)) {
    const ratios = times[cache][name].map((t, i) => t / bare[i]);
    console.log(`${cache}: ${name} / bare ${median(ratios).toFixed(3)}x (per-round ratios ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}; `
      + `medians ${median(times[cache][name]).toFixed(0)} ms vs ${median(bare).toFixed(0)} ms; ${rounds} rounds)`);
  }
}
const step = (k) => median(steps.map((s) => s[k]));
console.log(`pedelec cold, median ms since navigation: loader starts ${step("start").toFixed(0)}, runtime+wheels loaded ${step("runtime").toFixed(0)}, pedelec_pyodide imported ${step("imported").toFixed(0)}, blocks run ${step("blocks").toFixed(0)}, connected ${step("connected").toFixed(0)}`);
console.log(offline.length ? `NOT OFFLINE: ${offline.length} requests left loopback, e.g. ${offline[0]}` : "offline: every request went to Core on loopback");
