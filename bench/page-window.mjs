#!/usr/bin/env node
// The pieces of one request's durationMs window, timed inside the page (Chromium, the real
// sessionStorage and the loader's event forwarding), by Python in the page:
// node bench/page-window.mjs   (starts and stops its own Core on loopback)
import { chromium } from "playwright";
import { openPage, runPython, startCore } from "../web/testing.js";
import { execFileSync } from "node:child_process";

execFileSync(".venv/bin/python", ["-m", "pedelec_pyodide.build.provision", ".cache/bench"], { stdio: "ignore" });
const core = await startCore({
  app: "bench/page", port: 8797, pedelec: ".venv/bin/pedelec", pyodide: ".cache/bench/pyodide", args: ["--quiet"],
});
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const code = `
import json, statistics, time
from pedelec_pyodide.dispatch import ToolStatus
from pedelec_pyodide.session import SessionState
led = session._engine.ledger
st = ToolStatus("x", "echo", None, "running")
echo_tool = session._engine.tools["echo"]
def per(fn, n=1000):
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(rounds), 1)
json.dumps({
    "ledger.get + was_started (2 getItem)": per(lambda: (led.get("nope"), led.was_started("nope"))),
    "toolstatus event to the page's JS": per(lambda: session._emit(st)),
    "statechange event to the page's JS": per(lambda: session._emit(SessionState.IDLE)),
    "args validation": per(lambda: echo_tool.validate({"value": 1})),
    "ledger.start (1 setItem, known id)": per(lambda: led.start("bench-known", "echo")),
    "perf_counter": per(time.perf_counter),
})`;
try {
  const page = await browser.newPage();
  await openPage(page, `${core.url}/calls.html`);
  for (let i = 0; i < 3; i += 1) console.log(JSON.parse(await runPython(page, code)));
} finally {
  await browser.close();
  await core.stop();
}
