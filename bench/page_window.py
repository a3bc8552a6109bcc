"""One tool request's path through the page's Session, piece by piece, in Pyodide.

``node bench/run-pyodide.mjs bench/page_window.py``: a ``tool.request`` frame in, its
``tool.result`` frame out, with the delivery ledger in a JS storage object (a Map behind
``getItem``/``setItem``, so every ledger read and write crosses into JS as
``sessionStorage`` does in the page) and, as in the page, a session listener that
forwards every event to a JS function as a type and a JSON string (a ``CustomEvent``
dispatched on an ``EventTarget``). Variants interleaved in rounds; each figure is the
median per request, and the ratios are against the bare variant (MemoryLedger, no
listener) of the same run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

from pyodide.code import run_js  # type: ignore[import-not-found]

from pedelec_pyodide import Session, define_tool
from pedelec_pyodide.ledger import MemoryLedger, StorageLedger

N = 400
ROUNDS = 9


@define_tool
def echo(value: int) -> dict:
    """Return the value."""
    return {"value": value}


class Sink:
    def send(self, frame: str) -> None:
        pass


def js_storage() -> Any:
    return run_js("""({m: new Map(),
        getItem(k) { return this.m.has(k) ? this.m.get(k) : null; },
        setItem(k, v) { this.m.set(k, v); }, removeItem(k) { this.m.delete(k); }})""")


JS_EMIT = run_js("""(() => { const t = new EventTarget(); let n = 0;
    t.addEventListener("toolcall", () => { n += 1; });
    return (type, json) => {
      t.dispatchEvent(new CustomEvent(type, {detail: JSON.parse(json)}));
    }; })()""")


def forward(event: Any) -> None:
    detail = {k: v for k, v in vars(event).items()} if hasattr(event, "__dict__") else {
        name: getattr(event, name) for name in getattr(event, "__slots__", ())}
    JS_EMIT(type(event).__name__.lower(), json.dumps(detail, default=str))


def make(ledger: str, listener: bool) -> Session:
    store = (StorageLedger(js_storage(), "bench:") if ledger == "storage"
             else MemoryLedger())
    session = Session([echo], ledger=store)
    if listener:
        session.subscribe(forward)
    session.connection_made(Sink())
    return session


VARIANTS = {
    "memory ledger, no listener": ("memory", False),
    "storage ledger, no listener": ("storage", False),
    "memory ledger, listener to JS": ("memory", True),
    "storage ledger, listener to JS (the page)": ("storage", True),
}


async def main() -> None:
    sessions = {name: make(*spec) for name, spec in VARIANTS.items()}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    counter = 0
    for _ in range(ROUNDS):
        for name, session in sessions.items():
            frames = []
            for _ in range(N):
                counter += 1
                frames.append(json.dumps({"type": "tool.request", "toolRequestId": f"r{counter}",
                                          "tool": "echo", "args": {"value": counter},
                                          "turnId": None}))
            t0 = time.perf_counter()
            for frame in frames:
                session.receive(frame)
            times[name].append((time.perf_counter() - t0) / N * 1e6)
            await asyncio.sleep(0)
    pieces()
    base = statistics.median(times["memory ledger, no listener"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:45s} {med:7.1f} us/request  {med / base:5.2f}x")


def per_op(fn: Any, n: int = 2000) -> float:
    """Median over rounds of one call of ``fn``, in microseconds."""
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


def pieces() -> None:
    """What the session's ``durationMs`` window (the request's record made -> its answer)
    holds since dispatch.py, one piece at a time."""
    from pedelec_pyodide.dispatch import ToolStatus
    ledger = StorageLedger(js_storage(), "pieces:")
    ledger.start("seen", "echo")
    status = ToolStatus("r1", "echo", None, "running")
    args = {"value": 1}
    print("window pieces (us each):")
    timed: dict[str, Any] = {
        "ledger.get + was_started (2 getItem)":
            lambda: (ledger.get("new"), ledger.was_started("new")),
        "toolstatus event to JS": lambda: forward(status),
        "args validation": lambda: echo.validate(args),
        "ledger.start of a known id (1 setItem)": lambda: ledger.start("seen", "echo"),
    }
    for label, fn in timed.items():
        print(f"  {label:40s} {per_op(fn):7.1f}")
