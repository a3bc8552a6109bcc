"""``pedelec serve`` and ``pedelec demo``: run Core from the command line."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from .. import __version__
from ..protocol import MAX_FRAME_BYTES
from .agents.factory import parse_header
from .config import (
    ADMIN_TOKEN_ENV,
    BURST_SECONDS,
    CLUSTER_SECRET_ENV,
    DEFAULT_PORT,
    MAX_TIMEOUT_MS,
    READ_BURST_SECONDS,
    CoreConfig,
    admin_token_from_env,
    cluster_secret_from_env,
    is_timeout_ms,
)
from .http.public import check_allow_host
from .log import configure
from .page.connection import TURN_WORK
from .server import agent_factory_for, run
from .store import DEFAULT_STORE_TIMEOUT, StoreError, parse_store
from .store.seal import MIN_SECRET_CHARS, check_secret


def _directory(value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: not a directory")
    return path.resolve()


def _port(value: str) -> int:
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a port, 0 to 65535")
    return int(value)


def _provisioned(value: str) -> Path:
    path = _directory(value)
    missing = [name for name in ("pyodide.mjs", "pyodide-lock.json")
               if not (path / name).is_file()]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{value}: no {' or '.join(missing)} there; provision one with "
            f"`python -m pedelec_pyodide.build.provision DIR` (it writes DIR/pyodide)")
    if not _lists_pedelec(path / "pyodide-lock.json"):
        raise argparse.ArgumentTypeError(
            f"{value}: a bare Pyodide runtime (its pyodide-lock.json lists no "
            "pedelec-pyodide), such as the npm package: pages would start without "
            "pedelec-pyodide. Make a provisioned one from it with `python -m "
            f"pedelec_pyodide.build.provision OUT --pyodide {value}` and pass --pyodide "
            "OUT/pyodide")
    return path


def _lists_pedelec(lock: Path) -> bool:
    """The lock is one provisioning wrote (it lists our own wheel)."""
    try:
        packages = json.loads(lock.read_text("utf-8")).get("packages")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(packages, dict) and "pedelec-pyodide" in packages


def _allow_host(value: str) -> str:
    try:
        return check_allow_host(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _deadline(value: str) -> int:
    if not value.isdigit() or not is_timeout_ms(int(value)):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected milliseconds, 1 to {MAX_TIMEOUT_MS} (24 h)")
    return int(value)


def _tool_timeout(value: str) -> tuple[str, int]:
    name, sep, ms = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r}: expected TOOL=MILLISECONDS, e.g. save=60000")
    return name, _deadline(ms)


def _at_least_one(value: str) -> float:
    number = float(_positive(float)(value))
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def _forwarded_allow_ips(value: str) -> tuple[str, ...]:
    """``--forwarded-allow-ips``: comma-separated addresses and networks (uvicorn's
    format: ``10.0.0.5,10.1.0.0/16``), or ``*`` for any peer."""
    items = tuple(item.strip() for item in value.split(","))
    for item in items:
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item[:64]!r}: expected IP addresses or networks, comma-separated "
                "(e.g. 127.0.0.1 or 10.0.0.0/8), or *") from None
    return items


def _store(value: str) -> str:
    """``--store``: a URL that names a backend (the URL itself is not quoted back: it
    may hold a password)."""
    try:
        parse_store(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    expected = "a whole number" if kind is int else "a number"

    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r}: expected {expected}") from None
        if not number > 0 or number == math.inf:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{value!r} must be a positive, finite number")
        return number

    parse.__name__ = kind.__name__
    return parse


def _agent_header(value: str) -> tuple[str, str]:
    try:
        return parse_header(value)
    except ValueError as exc:  # argparse would quote the value: it may be a secret
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--agent-header: ")) from None


def _origin(value: str) -> str:
    """A web origin as browsers send it (``scheme://host[:port]``, no path), or ``*``."""
    if value == "*":
        return value
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        parts = parts._replace(netloc="")
    if (parts.scheme not in ("http", "https") or not parts.hostname
            or parts.path.rstrip("/") or parts.query or parts.fragment or parts.username):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected an origin such as http://127.0.0.1:5173 or "
            "https://app.example (scheme, host and port only), or *")
    return value.rstrip("/")


def _plain(number: float) -> str:
    """A default as the docs write it: 1048576, where ``:g`` would print 1.04858e+06."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _add_common(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to listen on (default: 127.0.0.1, this machine only); "
                        "other machines reach Core only by the names in --allow-host")
    parser.add_argument("--port", type=_port, default=default_port,
                        help=f"port to listen on (default: {default_port}; 0 picks a free one)")
    parser.add_argument("--agent", default="offline",
                        help="the agent running turns: offline (default; no network), "
                        "openai:MODEL, anthropic:MODEL, or ag-ui:URL (your own agent, "
                        "served over AG-UI at URL)")
    parser.add_argument("--agent-header", action="append", default=[], type=_agent_header,
                        metavar="'NAME: VALUE'",
                        help="with --agent ag-ui:URL: a header sent with every run (its "
                        "auth, e.g. 'Authorization: Bearer ...'); repeatable; values are "
                        "never logged")
    parser.add_argument("--store", default="memory", type=_store, metavar="URL",
                        help="where sessions live: memory (default; lost on exit), "
                        "PATH.sqlite or sqlite:PATH (survives restarts of Core), or "
                        "redis://HOST:PORT/DB (shared by the Core processes given it)")
    parser.add_argument("--cluster-secret", metavar="SECRET",
                        help="with a redis:// store: the secret every node of the cluster "
                        "seals its messages to the others with (at least "
                        f"{MIN_SECRET_CHARS} characters); a message not sealed with it is "
                        f"dropped. Prefer ${CLUSTER_SECRET_ENV}: a command line is visible "
                        "to every user of the machine")
    parser.add_argument("--store-timeout", type=_positive(float),
                        default=DEFAULT_STORE_TIMEOUT, metavar="SECONDS",
                        help="how long a tool request waits for the store to commit it; "
                        "past that it fails STORE_FAILED, unsent "
                        f"(default: {_plain(DEFAULT_STORE_TIMEOUT)})")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        type=_origin,
                        help="a web origin (e.g. https://app.example) whose pages may open "
                        "the bridge WebSocket, besides Core's own; repeatable; * allows any")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        type=_allow_host,
                        help="a host name or address clients reach Core by, besides its "
                        "--host, localhost, 127.0.0.1 and [::1]; other Host headers are "
                        "refused (DNS rebinding); repeatable; * allows any")
    parser.add_argument("--forwarded-allow-ips", type=_forwarded_allow_ips, action="append",
                        default=[], metavar="IPS",
                        help="reverse proxies (comma-separated addresses or networks, or *) "
                        "whose X-Forwarded-For names the client; default: none, the peer "
                        "is the client (per-client limits then count a proxy as one client)")
    parser.add_argument("--pyodide", type=_provisioned, metavar="DIR",
                        help="a provisioned Pyodide directory (runtime, wheels and the "
                        "pyodide-lock.json that lists them, as python -m "
                        "pedelec_pyodide.build.provision OUT writes into OUT/pyodide) served "
                        "at /pedelec/pyodide/; default: provision one into the cache on "
                        "first start")
    parser.add_argument("--no-provision", action="store_true",
                        help="without --pyodide, do not provision; /pedelec/pyodide/ "
                        "answers 503 saying what is missing")
    parser.add_argument("--tool-timeout", type=_deadline, default=30_000, metavar="MS",
                        help="deadline of a tool request in milliseconds (default: 30000)")
    parser.add_argument("--tool-timeouts", type=_tool_timeout, action="append", default=[],
                        metavar="TOOL=MS", help="deadline for one tool; repeatable")
    parser.add_argument("--max-total-factor", type=_at_least_one,
                        default=CoreConfig.max_total_factor, metavar="N",
                        help="how far a tool's progress may keep it running past its "
                        "deadline, in multiples of the deadline, unless the caller sets "
                        f"maxTotalMs (default: {_plain(CoreConfig.max_total_factor)})")
    parser.add_argument("--user-wait-limit", type=_positive(float),
                        default=CoreConfig.user_wait_limit, metavar="SECONDS",
                        help="how long a request may wait for the user (an approval, a "
                        "dialog) with its deadline paused, all its waits together "
                        f"(default: {_plain(CoreConfig.user_wait_limit)})")
    parser.add_argument("--max-steps", type=_positive(int), default=8, metavar="N",
                        help="tool-calling steps a turn may take (default: 8)")
    parser.add_argument("--session-ttl", type=_positive(float),
                        default=CoreConfig.session_ttl, metavar="SECONDS",
                        help="how long a disconnected session waits to be resumed before "
                        f"it expires (default: {_plain(CoreConfig.session_ttl)})")
    parser.add_argument("--max-sessions", type=_positive(int), default=CoreConfig.max_sessions,
                        metavar="N", help="sessions Core holds, connected or awaiting a "
                        "resume; when full, the new page's own client's session "
                        "disconnected longest is dropped, and with none the page is refused "
                        f"TOO_MANY_SESSIONS (default: {CoreConfig.max_sessions})")
    parser.add_argument("--max-sessions-per-client", type=_positive(int),
                        default=CoreConfig.max_sessions_per_client, metavar="N",
                        help="sessions one client address (an IPv6 /64) holds, connected or "
                        "awaiting a resume; over it the same as --max-sessions "
                        f"(default: {CoreConfig.max_sessions_per_client})")
    parser.add_argument("--max-metadata-bytes", type=_positive(int),
                        default=CoreConfig.max_metadata_bytes, metavar="N",
                        help="a session's tool metadata and client info, as JSON bytes; "
                        "over it a hello or tools.update is refused METADATA_TOO_LARGE "
                        f"(default: {CoreConfig.max_metadata_bytes})")
    parser.add_argument("--max-queued-bytes", type=_positive(int),
                        default=CoreConfig.max_queued_bytes, metavar="N",
                        help="frames queued for a page that is not reading them; over it "
                        "its connection is closed (1008), its session kept for a resume "
                        f"(default: {CoreConfig.max_queued_bytes})")
    parser.add_argument("--max-queued-total-bytes", type=_positive(int),
                        default=CoreConfig.max_queued_total_bytes, metavar="N",
                        help="frames queued for all connections together; a frame that "
                        "would go over it closes the connection holding the most (1013), "
                        f"its session kept for a resume (default: "
                        f"{CoreConfig.max_queued_total_bytes})")
    parser.add_argument("--pattern-rate", type=_positive(float),
                        default=CoreConfig.pattern_rate, metavar="N",
                        help="characters of regular expressions in tool metadata, new to "
                        "Core, that it checks per second for one client address (a burst "
                        f"of {BURST_SECONDS:g} s of it); more are refused RATE_LIMITED "
                        f"(default: {_plain(CoreConfig.pattern_rate)})")
    parser.add_argument("--metadata-rate", type=_positive(float),
                        default=CoreConfig.metadata_rate, metavar="N",
                        help="characters of tool metadata (hello and tools.update frames) "
                        "Core checks per second for one client address (a burst of "
                        f"{BURST_SECONDS:g} s of it); more are refused RATE_LIMITED "
                        f"(default: {_plain(CoreConfig.metadata_rate)})")
    parser.add_argument("--read-rate", type=_positive(float),
                        default=CoreConfig.read_rate, metavar="N",
                        help="characters of frames Core reads per second from one client "
                        "address, all its connections together (a burst of "
                        f"{READ_BURST_SECONDS:g} s of it; a turn counts {TURN_WORK} times "
                        "its text); past it, Core reads that client's connections more "
                        "slowly, refusing nothing "
                        f"(default: {_plain(CoreConfig.read_rate)})")
    parser.add_argument("--max-pending", type=_positive(int), default=CoreConfig.max_pending,
                        metavar="N", help="tool requests pending at once per session; "
                        "more are answered TOO_MANY_PENDING "
                        f"(default: {CoreConfig.max_pending})")
    parser.add_argument("--max-history-bytes", type=_positive(int),
                        default=CoreConfig.max_history_bytes, metavar="N",
                        help="the agent's history kept per session, as JSON bytes; the "
                        f"oldest turns are dropped first (default: {CoreConfig.max_history_bytes})")
    parser.add_argument("--max-frame-bytes", type=_positive(int), default=MAX_FRAME_BYTES,
                        metavar="N", help=f"largest WebSocket frame (default: {MAX_FRAME_BYTES})")
    parser.add_argument("--header-timeout", type=_positive(float),
                        default=CoreConfig.header_timeout, metavar="SECONDS",
                        help="how long an HTTP request head (a WebSocket's upgrade request "
                        "too) may take to arrive, from the connection's opening or its first "
                        "byte, and a client may leave its response unread; then the "
                        f"connection is closed (default: {_plain(CoreConfig.header_timeout)})")
    parser.add_argument("--rate-limit", type=_positive(float), default=200.0, metavar="N",
                        help="frames per second a connection may send (default: 200)")
    parser.add_argument("--rate-burst", type=_positive(int), default=400, metavar="N",
                        help="frames a connection may send at once (default: 400)")
    parser.add_argument("--hello-timeout", type=_positive(float),
                        default=CoreConfig.hello_timeout, metavar="SECONDS",
                        help="a WebSocket that has not opened its session with a valid hello "
                        "within this is closed (1008), whatever else it sends "
                        f"(default: {_plain(CoreConfig.hello_timeout)})")
    parser.add_argument("--kept-results", type=_positive(int), default=64, metavar="N",
                        help="results of control-API and MCP tool calls kept per session for "
                        "GET .../tool-calls/ID and Idempotency-Key retries, oldest dropped "
                        "first; also the most turns kept per session by their key "
                        "(default: 64)")
    parser.add_argument("--result-retention", type=_positive(float), default=86400.0,
                        metavar="SECONDS", help="how long such a result (a turn's key: "
                        "from the turn's start) is kept (default: 86400, a day)")
    parser.add_argument("--quiet", action="store_true", help="log warnings only")


class _Parser(argparse.ArgumentParser):
    """A usage error in three lines: the short usage, the error, where the options are
    (the whole usage of ``serve`` runs to a dozen lines: that is ``--help``'s)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help explains every "
                     "option)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pedelec", usage="pedelec [--version] {serve,demo,lite} [OPTION ...]",
        description="Core: the server that runs agent turns and relays tool calls to pages. "
        f"The admin token of the control API comes from ${ADMIN_TOKEN_ENV} (never printed), "
        "or is generated and printed at start.",
    )
    parser.add_argument("--version", action="version",
                        version=f"pedelec-pyodide {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", prog="pedelec serve", usage="pedelec serve [--app DIR] [--port N] [OPTION ...]",
        help="run Core (and your app with --app DIR)",
        description="Run Core: the bridge WebSocket, the control API and static files.")
    serve.add_argument("--app", type=_directory, metavar="DIR",
                       help="a web app served at / (index.html for directories)")
    _add_common(serve, default_port=DEFAULT_PORT)
    demo = commands.add_parser(
        "demo", prog="pedelec demo", usage="pedelec demo [--port N] [OPTION ...]",
        help="run Core with the bundled demo app at /",
        description="Run Core with the demo app at /.")
    _add_common(demo, default_port=DEFAULT_PORT)
    lite = commands.add_parser(
        "lite", prog="pedelec lite", usage="pedelec lite DIR [--pyodide PKG]",
        help="build an offline JupyterLite site with pedelec-pyodide in its Pyodide kernel",
        description="Build a JupyterLite site into DIR, clean (DIR is replaced), offline "
        "once the runtime and wheels are cached; serve it with pedelec serve --app DIR. "
        "Needs the lite extra.")
    lite.add_argument("dir", type=Path, metavar="DIR", help="the site's directory")
    lite.add_argument("--pyodide", type=_directory, metavar="PKG",
                      help="the npm package pyodide, unpacked (a node_modules/pyodide "
                      "directory), to take the runtime from instead of running npm; not "
                      "what pedelec serve's --pyodide takes")
    for command in (serve, demo, lite):
        command.set_defaults(command_parser=command)
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[CoreConfig, bool]:
    """The configuration the arguments describe, and whether the token was generated."""
    token, generated = admin_token_from_env()
    cfg = CoreConfig(
        host=args.host, port=args.port, admin_token=token,
        app_dir=getattr(args, "app", None), pyodide_dir=args.pyodide,
        provision=args.pyodide is None and not args.no_provision,
        demo=args.command == "demo", agent=args.agent,
        agent_headers=tuple(args.agent_header), store=args.store,
        store_timeout=args.store_timeout,
        cluster_secret=args.cluster_secret or cluster_secret_from_env(),
        allow_origins=tuple(args.allow_origin), allow_hosts=tuple(args.allow_host),
        forwarded_allow_ips=tuple(ip for ips in args.forwarded_allow_ips for ip in ips),
        max_frame_bytes=args.max_frame_bytes, header_timeout=args.header_timeout,
        rate_limit=args.rate_limit, rate_burst=args.rate_burst,
        hello_timeout=args.hello_timeout,
        tool_timeout_ms=args.tool_timeout, tool_timeouts_ms=dict(args.tool_timeouts),
        user_wait_limit=args.user_wait_limit, max_total_factor=args.max_total_factor,
        max_steps=args.max_steps, session_ttl=args.session_ttl,
        kept_results=args.kept_results, result_retention=args.result_retention,
        max_sessions=args.max_sessions, max_metadata_bytes=args.max_metadata_bytes,
        max_queued_bytes=args.max_queued_bytes, max_pending=args.max_pending,
        max_history_bytes=args.max_history_bytes,
        max_sessions_per_client=args.max_sessions_per_client,
        max_queued_total_bytes=args.max_queued_total_bytes, pattern_rate=args.pattern_rate,
        metadata_rate=args.metadata_rate, read_rate=args.read_rate,
    )
    return cfg, generated


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like ``parser.parse_args``, but an unknown option is reported by the command it was
    given to, with that command's usage (argparse reports it with the top-level usage)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command: argparse.ArgumentParser = args.command_parser
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _closed_streams_to_null() -> None:
    """A standard stream closed as a descriptor when Core started (``>&-``) is None in
    Python, which uvicorn's logging cannot take (and its descriptor would be the next file
    or socket Core opens): it writes to the null device instead, as a stream whose reader
    stops reading does (``announce``)."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 (for good)


def main(argv: Sequence[str] | None = None) -> int:
    _closed_streams_to_null()
    args = parse_args(build_parser(), argv)
    if args.command == "lite":
        from ..build.lite import main as lite_main

        return lite_main(args.dir, args.pyodide)
    cfg, generated = config_from_args(args)
    try:
        cfg.agent_factory = agent_factory_for(cfg)
    except ValueError as exc:
        print(f"pedelec: error: {exc}", file=sys.stderr)
        return 2
    if cfg.cluster_secret is not None:
        try:
            check_secret(cfg.cluster_secret)
        except ValueError as exc:
            print(f"pedelec: error: --cluster-secret (or ${CLUSTER_SECRET_ENV}): {exc}",
                  file=sys.stderr)
            return 2
    spec = parse_store(cfg.store)
    if spec.kind == "sqlite" and not Path(spec.target).parent.is_dir():
        print(f"pedelec: error: --store {cfg.store}: its directory does not exist",
              file=sys.stderr)
        return 2
    configure(30 if args.quiet else 20)

    def announce(url: str) -> None:
        try:
            print(f"pedelec {args.command}: {url}", flush=True)
            if generated:  # one from the environment is never printed: logs keep output
                print(f"admin token (generated; set {ADMIN_TOKEN_ENV} to choose it): "
                      f"{cfg.admin_token}", flush=True)
        except BrokenPipeError:  # whoever started Core stopped reading its output: serve on
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    try:
        run(cfg, announce)
    except KeyboardInterrupt:  # stopped before the server was up (after, it exits cleanly)
        return 0
    except (sqlite3.Error, StoreError) as exc:  # opened before the URL is announced
        print(f"pedelec: error: --store {spec.label}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        hint = (": another process listens there; stop it, or choose another port with "
                "--port N (--port 0 picks a free one)" if exc.errno == errno.EADDRINUSE else "")
        print(f"pedelec: error: cannot listen on {cfg.host}:{cfg.port}: {exc}{hint}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
