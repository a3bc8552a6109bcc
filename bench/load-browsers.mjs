#!/usr/bin/env node
// Load with real browsers: N Chromium pages of the demo at once (one browser, a context
// each), tool calls to all of them through Core's control API for S seconds.
//
// Core is `pedelec demo` on a free loopback port (fixed admin token, the runtime the e2e
// setup provisions into .cache/e2e/), the browser Debian's /usr/bin/chromium (never
// downloaded); both are stopped at the end, also on failure or Ctrl-C. Pages start in
// batches (20 Pyodide start-ups at once would starve a small machine); each must reach
// `pedelec:ready`. Then `--per-page` callers per page keep calls going (3 of 4
// update_counter with a random delta, 1 of 4 get_current_page), every answer checked.
//
// Reported: throughput, p50/p99/max latency, errors (non-200, error result, wrong
// answer, page errors: target 0), Core's RSS and the browser's memory (PSS of all its
// processes) sampled every `--sample` s. At the end each page's counter in the DOM must
// equal the sum of the deltas sent to it, and its log of tool calls must hold exactly one
// row per call sent (nothing lost, nothing run twice). Exit status 1 otherwise.
//
// Usage: node bench/load-browsers.mjs [--pages 20] [--seconds 60] [--per-page 2]
//                                     [--batch 4] [--sample 5] [--seed 1]
import { chromium } from "playwright";
import { execFileSync, spawn } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import http from "node:http";
import { parseArgs } from "node:util";
import { waitForReady } from "../web/testing.js";

const { values: opts } = parseArgs({
  options: {
    pages: { type: "string", default: "20" },
    seconds: { type: "string", default: "60" },
    "per-page": { type: "string", default: "2" },
    batch: { type: "string", default: "4" },
    sample: { type: "string", default: "5" },
    seed: { type: "string", default: "1" },
  },
});
const PAGES = Number(opts.pages);
const SECONDS = Number(opts.seconds);
const PER_PAGE = Number(opts["per-page"]);
const BATCH = Number(opts.batch);
const SAMPLE_MS = Number(opts.sample) * 1000;
const TOKEN = "bench-load-browsers";
const PYODIDE = ".cache/e2e/pyodide";
const CHROMIUM_ARGS = [
  "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

/** A small seeded PRNG (mulberry32): the run's choices repeat with its seed. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function statusField(pid, field) {
  const line = readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith(`${field}:`));
  return Number(line.split(/\s+/)[1]);
}

/** PSS (KiB) of every process below ours running `exe` (shared pages counted once). */
function pssBelow(exe) {
  const parent = new Map();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // the process ended meanwhile
    }
  }
  const below = (pid) => {
    for (let p = parent.get(pid); p; p = parent.get(p)) if (p === process.pid) return true;
    return false;
  };
  let kib = 0;
  let count = 0;
  for (const pid of parent.keys()) {
    if (!below(pid)) continue;
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, "utf8").startsWith(exe)) continue;
      const pss = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8").match(/^Pss:\s+(\d+)/m);
      kib += Number(pss[1]);
      count += 1;
    } catch {
      // the process ended meanwhile
    }
  }
  return { kib, count };
}

/** `pedelec demo` on a free loopback port; resolves to `{ url, child }` once it listens. */
function startDemo() {
  const child = spawn(".venv/bin/pedelec", ["demo", "--host", "127.0.0.1", "--port", "0", "--pyodide", PYODIDE, "--quiet"], {
    env: { ...process.env, PEDELEC_ADMIN_TOKEN: TOKEN },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(Object.assign(new Error(`Core did not start:\n${output}`), { child })), 120_000);
    child.stderr.on("data", (chunk) => { output += chunk; });
    child.stdout.on("data", (chunk) => {
      output += chunk;
      const url = output.match(/^pedelec demo: (http:\/\/127\.0\.0\.1:\d+)\//m);
      if (url) {
        clearTimeout(timer);
        resolve({ url: url[1], child });
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(Object.assign(new Error(`pedelec demo exited (${code}):\n${output}`), { child }));
    });
  });
}

async function stopCore(child) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(timer);
}

/** POST `body` as JSON with the admin token; resolves to `{ status, body }`. */
function post(agent, url, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const request = http.request(url, {
      method: "POST",
      agent,
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json", "content-length": Buffer.byteLength(data) },
    }, (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk) => { text += chunk; });
      response.on("end", () => {
        try {
          resolve({ status: response.statusCode, body: JSON.parse(text) });
        } catch (err) {
          reject(err);
        }
      });
      response.on("error", reject);
    });
    request.on("error", reject);
    request.end(data);
  });
}

const pct = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))];
const mib = (kib) => (kib / 1024).toFixed(1);

let core;
let browser;
async function cleanUp() {
  await browser?.close().catch(() => {});
  await stopCore(core?.child);
}
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => cleanUp().finally(() => process.exit(130)));
}

let failed = false;
try {
  execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/e2e"], { stdio: "ignore" });
  try {
    core = await startDemo();
  } catch (err) {
    core = { child: err.child };
    throw err;
  }
  const corePid = core.child.pid;
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: CHROMIUM_ARGS });

  const errors = [];
  const pages = [];
  const opened = performance.now();
  for (let first = 0; first < PAGES; first += BATCH) {
    const batch = await Promise.all(Array.from({ length: Math.min(BATCH, PAGES - first) }, async (_, i) => {
      const index = first + i;
      const context = await browser.newContext();
      const page = await context.newPage();
      page.on("pageerror", (err) => errors.push(`page ${index}: ${err.message}`));
      await page.goto(`${core.url}/`);
      const { sessionId } = await waitForReady(page, { timeout: 180_000 });
      return { index, page, sessionId, sum: 0, calls: 0, updates: 0, latencies: [] };
    }));
    pages.push(...batch);
  }
  const ids = await Promise.all(pages.map((p) => p.page.evaluate(() => window.pedelec.session.id)));
  if (ids.some((id, i) => id !== pages[i].sessionId) || new Set(ids).size !== PAGES) {
    throw new Error(`session ids: ${ids.join(", ")}`);
  }
  const browserAtStart = pssBelow("/usr/lib/chromium/chromium");
  console.log(`${PAGES} pages ready in ${((performance.now() - opened) / 1000).toFixed(1)} s (batches of ${BATCH}); `
    + `Core RSS ${mib(statusField(corePid, "VmRSS"))} MiB; browser PSS ${mib(browserAtStart.kib)} MiB in ${browserAtStart.count} processes`);

  const samples = [];
  const started = performance.now();
  const sample = () => samples.push({
    t: (performance.now() - started) / 1000,
    core: statusField(corePid, "VmRSS"),
    browser: pssBelow("/usr/lib/chromium/chromium").kib,
  });
  sample();
  const sampler = setInterval(sample, SAMPLE_MS);
  const deadline = started + SECONDS * 1000;
  const rng = prng(Number(opts.seed));

  async function caller(target, random) {
    const endpoint = `${core.url}/pedelec/v1/sessions/${encodeURIComponent(target.sessionId)}/tool-calls`;
    // One keep-alive connection per caller, never idle: a shared pool leaves some idle
    // past Core's keep-alive timeout, and a POST racing that close fails before it is sent.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      while (performance.now() < deadline) {
        const update = random() < 0.75;
        const delta = Math.floor(random() * 19) - 9;
        const body = update ? { tool: "update_counter", args: { delta } } : { tool: "get_current_page", args: {} };
        target.calls += 1;
        if (update) target.updates += 1;
        const t0 = performance.now();
        let answer;
        try {
          answer = await post(agent, endpoint, body);
        } catch (err) {
          errors.push(`page ${target.index} at ${((t0 - started) / 1000).toFixed(1)} s: ${err.message}`);
          return;
        }
        const result = answer.body?.result;
        const ok = answer.status === 200 && (update
          ? Number.isInteger(result?.value)
          : result?.title === "Pedelec Notes" && result?.url === `${core.url}/`);
        if (!ok) {
          errors.push(`page ${target.index} ${body.tool}: HTTP ${answer.status} ${JSON.stringify(answer.body)}`);
          continue;
        }
        target.latencies.push(performance.now() - t0);
        if (update) target.sum += delta;
      }
    } finally {
      agent.destroy();
    }
  }
  await Promise.all(pages.flatMap((target) => Array.from({ length: PER_PAGE }, () => {
    const random = prng(Math.floor(rng() * 2 ** 32));
    return caller(target, random);
  })));
  const elapsed = (performance.now() - started) / 1000;
  clearInterval(sampler);
  sample();

  const mismatches = [];
  for (const target of pages) {
    const dom = await target.page.evaluate(() => ({
      counter: Number(document.getElementById("counter-value").dataset.value),
      rows: document.querySelectorAll("#log tr[data-tool]").length,
      updateRows: document.querySelectorAll('#log tr[data-tool="update_counter"]').length,
      state: window.pedelec.session.state,
    }));
    const expected = { counter: target.sum, rows: target.calls, updateRows: target.updates, state: "idle" };
    if (JSON.stringify(dom) !== JSON.stringify(expected)) {
      mismatches.push(`page ${target.index}: DOM ${JSON.stringify(dom)}, expected ${JSON.stringify(expected)}`);
    }
  }

  const latencies = pages.flatMap((p) => p.latencies).sort((a, b) => a - b);
  const perPage = pages.map((p) => p.latencies.length).sort((a, b) => a - b);
  console.log(`${latencies.length} tool calls in ${elapsed.toFixed(1)} s, ${PER_PAGE} callers per page: `
    + `${(latencies.length / elapsed).toFixed(1)} calls/s (per page ${perPage[0]}–${perPage[perPage.length - 1]} calls)`);
  if (latencies.length) {
    console.log(`latency p50 ${pct(latencies, 0.5).toFixed(2)} ms, p99 ${pct(latencies, 0.99).toFixed(2)} ms, `
      + `max ${latencies[latencies.length - 1].toFixed(2)} ms`);
  }
  console.log(`errors: ${errors.length}`);
  for (const error of errors.slice(0, 10)) console.log(`  ERROR ${error}`);
  console.log(`pages whose counter and call log match what was sent: ${PAGES - mismatches.length} / ${PAGES}`);
  for (const mismatch of mismatches) console.log(`  MISMATCH ${mismatch}`);
  console.log(`Core RSS (s: MiB): ${samples.map((s) => `${s.t.toFixed(0)}: ${mib(s.core)}`).join(", ")}`);
  console.log(`browser PSS (s: MiB): ${samples.map((s) => `${s.t.toFixed(0)}: ${mib(s.browser)}`).join(", ")}`);
  failed = errors.length > 0 || mismatches.length > 0 || latencies.length === 0;
} catch (err) {
  console.error(err);
  failed = true;
} finally {
  await cleanUp();
}
process.exit(failed ? 1 : 0);
