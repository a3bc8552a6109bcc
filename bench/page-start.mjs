#!/usr/bin/env node
// Page start to ready, side by side in one run (variants interleaved), headless Chromium:
//   bare:         loadPyodide() + one document.title read (the baseline)
//   pedelec:      the loader as pages get it: restored from Core's memory snapshot, our
//                 wheels' files written back, page block run, session connected (pedelec:ready)
//   pedelec-off:  the same page with data-snapshot="off": Pyodide booted, our wheels via our
//                 lock (the path before the snapshot, and the fallback)
//   pyscript:     @pyscript/core from npm on the same Pyodide (config "interpreter"), the same
//                 document.title read in a <script type="py">
// All on one Core on loopback, the same Pyodide files. Cold: a fresh browser context (its
// own empty HTTP cache) for every load of every variant. Warm: a second load in it.
// Two links: loopback as is, and Chromium's network throttled (CDP
// Network.emulateNetworkConditions) to 100 Mbit/s each way with 20 ms of latency.
// The machine is shared and noisy (bare cold varies 2x between loads), so each round's
// variants run back to back, in rotating order, and the figure is the median of the
// per-round ratios to bare, with their range; the load average is printed before and after.
// Usage: node bench/page-start.mjs [rounds]   (starts and stops its own Core on loopback)
import { chromium } from "playwright";
import { startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";

const rounds = Number(process.argv[2] ?? 7);
const port = 8797;
execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/bench"], { stdio: "ignore" });
// The app Core serves: the bench pages, and PyScript's dist at /pyscript/.
const app = mkdtempSync(join(tmpdir(), "pedelec-bench-"));
cpSync("bench/page", app, { recursive: true });
cpSync("node_modules/@pyscript/core/dist", join(app, "pyscript"), { recursive: true });
const core = await startCore({ app, port, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"] });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const variants = ["bare", "pedelec", "pedelec-off", "pyscript"];
const links = {
  loopback: null,
  "100Mbit/20ms": { offline: false, latency: 20, downloadThroughput: 100e6 / 8, uploadThroughput: 100e6 / 8 },
};
const load = () => loadavg().map((x) => x.toFixed(2)).join(" ");
const loadBefore = load();
const steps = {};
const offline = [];
const times = {};
for (const link of Object.keys(links)) {
  for (const cache of ["cold", "warm"]) times[`${link} ${cache}`] = Object.fromEntries(variants.map((v) => [v, []]));
}
async function open(page, name) {
  try {
    await page.goto(`${core.url}/${name}.html`);
    await page.waitForFunction(() => window.benchReady !== undefined, null, { timeout: 120_000 });
    return await page.evaluate(() => window.benchReady);
  } catch (err) {
    throw new Error(`${name}: ${err.message}`, { cause: err });
  }
}
try {
  for (let r = 0; r < rounds; r += 1) {
    for (const [link, conditions] of Object.entries(links)) {
      const order = variants.map((_, i) => variants[(i + r) % variants.length]);
      for (const name of order) {
        const context = await browser.newContext();
        // Requests are logged, not routed: route() would disable the HTTP cache.
        context.on("request", (request) => {
          if (!request.url().startsWith(core.url) && !request.url().startsWith("data:")) offline.push(`${name}: ${request.url()}`);
        });
        const page = await context.newPage();
        if (conditions) {
          const cdp = await context.newCDPSession(page);
          await cdp.send("Network.enable");
          await cdp.send("Network.emulateNetworkConditions", conditions);
        }
        times[`${link} cold`][name].push(await open(page, name));
        if (name.startsWith("pedelec")) {
          const marks = await page.evaluate(() => Object.fromEntries(
            performance.getEntriesByType("mark").filter((m) => m.name.startsWith("pedelec:")).map((m) => [m.name.slice(8), m.startTime])));
          (steps[`${link} ${name}`] ??= []).push(marks);
          if (name === "pedelec" && !(await page.evaluate(() => window.pedelec.snapshot))) throw new Error("pedelec did not start from the snapshot");
        }
        times[`${link} warm`][name].push(await open(page, name));
        await context.close();
      }
    }
  }
} finally {
  await browser.close();
  await core.stop();
  rmSync(app, { recursive: true, force: true });
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`${rounds} rounds; load average (1, 5, 15 min) before ${loadBefore}, after ${load()}`);
for (const [label, byVariant] of Object.entries(times)) {
  const bare = byVariant.bare;
  console.log(`${label}: bare median ${median(bare).toFixed(0)} ms`);
  for (const name of variants.slice(1)) {
    const ratios = byVariant[name].map((t, i) => t / bare[i]);
    console.log(`  ${name.padEnd(11)} / bare ${median(ratios).toFixed(3)}x (per-round ratios ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}; median ${median(byVariant[name]).toFixed(0)} ms)`);
  }
}
for (const [label, list] of Object.entries(steps)) {
  const step = (k) => median(list.map((s) => s[k])).toFixed(0);
  console.log(`${label} cold, median ms since navigation: loader starts ${step("start")}, runtime+wheels ${step("runtime")}, pedelec_pyodide imported ${step("imported")}, blocks run ${step("blocks")}, connected ${step("connected")}`);
}
console.log(offline.length ? `NOT OFFLINE: ${offline.length} requests left loopback, e.g. ${offline[0]}` : "offline: every request went to Core on loopback");
