"""What reading a node's inbox costs: Core's (redis-py's pub/sub reader, the seal checked)
against a bare reader of the same messages (one stream, hiredis's parser, no seal).

A call crossing nodes reads two messages from inboxes (the ask, the reply). This asks
whether reading them on a stream of Core's own, as ``store/publisher.py`` publishes, would
take much off a crossing call. One message at a time, as on that path: published (through
the store's publisher, sealed as in a cluster), then awaited until the reader has it;
variants interleaved round by round in one process, pinned or not. Prints the CPU per
message of each (publish + read; the publish is the same in both) and their ratio.

Run: ``.venv/bin/python bench/inbox_reader.py [--rounds 7 --messages 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import hiredis
from store_backends import redis_server

from pedelec_pyodide.core.store.redis import RedisStore

WAIT = 10.0
SECRET = "bench-cluster-secret-" + "x" * 24
MESSAGE = '{"kind":"http.reply","id":"' + "r" * 32 + '","status":200,"body":"' + "b" * 300 + '"}'


async def bare_inbox(url: str, channel: str) -> AsyncIterator[str]:
    """SUBSCRIBE on a stream of its own; each message's data, as text."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel.encode()))
    parser = hiredis.Reader()
    try:
        while data := await reader.read(65536):
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if reply[0] == b"message":
                    yield reply[2].decode()
    finally:
        writer.close()


async def measure(store: RedisStore, node: str, inbox: AsyncIterator[str], count: int) -> float:
    """CPU seconds per message: each published, then read back before the next."""
    started = time.process_time()
    for _ in range(count):
        await store.publish(node, MESSAGE)
        await asyncio.wait_for(anext(inbox), WAIT)
    return (time.process_time() - started) / count


async def main(rounds: int, messages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        sealed = RedisStore(url, secret=SECRET)  # Core's in a cluster: messages sealed
        unsealed = RedisStore(url)  # no cluster secret: no seal to check
        inboxes = {"core's inbox, sealed": (sealed, "core", sealed.inbox("core")),
                   "core's inbox, no seal": (unsealed, "plain", unsealed.inbox("plain")),
                   "bare reader, no seal": (unsealed, "bare",
                                            bare_inbox(url, unsealed._key("node", "bare")))}
        for store, node, inbox in inboxes.values():
            first = asyncio.ensure_future(anext(inbox))  # subscribes
            for _ in range(100):  # until it has subscribed: its first message arrives
                await store.publish(node, MESSAGE)
                done, _ = await asyncio.wait([first], timeout=0.05)
                if done:
                    break
            await asyncio.wait_for(first, WAIT)
            await store.publish(node, "")  # the extra ones the loop sent, read up to this
            for _ in range(101):
                if await asyncio.wait_for(anext(inbox), WAIT) == "":
                    break
        spent: dict[str, list[float]] = {name: [] for name in inboxes}
        for number in range(rounds):
            order = list(inboxes) if number % 2 == 0 else list(reversed(inboxes))
            for name in order:
                spent[name].append(await measure(*inboxes[name], messages))
        print(f"CPU per message (publish + read, median of {rounds} rounds of {messages}; "
              "a crossing call reads two):")
        bare_cpu = statistics.median(spent["bare reader, no seal"])
        for name in inboxes:
            cpu = statistics.median(spent[name])
            print(f"  {name:24} {cpu * 1e6:6.1f} µs  {cpu / bare_cpu:.2f}x  "
                  f"+{(cpu - bare_cpu) * 1e6:.1f} µs")
        for _, _, inbox in inboxes.values():
            await inbox.aclose()  # type: ignore[attr-defined]
        await sealed.close()
        await unsealed.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=2000)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.messages))
