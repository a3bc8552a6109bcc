"""Run a page of the docs as written: its code blocks, in order, in a fresh directory.

What each fenced block is comes from an HTML comment on the line just before it
(``<!-- doc: KIND ARG -->``), or, without one, from its language:

- ``file PATH``: the block is the file PATH of the reader's project (relative to the
  directory the last ``run`` block ended in, as in one terminal);
- ``run`` (the default for ``sh``/``bash`` blocks): shell commands, run with bash;
  variables and the working directory carry over to the next block, as in one terminal;
  they must succeed;
- ``output``: what the previous ``run`` block printed (``...`` matches anything);
- ``background URL``: a server, started in the background until URL answers (stopped at
  the end of the page);
- ``project NAME [from DOC]`` (a line of its own, not before a block): from here on, a
  fresh directory NAME (with the ``file`` blocks of docs/DOC in it, when given);
- a ``python`` block with no comment is run as a script by the project's
  ``.venv/bin/python``, a ``js`` block by ``node`` as an ES module;
- ``not run: REASON``: not run by the tests, for the REASON given (a real model's key,
  other machines, a fragment whose whole is tested elsewhere: say where); such a block
  is still parsed (Python, JavaScript, shell, JSON, TOML).

Any other block with no comment is an error: every block is run, or says why not.

Ports and paths are the reader's: the runner replaces Core's port 8765, the app's 3000 and
the test kit's 8790 with free ones, and ``/path/to/pedelec-pyodide`` with this checkout.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
WAIT = 30.0  # seconds: the bound on a server's start
STEP_WAIT = 300.0  # seconds: the bound on one run block (an install, a Playwright run)
#: the reader's ports, replaced by free ones: Core, an app's own server, the test kit's Core
PORTS = ("8765", "3000", "8790")
CHECKOUT = "/path/to/pedelec-pyodide"
KINDS = ("file", "run", "output", "background", "project", "not run:")
MARKER = re.compile(r"<!-- doc: (file|run|output|background|project|not run:)\s*(.*?)\s*-->")
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL = ("sh", "bash", "shell")
MIN_REASON_CHARS = 12


class DocError(AssertionError):
    """The page does not run as written (the message says where and why)."""


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    kind: str
    arg: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc`` with what it is, and its ``project`` markers (a block
    with no text), in order; an unmarked block that cannot run, or a marker with no block
    under it, is a :class:`DocError`."""
    text = doc.read_text(encoding="utf-8")
    where = doc.relative_to(REPO)

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    found: list[tuple[int, Block]] = []
    used: set[int] = set()
    for fence in FENCE.finditer(text):
        line = line_of(fence.start())
        lang = fence[1].strip().split()[0] if fence[1].strip() else ""
        before = text[:fence.start()].rstrip("\n")
        start = before.rfind("\n") + 1
        marker = MARKER.fullmatch(before[start:].strip())
        if marker is not None and marker[1] != "project":
            used.add(start + before[start:].index("<!--"))
            kind, arg = marker[1], marker[2]
        elif lang in SHELL:
            kind, arg = "run", ""
        elif lang in ("python", "js"):
            kind, arg = lang, ""
        else:
            raise DocError(f"{where}:{line}: a ```{lang} block with no <!-- doc: ... --> "
                           "before it: say what it is (file PATH, output, or not run: REASON)")
        if kind == "not run:" and len(arg) < MIN_REASON_CHARS:
            raise DocError(f"{where}:{line}: 'not run:' needs a reason")
        found.append((fence.start(), Block(doc, line, lang, kind, arg, fence[2])))
    for marker in MARKER.finditer(text):
        if marker[1] == "project":
            found.append((marker.start(), Block(doc, line_of(marker.start()), "", "project",
                                                marker[2], "")))
        elif marker.start() not in used:
            raise DocError(f"{where}:{line_of(marker.start())}: {marker[0]} is not just "
                           "before a fenced block")
    return [block for _, block in sorted(found, key=lambda item: item[0])]


# --- blocks that are not run are still parsed ------------------------------------------------

IPYTHON_MAGIC = re.compile(r"^\s*[%!].*$", re.M)


def check_parses(block: Block) -> None:
    """A block that is not run still has to parse in its language (where we can tell)."""
    text = block.text
    try:
        if block.lang == "python":  # a notebook cell may await at the top, and use %pip
            compile(IPYTHON_MAGIC.sub("pass", text), block.where, "exec",
                    flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        elif block.lang == "json":
            json.loads(text)
        elif block.lang == "toml":
            tomllib.loads(text)
        elif block.lang in SHELL:
            _tool_parses(["bash", "-n"], text, block)
        elif block.lang == "js":
            _tool_parses(["node", "--check", "--input-type=module"], text, block)
    except (SyntaxError, ValueError) as exc:
        raise DocError(f"{block.where}: this {block.lang} block does not parse: {exc}") from None


def _tool_parses(command: list[str], text: str, block: Block) -> None:
    if shutil.which(command[0]) is None:
        return
    done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=30,
                          check=False)
    if done.returncode != 0:
        raise DocError(f"{block.where}: this {block.lang} block does not parse:\n"
                       f"{done.stderr[-2000:]}")


# --- running a page -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def matches(expected: str, actual: str) -> bool:
    """``expected`` with ``...`` for any text, against ``actual`` (ends trimmed)."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


def dependencies_dir(into: Path) -> Path:
    """A directory that shows the distributions of this test's environment, all but
    pedelec-pyodide itself: on ``PYTHONPATH``, a page's ``pip install`` of the checkout
    finds its requirements installed (no index needed but for the build backend) and
    installs pedelec-pyodide from the checkout, as a reader's would."""
    deps = into / "site-packages"
    deps.mkdir(parents=True, exist_ok=True)
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        name = entry.name.lower().replace("-", "_").lstrip("_")
        if not name.startswith(("pedelec_pyodide", "editable_impl_pedelec_pyodide")):
            (deps / entry.name).symlink_to(entry)
    return deps


@dataclass
class Terminal:
    """One reader's terminal: its working directory, its variables, its servers."""

    cwd: Path
    env: dict[str, str]
    logs: Path
    output: str | None = None
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def substitute(self, text: str, ports: dict[str, int]) -> str:
        for reader, port in ports.items():
            text = re.sub(rf"\b{reader}\b", str(port), text)
        return text.replace(CHECKOUT, str(REPO))

    def write(self, text: str, arg: str) -> None:
        path = self.cwd / arg
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")

    def run(self, block: Block, script: str) -> None:
        dump = self.logs / "terminal.env"
        here = self.logs / "terminal.cwd"
        shell = subprocess.Popen(
            ["bash", "-c", f'set -euo pipefail -a\n{script}\nenv -0 > "{dump}"; pwd > "{here}"'],
            cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        try:
            stdout, stderr = shell.communicate(timeout=STEP_WAIT)
        except subprocess.TimeoutExpired:
            stop(shell)
            raise DocError(f"{block.where}: this step did not finish within {STEP_WAIT} s:\n"
                           f"{script}") from None
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        if shell.returncode != 0:
            raise DocError(f"{block.where}: this step failed ({shell.returncode}):\n{script}\n"
                           f"stdout: {out[-3000:]}\nstderr: {err[-3000:]}")
        self.env = dict(item.split("=", 1) for item in dump.read_text().split("\0")
                        if "=" in item)
        self.cwd = Path(here.read_text().strip())
        self.output = out

    def check_output(self, block: Block, expected: str) -> None:
        if self.output is None:
            raise DocError(f"{block.where}: an output block before any run block")
        if not matches(expected, self.output):
            raise DocError(f"{block.where}: the page shows:\n{expected}\n"
                           f"the command printed:\n{self.output}")
        self.output = None

    def start(self, block: Block, script: str, url: str) -> None:
        log = self.logs / f"server-{len(self.servers)}.log"
        with log.open("wb") as out:
            server = subprocess.Popen(["bash", "-c", script], cwd=self.cwd, env=self.env,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.servers.append(server)
        with httpx.Client(timeout=2.0) as http:
            for _ in range(int(WAIT / 0.2)):
                if server.poll() is not None:
                    raise DocError(f"{block.where}: the server for {url} exited "
                                   f"({server.returncode}):\n{log.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(url).status_code == 200:
                        return
                time.sleep(0.2)
        raise DocError(f"{block.where}: {url} did not answer within {WAIT} s:\n"
                       f"{log.read_text()[-3000:]}")

    def stop(self) -> None:
        for server in self.servers:
            stop(server)
        self.servers.clear()


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started in its own session, and whatever it started."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def reader_env(deps: Path) -> dict[str, str]:
    """The environment a page's commands run in: this one without the test's own settings,
    with ``deps`` on ``PYTHONPATH`` (see :func:`dependencies_dir`)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PEDELEC_", "PYTEST_", "VIRTUAL_ENV", "PYTHON"))}
    env["PYTHONPATH"] = str(deps)
    # what PYTHONPATH cannot show: those distributions' data files (JupyterLite's kernel)
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    env["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"  # Debian's chromium, never a download
    env["npm_config_prefer_offline"] = "true"
    env["npm_config_audit"] = env["npm_config_fund"] = "false"
    env["CI"] = ""  # Playwright's own CI mode would change its retries and reporter
    return env


def file_blocks(doc: Path) -> Iterator[Block]:
    return (block for block in blocks(doc) if block.kind == "file")


def run_doc(doc: Path, root: Path, deps: Path, *, venv: Path | None = None,
            ports: dict[str, int] | None = None,
            started: Callable[[str, Path], None] | None = None) -> list[Block]:
    """Run ``doc`` in a fresh directory under ``root``; returns the blocks it ran.
    ``venv``: the ``.venv`` of every project the page makes (else the page makes its own);
    ``ports``: the free port for each of :data:`PORTS`; ``started(url, cwd)``: called once
    a ``background`` server answers at ``url`` (ports replaced), started in ``cwd``."""
    ports = ports or {reader: free_port() for reader in PORTS}
    logs = root / ".logs"
    logs.mkdir(parents=True)
    terminal = Terminal(cwd=root / "project", env=reader_env(deps), logs=logs)

    def enter(directory: Path) -> None:
        directory.mkdir()
        if venv is not None:
            (directory / ".venv").symlink_to(venv)
        terminal.cwd = directory

    enter(root / "project")
    ran: list[Block] = []
    try:
        for block in blocks(doc):
            text, arg = (terminal.substitute(block.text, ports),
                         terminal.substitute(block.arg, ports))
            if block.kind == "not run:":
                check_parses(block)
                continue
            if block.kind == "file":
                terminal.write(text, arg)
            elif block.kind == "run":
                terminal.run(block, text)
            elif block.kind == "output":
                terminal.check_output(block, text)
            elif block.kind == "background":
                terminal.start(block, text, arg)
                if started is not None:
                    started(arg, terminal.cwd)
            elif block.kind == "project":
                name, _, source = arg.partition(" from ")
                enter(root / name.strip())
                for seed in file_blocks(DOCS / source.strip()) if source else ():
                    terminal.write(terminal.substitute(seed.text, ports),
                                   terminal.substitute(seed.arg, ports))
            elif block.kind == "python":
                python = terminal.cwd / ".venv" / "bin" / "python"
                terminal.run(block, f"{python} - <<'PEDELEC_DOC_PYTHON'\n{text}\n"
                                    "PEDELEC_DOC_PYTHON")
            else:  # js
                terminal.run(block, f"node --input-type=module <<'PEDELEC_DOC_JS'\n{text}\n"
                                    "PEDELEC_DOC_JS")
            ran.append(block)
    finally:
        terminal.stop()
    return ran


def same_python_as_tests() -> bool:
    """The pages' ``python3`` is this test's Python version (the dependencies shown to it
    hold compiled extensions for this one)."""
    found = shutil.which("python3")
    if found is None:
        return False
    shown = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=30, check=False).stdout
    return shown.strip() == str(sys.version_info[:2])
