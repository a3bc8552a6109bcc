#!/usr/bin/env node
// Where one tool call's time goes in the page (bench/page/calls.html in Chromium: the real
// sessionStorage, the loader's event forwarding), in two parts:
// 1. In the flow: `echo` calls through Core's control API, Python and plain JS alternating
//    (as bench/page-calls.mjs); in the page, each WebSocket's message handler and its send
//    are timed from JS, and the pieces of Python's handler by wrapping them (perf_counter).
//    Figures are means per call: Chromium coarsens clocks to 100 µs (with jitter) in a page
//    that is not cross-origin isolated, so single readings say little and medians less.
// 2. In a loop: `n` tool.request frames handed to the socket's handler from JS, the socket's
//    send swapped for a stub, with pieces switched off one at a time (variants interleaved,
//    µs per call, median of the rounds); then pieces timed alone. Warm caches: a loop costs
//    several times less than the same work in the flow, where each call runs cold.
// Usage: node bench/page-profile.mjs [calls] [rounds] [n]   (starts and stops its own Core)
import { chromium } from "playwright";
import { callTool, openPage, runPython, startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";
import { loadavg } from "node:os";

const calls = Number(process.argv[2] ?? 400);
const rounds = Number(process.argv[3] ?? 7);
const n = Number(process.argv[4] ?? 500);
execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/bench"], { stdio: "ignore" });
const core = await startCore({
  app: "bench/page", port: 8798, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"],
});
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const load = () => loadavg().map((x) => x.toFixed(2)).join(" ");
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

// Part 1, in the page before its scripts: each WebSocket's message handler and send, timed.
function timeSockets() {
  const Native = WebSocket;
  window.benchSockets = [];
  window.WebSocket = function (url, protocols) {
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    const times = { handler: [], send: [] };
    window.benchSockets.push(times);
    const send = socket.send.bind(socket);
    socket.send = (data) => { const t0 = performance.now(); send(data); times.send.push(performance.now() - t0); };
    const setter = Object.getOwnPropertyDescriptor(Native.prototype, "onmessage").set;
    let current = null;
    Object.defineProperty(socket, "onmessage", {
      get: () => current,
      set: (handler) => {
        current = handler;
        setter.call(socket, handler && ((event) => {
          const t0 = performance.now();
          try { return handler.call(socket, event); } finally { times.handler.push(performance.now() - t0); }
        }));
      },
    });
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
}

// Part 1, in Python: the pieces of the handler, wrapped where the handler finds them.
const wrapPieces = `
import time
from pedelec_pyodide import browser, dispatch, session as session_module, tools
PIECES = {}

def timed(owner, name, label):
    inner = getattr(owner, name)
    clock = time.perf_counter
    spent = PIECES.setdefault(label, [0.0])
    def wrapper(*args, **kwargs):
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += clock() - t0
    setattr(owner, name, wrapper)

ledger = session._engine.ledger
timed(type(session), "receive", "all of it (session.receive)")
timed(session_module.protocol, "parse_server_frame", "parse + check the frame")
for method in ("get", "was_started", "was_approved", "start", "finish"):
    timed(ledger, method, "delivery ledger (sessionStorage)")
timed(tools.Tool, "validate", "validate the args")
timed(dispatch, "encode_result", "check + encode the result")
timed(browser.CoreLink, "send", "send the tool.result (the socket's send)")
timed(type(session), "_emit", "session events (built, sent to the page's JS)")
"ok"`;

try {
  const page = await browser.newPage();
  await page.addInitScript(timeSockets);
  const { sessionId } = await openPage(page, `${core.url}/calls.html`);
  await page.evaluate(() => window.listenToCalls());  // its session events are a piece timed
  const jsSessionId = await page.waitForFunction(() => window.jsSessionId).then((h) => h.jsonValue());
  const sessions = { python: sessionId, js: jsSessionId };
  const call = async (name, value) => {
    const t0 = performance.now();
    const { result } = await callTool(core, sessions[name], "echo", { value });
    if (result?.value !== value) throw new Error(`${name}: unexpected result ${JSON.stringify(result)}`);
    return performance.now() - t0;
  };
  for (let i = 0; i < 30; i += 1) for (const name of ["python", "js"]) await call(name, i);
  await runPython(page, wrapPieces);
  await page.evaluate(() => { for (const times of window.benchSockets) { times.handler.length = 0; times.send.length = 0; } });
  const client = { python: [], js: [] };
  for (let i = 0; i < calls; i += 1) {
    for (const name of i % 2 ? ["js", "python"] : ["python", "js"]) client[name].push(await call(name, i));
  }
  const pieces = await runPython(page, `{label: spent[0] / ${calls} * 1e6 for label, spent in PIECES.items()}`);
  const sockets = await page.evaluate(() => window.benchSockets.map((t) => ({ handler: t.handler, send: t.send, count: t.handler.length })));
  // the JS session's socket is opened first (a module script), the page's Python's second
  const [jsSocket, pySocket] = sockets.filter((s) => s.count >= calls);
  const pyHandler = mean(pySocket.handler) * 1000;
  console.log(`in the flow (load ${load()}): ${calls} calls each, client p50 python ${median(client.python).toFixed(2)} ms, `
    + `js ${median(client.js).toFixed(2)} ms, ratio ${(median(client.python) / median(client.js)).toFixed(2)}x`);
  console.log(`  the socket's message handler, mean µs per call: python ${pyHandler.toFixed(0)}, js ${(mean(jsSocket.handler) * 1000).toFixed(0)} `
    + `(the socket's send: python ${(mean(pySocket.send) * 1000).toFixed(0)}, inside the handler; js ${(mean(jsSocket.send) * 1000).toFixed(0)}, just after it)`);
  const all = pieces["all of it (session.receive)"];
  let named = 0;
  for (const [label, us] of Object.entries(pieces)) {
    if (label.startsWith("all of it")) continue;
    named += us;
    console.log(`    ${label.padEnd(48)} ${us.toFixed(0).padStart(5)} µs ${(100 * us / pyHandler).toFixed(0).padStart(3)} %`);
  }
  console.log(`    ${"the rest of session.receive (dispatch, handler)".padEnd(48)} ${(all - named).toFixed(0).padStart(5)} µs ${(100 * (all - named) / pyHandler).toFixed(0).padStart(3)} %`);
  console.log(`    ${"the crossing into Python (the event's proxy)".padEnd(48)} ${(pyHandler - all).toFixed(0).padStart(5)} µs ${(100 * (pyHandler - all) / pyHandler).toFixed(0).padStart(3)} %`);
  await page.close();

  // Part 2: in a loop, on a fresh page.
  const loopPage = await browser.newPage();
  await openPage(loopPage, `${core.url}/calls.html`);
  await loopPage.evaluate(() => window.listenToCalls());
  await runPython(loopPage, "import jsonschema");  // imported after ready: not timed
  await runPython(loopPage, `
import json, statistics, time
import js
from pyodide.ffi import create_proxy
from pedelec_pyodide import protocol
from pedelec_pyodide.browser import bridge_of
from pedelec_pyodide.ledger import MemoryLedger
from pedelec_pyodide.results import encode_result

link = bridge_of(session)
engine = session._engine
echo_tool = engine.tools["echo"]
real = {"socket": link._socket, "send": getattr(link, "_send_frame", None),
        "listeners": list(session._listeners), "ledger": engine.ledger,
        "validator": echo_tool._validator}
stub = js.eval("({readyState: 1, sent: 0, last: null, send(f) { this.sent++; this.last = f; }})")
link._socket = stub
if hasattr(link, "_send_frame"):
    link._send_frame = stub.send
js.window.benchStub = stub
js.window.benchHandler = link._handlers[0]  # the socket's onmessage
js.window.benchCrossing = create_proxy(lambda event: event.data)

def variant(name):
    quiet = name in ("no listener", "memory ledger", "no validation")
    listeners = [] if quiet else real["listeners"]
    session._listeners[:] = listeners
    if hasattr(session, "_rehear"):
        session._rehear()
    engine.ledger = MemoryLedger() if name in ("memory ledger", "no validation") else real["ledger"]
    echo_tool._validator = (lambda args: []) if name == "no validation" else real["validator"]

def per(fn, count=1000):
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        rounds.append((time.perf_counter() - t0) / count * 1e6)
    return round(statistics.median(rounds), 1)

def pieces():
    variant("full")
    frame = json.dumps({"type": "tool.request", "toolRequestId": "piece-1", "turnId": None,
                        "tool": "echo", "args": {"value": 7}})
    return json.dumps({
        "parse + check the frame": per(lambda: protocol.parse_server_frame(frame)),
        "validate the args": per(lambda: echo_tool.validate({"value": 7})),
        "check + encode the result": per(lambda: encode_result({"value": 7}, 1 << 20)),
        "sessionStorage.setItem from Python": per(lambda: js.sessionStorage.setItem("pedelec:bench", "{}")),
        "sessionStorage.getItem from Python": per(lambda: js.sessionStorage.getItem("pedelec:bench")),
    })
"ok"`);
  async function loop(variant, tag) {
    if (variant !== "crossing only" && variant !== "plain JS") await runPython(loopPage, `variant(${JSON.stringify(variant)})`);
    return loopPage.evaluate(({ variant, tag, n }) => {
      const events = Array.from({ length: n }, (_, i) => ({ type: "message", data: JSON.stringify({
        type: "tool.request", toolRequestId: `${tag}-${i}`, turnId: null, tool: "echo", args: { value: i } }) }));
      const stub = window.benchStub;
      const handle = variant === "crossing only" ? window.benchCrossing : variant === "plain JS" ? (event) => {
        const frame = JSON.parse(event.data);
        stub.send(JSON.stringify({ type: "tool.result", toolRequestId: frame.toolRequestId, result: { value: frame.args.value }, handledBy: "named" }));
      } : window.benchHandler;
      const sent = stub.sent;
      const t0 = performance.now();
      for (const event of events) handle(event);
      const us = ((performance.now() - t0) / n) * 1000;
      if (variant !== "crossing only" && stub.sent - sent !== n) throw new Error(`${variant}: ${stub.sent - sent} results of ${n}: ${stub.last}`);
      return us;
    }, { variant, tag, n });
  }
  const variants = ["full", "no listener", "memory ledger", "no validation", "crossing only", "plain JS"];
  const times = Object.fromEntries(variants.map((v) => [v, []]));
  for (let r = 0; r < rounds; r += 1) {
    for (const [i, variant] of variants.entries()) times[variant].push(await loop(variant, `prof${r}-${i}`));
  }
  console.log(`in a loop (load ${load()}): µs per call, median of ${rounds} rounds of ${n}`);
  const notes = {
    "full": "as the page is (its JS listens to toolcall)",
    "no listener": "no session events at all",
    "memory ledger": "and the delivery ledger in memory, not sessionStorage",
    "no validation": "and no args validation",
    "crossing only": "a Python function reading event.data",
    "plain JS": "JSON.parse, the handler, JSON.stringify, send",
  };
  for (const variant of variants) console.log(`  ${variant.padEnd(14)} ${median(times[variant]).toFixed(1).padStart(6)}  ${notes[variant]}`);
  const alone = JSON.parse(await runPython(loopPage, "pieces()"));
  console.log("  pieces alone (µs each, median of 7 rounds of 1,000):");
  for (const [label, us] of Object.entries(alone)) console.log(`    ${label.padEnd(40)} ${us}`);
} finally {
  await browser.close();
  await core.stop();
}
