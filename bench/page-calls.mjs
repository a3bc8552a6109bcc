#!/usr/bin/env node
// Tool calls Core -> page -> Core in headless Chromium, timed on the client (this process,
// the control API POST /pedelec/v1/sessions/{id}/tool-calls), side by side in one page:
//   python: the page's Python tools (pedelec-pyodide: bridge, Session.dispatch, handler)
//   js:     the same tools answered by plain JS over a second WebSocket to the same Core
// 1. one `echo` call at a time: rounds of calls alternating python/js; ratio of the p50s.
// 2. 100 concurrent `wait` calls (each handler awaits 50 ms): time to all 100 results,
//    python vs js vs the ideal 50 ms.
// 3. part 1 again (a third of the rounds) with the page's JS listening to `toolcall`: the
//    events it makes Python build, and the handlers' `durationMs`. (Parts 1 and 2 run with
//    no listener: the JS session builds no events either.)
// Usage: node bench/page-calls.mjs [rounds]   (starts and stops its own Core on loopback)
import { callTool } from "../web/testing.js";
import { median, openCallsPage } from "./calls-page.mjs";

const rounds = Number(process.argv[2] ?? 15);
const perRound = 40;
const concurrency = 100;
// --max-pending: part 2 keeps `concurrency` calls pending on one session at once, over
// Core's default of 64 (which answers the rest TOO_MANY_PENDING before they reach the page).
const { core, page, sessions, close } = await openCallsPage({ port: 8796, maxPending: concurrency });
try {
  async function timed(name, tool, value) {
    const t0 = performance.now();
    const { result } = await callTool(core, sessions[name], tool, { value });
    const ms = performance.now() - t0;
    if (result?.value !== value) throw new Error(`${name} ${tool}: unexpected result ${JSON.stringify(result)}`);
    return ms;
  }
  // Warm up: jsonschema (imported after ready), the validators, HTTP keep-alive.
  for (let i = 0; i < 30; i += 1) for (const name of ["python", "js"]) await timed(name, "echo", i);

  // `count` rounds of one `echo` call at a time, python and js alternating
  async function oneCallRounds(count) {
    const ms = { python: [], js: [] };
    for (let r = 0; r < count; r += 1) {
      for (let i = 0; i < perRound; i += 1) {
        for (const name of (r + i) % 2 ? ["js", "python"] : ["python", "js"]) ms[name].push(await timed(name, "echo", i));
      }
    }
    return ms;
  }
  const single = await oneCallRounds(rounds);
  const py = median(single.python);
  const js = median(single.js);
  console.log(`one call: python ${py.toFixed(2)} ms, js ${js.toFixed(2)} ms (p50 of ${single.js.length}), ratio ${(py / js).toFixed(2)}x`);

  const concurrent = { python: [], js: [] };
  for (let r = 0; r < Math.max(3, Math.round(rounds / 3)); r += 1) {
    for (const name of r % 2 ? ["js", "python"] : ["python", "js"]) {
      const t0 = performance.now();
      await Promise.all(Array.from({ length: concurrency }, (_, i) => timed(name, "wait", i)));
      concurrent[name].push(performance.now() - t0);
    }
  }
  const cpy = median(concurrent.python);
  const cjs = median(concurrent.js);
  console.log(`${concurrency} concurrent 50 ms handlers, all results: python ${cpy.toFixed(0)} ms, js ${cjs.toFixed(0)} ms (median of ${concurrent.js.length}), `
    + `ratio ${(cpy / cjs).toFixed(2)}x; ideal 50 ms: python ${(cpy / 50).toFixed(1)}x, js ${(cjs / 50).toFixed(1)}x`);
  // Last, with the page's JS listening to `toolcall` (as an app showing its calls would):
  // the same one-call rounds, and the handler's share of Python's time.
  await page.evaluate(() => window.listenToCalls());
  const heard = await oneCallRounds(Math.max(3, Math.round(rounds / 3)));
  const handlerMs = median(await page.evaluate(() => window.pyDurations));
  const hpy = median(heard.python);
  const hjs = median(heard.js);
  console.log(`one call, the page listening to toolcall: python ${hpy.toFixed(2)} ms, js ${hjs.toFixed(2)} ms (p50 of ${heard.js.length}), ratio ${(hpy / hjs).toFixed(2)}x`);
  console.log(`  python extra ${(hpy - hjs).toFixed(2)} ms per call, of which validation + handler (session's durationMs, p50) ${handlerMs.toFixed(3)} ms`);
} finally {
  await close();
}
