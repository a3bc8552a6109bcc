#!/usr/bin/env node
// The notebook's first seconds: a `pedelec lite` site's Pyodide kernel, from the page's
// navigation to the kernel idle, side by side in one run (variants interleaved), headless
// Chromium, each load in a fresh browser context (its own empty HTTP cache):
//   stock:     the kernel's own start (jupyterlite-pyodide-kernel as it ships, offline:
//              only pyodideUrl local and disablePyPIFallback): Pyodide booted, then
//              micropip, piplite, then ipykernel, comm, pyodide-kernel, jedi, ipython
//              installed one after the other through piplite, then `import pyodide_kernel`
//   preload:   the same, with loadPyodideOptions.packages naming them: loadPyodide loads
//              them from the lock while the runtime boots, the kernel installs none
//   snapshot:  the site as `pedelec lite` builds it: preload, and the runtime restored from
//              the kernel's memory snapshot (IPython, jedi, comm, traitlets, pygments
//              imported) by pedelec-kernel.mjs
// One site is built (.cache/bench-lite/site), the variants are copies of it (hard links)
// that differ in jupyter-lite.json only, served by one Core on loopback. Marks: the kernel's
// worker created, the kernel idle (the notebook's execution indicator: "idle" after
// "unknown"). The figure is the median of the per-round ratios to stock, with their range;
// the machine is shared, so the load average is printed before and after.
// Usage: node bench/lite-start.mjs [rounds]   (PYTHONPATH as for the tests)
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright";
import { startCore } from "../web/testing.js";

const rounds = Number(process.argv[2] ?? 5);
const port = 8798;
const ROOT = ".cache/bench-lite";
const SITE = `${ROOT}/site`;
const APP = `${ROOT}/app`;
const NOTEBOOK = "pedelec-example.ipynb";
const KERNEL = "@jupyterlite/pyodide-kernel-extension:kernel";

execFileSync(".venv/bin/pedelec", ["lite", SITE], { stdio: ["ignore", "ignore", "inherit"] });
rmSync(APP, { recursive: true, force: true });
const built = JSON.parse(readFileSync(`${SITE}/jupyter-lite.json`, "utf8"));
const variants = {
  stock: (s) => { s.pyodideUrl = "./static/pyodide/pyodide.mjs"; delete s.loadPyodideOptions; },
  preload: (s) => { s.pyodideUrl = "./static/pyodide/pyodide.mjs"; },
  snapshot: () => {},  // (not "pedelec": Core's own files are at /pedelec/)
};
execFileSync("mkdir", ["-p", APP]);
for (const [name, edit] of Object.entries(variants)) {
  execFileSync("cp", ["-al", SITE, join(APP, name)]);  // hard links: the same files
  const config = structuredClone(built);
  edit(config["jupyter-config-data"].litePluginSettings[KERNEL]);
  const file = join(APP, name, "jupyter-lite.json");
  rmSync(file);  // a file of its own, not the site's (hard-linked)
  writeFileSync(file, JSON.stringify(config, null, 1));
}
const settings = (name) => JSON.parse(readFileSync(join(APP, name, "jupyter-lite.json"), "utf8"))["jupyter-config-data"].litePluginSettings[KERNEL];
if (!settings("snapshot").pyodideUrl.endsWith("/pedelec-kernel.mjs")) {
  throw new Error("the built site has no kernel snapshot (is node on PATH?): nothing to compare");
}

const core = await startCore({ app: APP, port, pedelec: ".venv/bin/pedelec", pyodide: `${SITE}/static/pyodide`, args: ["--quiet"] });
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const load = () => loadavg().map((x) => x.toFixed(2)).join(" ");
const loadBefore = load();
const names = Object.keys(variants);
const marks = Object.fromEntries(names.map((n) => [n, { idle: [], kernel: [] }]));
const ratios = Object.fromEntries(names.map((n) => [n, { idle: [], kernel: [] }]));

async function open(name) {
  const context = await browser.newContext();
  await context.addInitScript(() => {
    window.benchStatus = [];
    new MutationObserver(() => {
      const status = document.querySelector(".jp-Notebook-ExecutionIndicator")?.dataset.status;
      if (status && window.benchStatus.at(-1)?.[0] !== status) window.benchStatus.push([status, performance.now()]);
    }).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ["data-status"] });
  });
  const page = await context.newPage();
  const warnings = [];
  page.on("console", (m) => { if (m.text().includes("without its memory snapshot")) warnings.push(m.text()); });
  let workerAt = null;
  page.on("worker", () => { workerAt ??= page.evaluate(() => performance.now()); });
  try {
    await page.goto(`${core.url}/${name}/notebooks/index.html?path=${NOTEBOOK}`);
    const idle = await page.waitForFunction(() => {
      const log = window.benchStatus;
      const started = log.findIndex(([s]) => s === "unknown" || s === "starting");
      const ready = started < 0 ? -1 : log.findIndex(([s], i) => i > started && s === "idle");
      return ready >= 0 ? log[ready][1] : null;
    }, null, { timeout: Number(process.env.BENCH_WAIT ?? 300_000), polling: 50 }).then((handle) => handle.jsonValue(), async (err) => {
      throw new Error(`${name}: the kernel was not idle in time; its statuses: ${JSON.stringify(await page.evaluate(() => window.benchStatus))}`, { cause: err });
    });
    if (warnings.length) throw new Error(`${name}: ${warnings[0]}`);
    return { idle, kernel: idle - await workerAt };
  } finally {
    await context.close();
  }
}

try {
  await open("stock");  // warm-up: Chromium's and the OS's own caches
  for (let r = 0; r < rounds; r += 1) {
    const order = names.map((_, i) => names[(i + r) % names.length]);
    const round = {};
    for (const name of order) round[name] = await open(name);
    for (const name of names) {
      for (const mark of ["idle", "kernel"]) {
        marks[name][mark].push(round[name][mark]);
        ratios[name][mark].push(round[name][mark] / round.stock[mark]);
      }
    }
    console.error(`round ${r + 1}: ${names.map((n) => `${n} ${Math.round(round[n].idle)}/${Math.round(round[n].kernel)}`).join(", ")} ms`);
  }
} finally {
  await browser.close();
  await core.stop();
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const range = (xs) => `${Math.min(...xs).toFixed(2)}–${Math.max(...xs).toFixed(2)}`;
console.log(`JupyterLite kernel start, ${rounds} rounds, cold (a fresh context per load), loopback; load average ${loadBefore} -> ${load()}`);
console.log("| variant | navigation → kernel idle, median ms | ratio to stock (range) | kernel worker → idle, median ms | ratio to stock (range) |");
console.log("| --- | --- | --- | --- | --- |");
for (const name of names) {
  const m = marks[name];
  const q = ratios[name];
  console.log(`| ${name} | ${Math.round(median(m.idle))} | ${median(q.idle).toFixed(2)} (${range(q.idle)}) | ${Math.round(median(m.kernel))} | ${median(q.kernel).toFixed(2)} (${range(q.kernel)}) |`);
}
