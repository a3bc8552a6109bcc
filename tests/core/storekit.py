"""The store backends as the contract tests (test_store_contract.py) see them: a way to
open a store, to open another on the same data, and to make each fault real; and a real
``redis-server`` (Debian's) on a free loopback port, in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import redis

from pedelec_pyodide.core.store import MemoryStore, Snapshot, SQLiteStore, Store, open_store

#: the fixtures of every backend, and of those that keep what they are given
BACKENDS = ["memory", "sqlite", "redis_backend"]
DURABLE = ["sqlite", "redis_backend"]
WAIT = 10.0  # seconds: the bound on any single wait here


async def read_only(store: SQLiteStore, on: bool) -> None:
    """The store's connection refuses writes (``PRAGMA query_only``), or takes them again;
    on its own thread, between two of the writer's transactions."""
    await store._worker.call(store._db.execute, f"PRAGMA query_only = {'ON' if on else 'OFF'}")


class Backend(ABC):
    @abstractmethod
    def open(self) -> Store: ...

    def reopen(self) -> Store:
        """Another store on the same data, as a restarted Core would open it."""
        return self.open()


class MemoryBackend(Backend):
    def open(self) -> Store:
        return MemoryStore()


class DurableBackend(Backend):
    #: what the store's error says while :meth:`refusing`
    refusal = ""

    @abstractmethod
    def stalled(self) -> contextlib.AbstractContextManager[None]:
        """The store takes no write until the block ends (another process holds it)."""

    @abstractmethod
    def refusing(self, store: Store) -> contextlib.AbstractAsyncContextManager[None]:
        """The store answers every write of ``store`` with an error until the block ends."""

    @abstractmethod
    def damage_request(self, request_id: str) -> None:
        """Spoil a stored request's row behind Core's back (the store is closed)."""


class SQLiteBackend(DurableBackend):
    refusal = "readonly"

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> Store:
        return SQLiteStore(self.path)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        holder = sqlite3.connect(self.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    @contextlib.asynccontextmanager
    async def refusing(self, store: Store) -> AsyncIterator[None]:
        assert isinstance(store, SQLiteStore)
        await read_only(store, True)  # as if the file had turned read-only
        try:
            yield
        finally:
            await read_only(store, False)

    def damage_request(self, request_id: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            db.execute("UPDATE requests SET args = '{' WHERE id = ?", (request_id,))
            db.commit()


def load_file(path: Path) -> Snapshot:
    """What a Core started on the SQLite file ``path`` would load."""
    async def main() -> Snapshot:
        store = SQLiteStore(path)
        try:
            return await store.load()
        finally:
            await store.close()

    return asyncio.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """Debian's ``redis-server`` on a loopback port, its append-only file in ``workdir``
    (``appendfsync everysec``, Redis's default; no RDB snapshots). :meth:`kill` and
    :meth:`start` again keep the port and the data."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is missing: ./scripts/setup.sh installs it")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=WAIT, socket_connect_timeout=WAIT)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.workdir), "--appendonly", "yes", "--appendfsync", "everysec",
             "--save", "", "--daemonize", "no", "--logfile", str(self.workdir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with contextlib.closing(self.client()) as client:
                    if client.ping():
                        return
            except redis.exceptions.RedisError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start: " + (
                        self.workdir / "redis.log").read_text()[-2000:]) from None
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: what Redis had not written to its append-only file is lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.process.kill()
            self.process.wait(WAIT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.kill()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP: connections stay open and nothing is answered until the block ends."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)


class RedisBackend(DurableBackend):
    refusal = "NOREPLICAS"

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def open(self) -> Store:
        return open_store(self.server.url)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        with self.server.paused():
            yield

    @contextlib.asynccontextmanager
    async def refusing(self, store: Store) -> AsyncIterator[None]:
        # a real refusal: Redis takes no write without a replica to copy it to
        with contextlib.closing(self.server.client()) as client:
            client.config_set("min-replicas-to-write", 1)
            try:
                yield
            finally:
                client.config_set("min-replicas-to-write", 0)

    def damage_request(self, request_id: str) -> None:
        with contextlib.closing(self.server.client()) as client:
            (key,) = client.keys("pedelec:main:requests:*")
            assert client.hset(key, request_id, "{") == 0  # replaced, not added
