"""A client flooding Core with frames, in a process of its own (so that its own work does
not slow the test's clock or the well-behaved page it measures): connects, says hello,
prints ``ready``, sends frames as fast as it can until Core closes the socket (or 200,000
are sent), then prints ``{"sent": N, "code": CLOSE_CODE}``.

Run: ``python flooder.py WS_URL``
"""

from __future__ import annotations

import asyncio
import json
import sys

import websockets

FRAME = '{"type":"turn.cancel","turnId":"x"}'
MOST = 200_000


async def main(url: str) -> None:
    sent, code = 0, None
    # max_queue=None: it reads all Core sends while it floods (the refusals, then the
    # close), where websockets would stop reading after 16 messages nobody took
    async with websockets.connect(url, max_size=None, max_queue=None) as ws:
        await ws.send(json.dumps({"type": "hello", "protocol": 1, "tools": []}))
        await ws.recv()
        print("ready", flush=True)
        try:
            while sent < MOST:
                await ws.send(FRAME)
                sent += 1
                if sent % 50 == 0:
                    await asyncio.sleep(0)
            while True:  # what Core sends until it closes
                await ws.recv()
        except websockets.ConnectionClosed as closed:
            code = None if closed.rcvd is None else closed.rcvd.code
    print(json.dumps({"sent": sent, "code": code}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
