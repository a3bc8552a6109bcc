#!/usr/bin/env node
// Tool calls Core -> page -> Core in headless Chromium, timed on the client (this process,
// the control API POST /pedelec/v1/sessions/{id}/tool-calls), side by side in one page:
//   python: the page's Python tools (pedelec-pyodide: bridge, Session.dispatch, handler)
//   js:     the same tools answered by plain JS over a second WebSocket to the same Core
//   bare:   the same tools answered by a few lines of bare Python (no pedelec-pyodide) over
//           a socket of its own: what any Python handler in the page pays for Pyodide
//   floor:  bare, plus the two sessionStorage writes that keep a call from being lost or
//           run twice across a reload or a crash: the least such a Python handler costs
// 1. one call at a time: rounds of calls rotating the four; ratios of the p50s. Each round
//    calls `echo`, and `peek`, a read-only tool, in turn (its start is not written: the
//    floor's calls make one write, not two).
// 2. 100 concurrent `wait` calls (each handler awaits 50 ms): time to all 100 results,
//    against each other and the ideal 50 ms.
// 3. part 1 again (a third of the rounds) with the page's JS listening to `toolcall`: the
//    events it makes Python build, and the handlers' `durationMs`. (Parts 1 and 2 run with
//    no listener: the JS session builds no events either.)
// Usage: node bench/page-calls.mjs [rounds]   (starts and stops its own Core on loopback)
import { callTool } from "../web/testing.js";
import { VARIANTS, median, openCallsPage, rotated } from "./calls-page.mjs";

const rounds = Number(process.argv[2] ?? 15);
const perRound = 40;
const concurrency = 100;
// --max-pending: part 2 keeps `concurrency` calls pending on one session at once, over
// Core's default of 64 (which answers the rest TOO_MANY_PENDING before they reach the page).
const { core, page, sessions, close } = await openCallsPage({ port: 8796, maxPending: concurrency });
// each variant's figure, then python against js (the goal), bare and floor against js, and
// python against floor (what pedelec-pyodide adds to the least a guarded call costs)
function compared(figures, format) {
  const f = (name) => median(figures[name]);
  return `${VARIANTS.map((name) => `${name} ${format(f(name))}`).join(", ")} (of ${figures.js.length}); `
    + `python ${(f("python") / f("js")).toFixed(2)}x js; bare ${(f("bare") / f("js")).toFixed(2)}x js, `
    + `floor ${(f("floor") / f("js")).toFixed(2)}x js; python ${(f("python") / f("floor")).toFixed(2)}x floor`;
}
try {
  async function timed(name, tool, value) {
    const t0 = performance.now();
    const { result } = await callTool(core, sessions[name], tool, { value });
    const ms = performance.now() - t0;
    if (result?.value !== value) throw new Error(`${name} ${tool}: unexpected result ${JSON.stringify(result)}`);
    return ms;
  }
  // Warm up: jsonschema (imported after ready), the validators, HTTP keep-alive.
  for (let i = 0; i < 30; i += 1) for (const name of VARIANTS) await timed(name, "echo", i);

  // `count` rounds of one `echo` call at a time, the variants in rotating order
  // each tool's calls by variant: { tool: { name: [ms] } }
  async function oneCallRounds(count, names = VARIANTS, tools = ["echo"]) {
    const ms = Object.fromEntries(tools.map((tool) => [tool, Object.fromEntries(names.map((name) => [name, []]))]));
    for (let r = 0; r < count; r += 1) {
      for (let i = 0; i < perRound; i += 1) {
        for (const tool of rotated(tools, i)) {
          for (const name of rotated(names, r + i)) ms[tool][name].push(await timed(name, tool, i));
        }
      }
    }
    return ms;
  }
  const single = await oneCallRounds(rounds, VARIANTS, ["echo", "peek"]);
  console.log(`one call, p50: ${compared(single.echo, (ms) => `${ms.toFixed(2)} ms`)}`);
  console.log(`one read-only call, p50: ${compared(single.peek, (ms) => `${ms.toFixed(2)} ms`)}`);

  const concurrent = Object.fromEntries(VARIANTS.map((name) => [name, []]));
  for (let r = 0; r < Math.max(3, Math.round(rounds / 3)); r += 1) {
    for (const name of rotated(VARIANTS, r)) {
      const t0 = performance.now();
      await Promise.all(Array.from({ length: concurrency }, (_, i) => timed(name, "wait", i)));
      concurrent[name].push(performance.now() - t0);
    }
  }
  console.log(`${concurrency} concurrent 50 ms handlers, time to all results, median: `
    + `${compared(concurrent, (ms) => `${ms.toFixed(0)} ms (${(ms / 50).toFixed(1)}x ideal)`)}`);
  // Last, with the page's JS listening to `toolcall` (as an app showing its calls would):
  // the same one-call rounds, and the handler's share of Python's time.
  await page.evaluate(() => window.listenToCalls());
  const heard = (await oneCallRounds(Math.max(3, Math.round(rounds / 3)), ["python", "js"])).echo;
  const handlerMs = median(await page.evaluate(() => window.pyDurations));
  const hpy = median(heard.python);
  const hjs = median(heard.js);
  console.log(`one call, the page listening to toolcall: python ${hpy.toFixed(2)} ms, js ${hjs.toFixed(2)} ms (p50 of ${heard.js.length}), ratio ${(hpy / hjs).toFixed(2)}x`);
  console.log(`  python extra ${(hpy - hjs).toFixed(2)} ms per call, of which validation + handler (session's durationMs, p50) ${handlerMs.toFixed(3)} ms`);
} finally {
  await close();
}
