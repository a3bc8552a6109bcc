#!/usr/bin/env node
// Page start to ready, side by side in one run (variants interleaved), headless Chromium:
//   pedelec: loader + our wheels via our lock + page block + session connected (pedelec:ready)
//   bare:    loadPyodide() + one document.title read, on the same Core and Pyodide
// Cold: a fresh browser context (empty HTTP cache) per load. Warm: a second load in it.
// Usage: node bench/page-start.mjs [rounds]   (starts and stops its own Core on loopback)
import { chromium } from "playwright";
import { startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";

const rounds = Number(process.argv[2] ?? 5);
const port = 8797;
execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.core.provision", ".cache/bench"], { stdio: "ignore" });
const core = await startCore({ app: "bench/page", port, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"] });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const variants = ["bare", "pedelec"];
const steps = [];
const times = { cold: { bare: [], pedelec: [] }, warm: { bare: [], pedelec: [] } };
async function load(page, name) {
  await page.goto(`${core.url}/${name}.html`);
  await page.waitForFunction(() => window.benchReady !== undefined, null, { timeout: 60_000 });
  return page.evaluate(() => window.benchReady);
}
try {
  for (let r = 0; r < rounds; r += 1) {
    for (const name of r % 2 ? [...variants].reverse() : variants) {
      const context = await browser.newContext();
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
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const cache of ["cold", "warm"]) {
  const bare = median(times[cache].bare);
  const ped = median(times[cache].pedelec);
  console.log(`${cache}: bare loadPyodide ${bare.toFixed(0)} ms, pedelec:ready ${ped.toFixed(0)} ms, ratio ${(ped / bare).toFixed(3)}x (median of ${rounds})`);
}
const step = (k) => median(steps.map((s) => s[k]));
console.log(`pedelec cold, median ms since navigation: loader starts ${step("start").toFixed(0)}, runtime+wheels loaded ${step("runtime").toFixed(0)}, pedelec_pyodide imported ${step("imported").toFixed(0)}, blocks run ${step("blocks").toFixed(0)}, connected ${step("connected").toFixed(0)}`);
