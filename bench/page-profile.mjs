#!/usr/bin/env node
// Where one tool call's time goes in the page (Chromium, the real sessionStorage and the
// loader's event forwarding): `tool.request` frames are handed to the page's WebSocket
// handler (the proxy Python gave the socket) from JS, as the browser would, with the
// socket's `send` swapped for a stub; each figure is µs per call, the median of rounds of
// `n` calls, the variants interleaved. Pieces are also timed alone, from Python.
// Usage: node bench/page-profile.mjs [rounds] [n]   (starts and stops its own Core)
import { chromium } from "playwright";
import { openPage, runPython, startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";
import { loadavg } from "node:os";

const rounds = Number(process.argv[2] ?? 9);
const n = Number(process.argv[3] ?? 500);
execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/bench"], { stdio: "ignore" });
const core = await startCore({
  app: "bench/page", port: 8798, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"],
});
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });

// Python in the page: the variants' switches, and the pieces timed alone.
const setup = `
import json, statistics, time
import js
from pyodide.ffi import create_proxy
from pedelec_pyodide import protocol
from pedelec_pyodide import browser
from pedelec_pyodide.browser import bridge_of
if hasattr(browser, "_event_json"):
    event_json = lambda event: browser._event_json(session, "toolstatus", event)
else:  # before the events were gated
    event_json = lambda event: json.dumps(browser._event_for(session, event)[1], ensure_ascii=False)
from pedelec_pyodide.ledger import MemoryLedger
from pedelec_pyodide.results import encode_result
from pedelec_pyodide.dispatch import ToolStatus

link = bridge_of(session)
engine = session._engine
echo_tool = engine.tools["echo"]
real = {"socket": link._socket, "listeners": list(session._listeners), "ledger": engine.ledger,
        "validator": echo_tool._validator}
stub = js.eval("({readyState: 1, sent: 0, last: null, send(f) { this.sent++; this.last = f; }})")
link._socket = stub
js.window.benchStub = stub
js.window.benchHandler = link._handler
js.window.benchCrossing = create_proxy(lambda event: (event.type, event.data))

page_session = real["listeners"][0].listener.__self__
real["emit"] = page_session._emit
js_noop = js.eval("(function (type, json) {})")
def variant(name):
    session._listeners[:] = [] if name in ("no listener", "memory ledger", "no validation") else [lambda event: None] if name == "py noop listener" else real["listeners"]
    page_session._emit = js_noop if name == "JS emit noop" else real["emit"]
    engine.ledger = MemoryLedger() if name in ("memory ledger", "no validation") else real["ledger"]
    echo_tool._validator = (lambda args: []) if name == "no validation" else real["validator"]

def restore():
    variant("full")
    link._socket = real["socket"]

def per(fn, n=1000):
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(rounds), 1)

def pieces():
    variant("full")
    frame = json.dumps({"type": "tool.request", "toolRequestId": "piece-1", "turnId": None,
                        "tool": "echo", "args": {"value": 7}})
    status = ToolStatus("piece-1", "echo", None, "running", "core")
    forward = real["listeners"][0] if real["listeners"] else None
    led = real["ledger"]
    return json.dumps({
        "parse + check the frame (parse_server_frame)": per(lambda: protocol.parse_server_frame(frame)),
        "validate args": per(lambda: echo_tool.validate({"value": 7})),
        "encode + check the result (encode_result)": per(lambda: encode_result({"value": 7}, 1 << 20)),
        "the tool.result frame (encode_tool_result)": per(lambda: protocol.encode_tool_result("piece-1", '{"value":7}', "inline")),
        "ledger.get + was_started (2 getItem)": per(lambda: (led.get("nope"), led.was_started("nope"))),
        "ledger.start (1 setItem)": per(lambda: led.start("piece-1", "echo")),
        "ledger.finish (1 setItem)": per(lambda: led.finish("piece-1", '{"value":7}', "inline")),
        "one event to the page's JS (toolstatus)": per(lambda: forward(status)) if forward else None,
        "  of which its JSON": per(lambda: event_json(status)),
        "send a str to a JS function (stub.send)": per(lambda: stub.send(frame)),
        "sessionStorage.setItem from Python": per(lambda: js.sessionStorage.setItem("pedelec:bench", "{}")),
        "sessionStorage.getItem from Python": per(lambda: js.sessionStorage.getItem("pedelec:bench")),
        "perf_counter": per(time.perf_counter),
    })
"ok"
`;

try {
  const page = await browser.newPage();
  await openPage(page, `${core.url}/calls.html`);
  // warm up: jsonschema imported after ready, the validator built on its first call
  await runPython(page, "import jsonschema");
  await runPython(page, setup);
  const run = async (variant, tag) => {
    if (variant === "crossing only" || variant === "plain JS") {
      return page.evaluate(({ variant, tag, n }) => {
        const events = Array.from({ length: n }, (_, i) => ({ type: "message", data: JSON.stringify({
          type: "tool.request", toolRequestId: `${tag}-${i}`, turnId: null, tool: "echo", args: { value: i } }) }));
        const stub = window.benchStub;
        const handle = variant === "crossing only" ? window.benchCrossing : (event) => {
          const frame = JSON.parse(event.data);
          const result = { value: frame.args.value };
          stub.send(JSON.stringify({ type: "tool.result", toolRequestId: frame.toolRequestId, result, handledBy: "named" }));
        };
        const t0 = performance.now();
        for (const event of events) handle(event);
        return ((performance.now() - t0) / n) * 1000;
      }, { variant, tag, n });
    }
    await runPython(page, `variant(${JSON.stringify(variant)})`);
    return page.evaluate(({ tag, n }) => {
      const events = Array.from({ length: n }, (_, i) => ({ type: "message", data: JSON.stringify({
        type: "tool.request", toolRequestId: `${tag}-${i}`, turnId: null, tool: "echo", args: { value: i } }) }));
      const stub = window.benchStub;
      const handler = window.benchHandler;
      const sent = stub.sent;
      const t0 = performance.now();
      for (const event of events) handler(event);
      const us = ((performance.now() - t0) / n) * 1000;
      if (stub.sent - sent !== n) throw new Error(`expected ${n} results, got ${stub.sent - sent}: ${stub.last}`);
      if (!stub.last.includes(`"result":{"value":${n - 1}}`)) throw new Error(`unexpected result ${stub.last}`);
      return us;
    }, { tag, n });
  };
  const variants = ["full", "py noop listener", "JS emit noop", "no listener", "memory ledger", "no validation", "crossing only", "plain JS"];
  const times = Object.fromEntries(variants.map((v) => [v, []]));
  for (let r = 0; r < rounds; r += 1) {
    for (const [i, variant] of variants.entries()) {
      times[variant].push(await run(variant, `prof${r}-${i}`));
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(`load average ${loadavg().map((x) => x.toFixed(2)).join(" ")}; µs per call, median of ${rounds} rounds of ${n}`);
  for (const variant of variants) console.log(`  ${variant.padEnd(16)} ${median(times[variant]).toFixed(1)}`);
  const pieces = JSON.parse(await runPython(page, "pieces()"));
  Object.assign(pieces, await page.evaluate(() => {
    const per = (fn, count = 1000) => { const t0 = performance.now(); for (let i = 0; i < count; i += 1) fn(i); return Math.round(((performance.now() - t0) / count) * 10000) / 10; };
    return {
      "sessionStorage.setItem from JS": per(() => sessionStorage.setItem("pedelec:bench", "{}")),
      "sessionStorage.getItem from JS": per(() => sessionStorage.getItem("pedelec:bench")),
      "CustomEvent + dispatchEvent (no listener) from JS": per(() => window.pedelec.session.dispatchEvent(new CustomEvent("nobody", { detail: {} }))),
    };
  }));
  console.log("pieces alone (µs each, Python's perf_counter, median of 7 rounds of 1,000):");
  for (const [name, us] of Object.entries(pieces)) console.log(`  ${name.padEnd(48)} ${us}`);
  await runPython(page, "restore()");
} finally {
  await browser.close();
  await core.stop();
}
