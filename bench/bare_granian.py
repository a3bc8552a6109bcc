"""``bench/bare_core.py``'s app served by Granian (a server in Rust with an ASGI interface)
instead of uvicorn: the floor of Core's paths on the other server DESIGN.md names.

One worker process (Granian's own, a child of this one), asyncio's loop, HTTP/1 only,
one runtime thread; Granian answers WebSocket pings itself, in Rust, and has no
permessage-deflate. Prints ``serving: http://127.0.0.1:PORT`` once the port accepts, as
``pedelec serve`` does (``bench/core_paths.py --granian`` runs it). Granian is not one of
this project's dependencies: ``.venv/bin/pip install granian`` first.

Run: ``PYTHONPATH=bench .venv/bin/python bench/bare_granian.py``
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops, RuntimeModes
from granian.log import LogLevels

ANNOUNCE_SECONDS = 30.0


def free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port: int = probe.getsockname()[1]
    probe.close()
    return port


def announce(port: int, out: int) -> None:
    """Print the URL once the worker accepts (Granian prints nothing on stdout)."""
    deadline = time.monotonic() + ANNOUNCE_SECONDS
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            time.sleep(0.05)
            continue
        time.sleep(0.3)  # the worker's app is loaded by then
        os.write(out, f"serving: http://127.0.0.1:{port}\n".encode())
        return
    os.write(out, b"serving: http://127.0.0.1:0 (Granian did not start)\n")


def main() -> None:
    port = free_port()
    out = os.dup(1)
    os.dup2(2, 1)  # Granian's own output goes to stderr: stdout carries the URL alone
    sys.stdout = sys.stderr
    threading.Thread(target=announce, args=(port, out), daemon=True).start()
    Granian("bare_core:app", address="127.0.0.1", port=port, interface=Interfaces.ASGI,
            workers=1, runtime_threads=1, runtime_mode=RuntimeModes.st, loop=Loops.asyncio,
            http=HTTPModes.http1, websockets=True, log_level=LogLevels.warning,
            log_access=False).serve()


if __name__ == "__main__":
    main()
