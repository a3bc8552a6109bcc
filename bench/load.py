"""Load: N concurrent simulated pages on one Core for S seconds, tool calls all the time.

Core runs as ``pedelec serve`` in a process of its own (its RSS is its own). This process
opens the pages (websockets clients that say hello with two tools and answer every
``tool.request`` at once) and, for the whole run, keeps ``--concurrency`` control-API
callers busy (raw HTTP/1.1 keep-alive), each call going to a random page through Core.

Reported: calls, throughput, p50/p99/max latency, errors (any non-200, wrong result,
exception: target 0), and Core's RSS sampled every ``--sample`` seconds, with its growth
after the warm-up (the first quarter of the run). Exit status 1 on any error.

Run: ``.venv/bin/python bench/load.py [--pages 1000 --seconds 60 --concurrency 64]``
Smoke (CI): ``.venv/bin/python bench/load.py --pages 100 --seconds 5``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import resource
import sys
import time

from simpages import SimPage, core_process, open_pages, post_tool_call, rss_kib

TOKEN = "bench-load"


class Figures:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []


async def caller(port: int, pages: list[SimPage], deadline: float, figures: Figures,
                 rng: random.Random) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            page = rng.choice(pages)
            delta = rng.randrange(1_000_000)
            started = time.perf_counter()
            try:
                status, answer = await post_tool_call(reader, writer, TOKEN, page.session_id,
                                                      "update_counter", {"delta": delta})
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                figures.errors.append(f"{type(exc).__name__}: {exc}")
                return
            if status != 200 or answer.get("result") != {"echo": {"delta": delta}}:
                figures.errors.append(f"{status}: {answer}")
                continue
            figures.latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def sample_rss(pid: int, every: float, started: float,
                     samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append((time.perf_counter() - started, rss_kib(pid)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


async def main(pages_n: int, seconds: float, concurrency: int, every: float, seed: int) -> int:
    # every simulated page comes from this one process's address: one client to Core
    options = ("--rate-limit", "100000", "--rate-burst", "200000",
               "--max-sessions-per-client", str(max(pages_n, 32)))
    pages: list[SimPage] = []
    with core_process(TOKEN, *options) as (core, port):
        try:
            return await drive(core.pid, port, pages, pages_n, seconds, concurrency, every, seed)
        finally:
            for page in pages:
                with contextlib.suppress(Exception):
                    await page.close()


async def drive(pid: int, port: int, pages: list[SimPage], pages_n: int, seconds: float,
                concurrency: int, every: float, seed: int) -> int:
    ws_url = f"ws://127.0.0.1:{port}/pedelec/v1/bridge"
    opened = time.perf_counter()
    pages += await open_pages(ws_url, pages_n)
    print(f"{pages_n} pages connected in {time.perf_counter() - opened:.1f} s; "
          f"Core RSS {rss_kib(pid) / 1024:.1f} MiB", flush=True)

    figures = Figures()
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    started = time.perf_counter()
    sampler = asyncio.create_task(sample_rss(pid, every, started, samples, stop))
    rng = random.Random(seed)
    await asyncio.gather(*(
        caller(port, pages, started + seconds, figures, random.Random(rng.random()))
        for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    stop.set()
    await sampler
    samples.append((elapsed, rss_kib(pid)))

    lat = sorted(figures.latencies)
    calls = len(lat)
    answered = sum(page.answered for page in pages)
    busy = sum(1 for page in pages if page.answered)
    print(f"{calls} tool calls in {elapsed:.1f} s by {concurrency} concurrent callers "
          f"over {pages_n} pages ({busy} of them called): {calls / elapsed:.0f} calls/s")
    if lat:
        print(f"latency p50 {pct(lat, 0.50) * 1000:.2f} ms, p99 {pct(lat, 0.99) * 1000:.2f} ms,"
              f" max {lat[-1] * 1000:.2f} ms")
    print(f"errors: {len(figures.errors)}; requests answered by pages: {answered}")
    for error in figures.errors[:10]:
        print(f"  ERROR {error}")
    warm = next((kib for t, kib in samples if t >= seconds / 4), samples[0][1])
    peak_after = max(kib for t, kib in samples if t >= seconds / 4)
    print("Core RSS (s: MiB): " + ", ".join(f"{t:.0f}: {kib / 1024:.1f}" for t, kib in samples))
    print(f"Core RSS after warm-up ({seconds / 4:.0f} s): {warm / 1024:.1f} MiB -> "
          f"end {samples[-1][1] / 1024:.1f} MiB (peak {peak_after / 1024:.1f} MiB; "
          f"growth {(samples[-1][1] - warm) / 1024:+.1f} MiB)")
    return 0 if not figures.errors and calls > 0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sample", type=float, default=5.0, help="RSS sample period, s")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    sys.exit(asyncio.run(main(options.pages, options.seconds, options.concurrency,
                              options.sample, options.seed)))
