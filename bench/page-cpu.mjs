#!/usr/bin/env node
// The page's main-thread CPU per tool call, from Chromium's sampling profiler (CDP
// Profiler: the samples that are not idle), in the page of bench/page-calls.mjs:
//   python: the page's Python tools (pedelec-pyodide)
//   js:     the same tools answered by plain JS over a second WebSocket to the same Core
//   bare:   the same tools answered by a few lines of bare Python (no pedelec-pyodide)
//   floor:  bare, plus the two sessionStorage writes a call needs to be neither lost nor
//           run twice across a reload (see bench/page-calls.mjs)
// Less moved by other work on the machine than the client's wall time: a busy machine
// stretches waits, not the page's own work. Rounds rotate the four; prints the
// median per call of each and their ratios, for 1. `echo` one call at a time and 2. rounds
// of 100 concurrent `wait` calls (each handler awaits 50 ms), with the functions that
// took the most of each.
// Usage: node bench/page-cpu.mjs [rounds]   (starts and stops its own Core on loopback)
import { callTool } from "../web/testing.js";
import { loadavg } from "node:os";
import { VARIANTS, median, openCallsPage, rotated } from "./calls-page.mjs";

const rounds = Number(process.argv[2] ?? 4);
const { core, page, sessions, close } = await openCallsPage({ port: 8791, maxPending: 100 });
try {
  for (let i = 0; i < 30; i += 1) for (const name of VARIANTS) await callTool(core, sessions[name], "echo", { value: i });
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Profiler.enable");
  await cdp.send("Profiler.setSamplingInterval", { interval: 50 });

  // µs of non-idle samples per call while `run` makes `calls` calls; and by function
  async function profiled(run, calls) {
    await cdp.send("Profiler.start");
    await run();
    const { profile } = await cdp.send("Profiler.stop");
    const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
    const byFunction = new Map();
    let busy = 0;
    profile.samples.forEach((id, i) => {
      const name = nodes.get(id).callFrame.functionName || "(anonymous)";
      if (name === "(idle)") return;
      busy += profile.timeDeltas[i];
      byFunction.set(name, (byFunction.get(name) ?? 0) + profile.timeDeltas[i]);
    });
    return { perCall: busy / calls, byFunction };
  }
  const parts = {
    "one echo call at a time (200 a round)": (name) => profiled(async () => {
      for (let i = 0; i < 200; i += 1) await callTool(core, sessions[name], "echo", { value: i });
    }, 200),
    "100 concurrent wait calls (3 rounds of 100 a round)": (name) => profiled(async () => {
      for (let r = 0; r < 3; r += 1) {
        await Promise.all(Array.from({ length: 100 }, (_, i) => callTool(core, sessions[name], "wait", { value: i })));
      }
    }, 300),
  };
  for (const [part, measure] of Object.entries(parts)) {
    const perCall = Object.fromEntries(VARIANTS.map((name) => [name, []]));
    const functions = Object.fromEntries(VARIANTS.map((name) => [name, new Map()]));
    for (let r = 0; r < rounds; r += 1) {
      for (const name of rotated(VARIANTS, r)) {
        const { perCall: us, byFunction } = await measure(name);
        perCall[name].push(us);
        for (const [fn, t] of byFunction) functions[name].set(fn, (functions[name].get(fn) ?? 0) + t);
      }
    }
    const [py, js, bare, floor] = VARIANTS.map((name) => median(perCall[name]));
    const calls = part.startsWith("one") ? 200 : 300;
    const top = (name, count) => [...functions[name]].sort((a, b) => b[1] - a[1]).slice(0, count)
      .map(([fn, t]) => `${fn} ${(t / rounds / calls).toFixed(0)}`).join(", ");
    console.log(`${part}: main-thread CPU per call, median of ${rounds} rounds: python ${py.toFixed(0)} µs, `
      + `js ${js.toFixed(0)} µs, bare ${bare.toFixed(0)} µs, floor ${floor.toFixed(0)} µs; python ${(py / js).toFixed(2)}x js, `
      + `${(py / floor).toFixed(2)}x floor (load ${loadavg()[0].toFixed(1)})`);
    for (const name of VARIANTS) console.log(`  ${name}'s largest (µs a call): ${top(name, name === "js" ? 4 : 8)}`);
  }
} finally {
  await close();
}
