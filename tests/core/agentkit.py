"""Agents without a model: the demo tools, a fake Turn, and a loopback stand-in for the
paid APIs replaying the recorded transcripts in ``transcripts/``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pedelec_pyodide.core.agents.anthropic_agent import AnthropicAgent
from pedelec_pyodide.core.agents.contract import StepLimitExceeded, ToolCallOutcome, ToolCallRequest
from pedelec_pyodide.core.agents.model import ModelAgent, ModelSettings
from pedelec_pyodide.core.agents.openai_agent import OpenAIAgent
from pedelec_pyodide.core.clock import Clock
from pedelec_pyodide.results import tool_error


def schema(properties: dict[str, Any] | None = None, required: list[str] | None = None
           ) -> dict[str, Any]:
    return {"type": "object", "properties": properties or {}, "required": required or []}


DEMO_TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_current_page",
        "description": "Read the current page title and URL.",
        "argsSchema": schema(),
    },
    {
        "name": "update_counter",
        "description": "Add delta to the counter shown on the page and return its new value.",
        "argsSchema": schema(
            {"delta": {"type": "integer", "description": "How much to add"}}, ["delta"]
        ),
    },
    {
        "name": "get_selection",
        "description": "Read the text currently selected in the editor.",
        "argsSchema": schema(),
    },
    {
        "name": "save_document",
        "description": "Save a document with a title and a body.",
        "argsSchema": schema(
            {"title": {"type": "string"}, "body": {"type": "string"}}, ["title", "body"]
        ),
    },
]


class FakeTurn:
    """A Turn as Core gives one, with canned results and Core's step limit."""

    def __init__(
        self,
        text: str,
        tools: list[dict[str, Any]] | None = None,
        *,
        max_steps: int = 10,
        handlers: dict[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        self.turn_id = "turn-1"
        self.session_id = "session-1"
        self.text = text
        self.tools = DEMO_TOOLS if tools is None else tools
        self.history: list[dict[str, Any]] = []
        self.max_steps = max_steps
        self.handlers = demo_handlers() if handlers is None else handlers
        self.batches: list[list[ToolCallRequest]] = []
        self.said: list[str] = []
        self.events: list[str] = []  # "say" and "call" in the order they happened

    async def call_tools(self, calls: list[ToolCallRequest]) -> list[ToolCallOutcome]:
        if len(self.batches) >= self.max_steps:
            raise StepLimitExceeded(f"more than {self.max_steps} steps")
        self.batches.append(list(calls))
        self.events.append("call")
        outcomes: list[ToolCallOutcome] = []
        for call in calls:
            handler = self.handlers.get(call.tool)
            result = (
                handler(call.args) if handler is not None
                else tool_error("TOOL_HANDLER_NOT_FOUND", f"no handler for tool {call.tool!r}")
            )
            outcomes.append(ToolCallOutcome(
                tool_request_id=f"req-{len(self.batches)}-{len(outcomes)}",
                tool=call.tool, args=call.args, result=result,
                handled_by="inline" if handler is not None else "none",
                call_id=call.call_id,
            ))
        return outcomes

    async def say(self, text: str) -> None:
        self.said.append(text)
        self.events.append("say")

    def remember(self, entry: dict[str, Any]) -> None:
        self.history.append(entry)

    @property
    def calls(self) -> list[tuple[str, Any]]:
        return [(call.tool, call.args) for batch in self.batches for call in batch]


TRANSCRIPTS = Path(__file__).parent / "transcripts"


KEY = "sk-test-SECRET-42"


FAST = ModelSettings(request_timeout=5.0, retry_budget=5.0)


def subset(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Where ``actual`` differs from ``expected`` (dicts: only the keys expected)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {actual!r}"]
        return [problem for key, value in expected.items()
                for problem in (subset(value, actual[key], f"{where}.{key}") if key in actual
                                else [f"{where}.{key}: missing"])]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{where}: expected {len(expected)} items, got {actual!r}"]
        return [problem for index, (e, a) in enumerate(zip(expected, actual, strict=True))
                for problem in subset(e, a, f"{where}[{index}]")]
    return [] if expected == actual else [f"{where}: expected {expected!r}, got {actual!r}"]


class StandIn:
    """A loopback HTTP server replaying one transcript, one exchange per request."""

    def __init__(self, transcript: dict[str, Any]) -> None:
        self.provider: str = transcript["provider"]
        self.exchanges: list[dict[str, Any]] = list(transcript["exchanges"])
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "body", "at"}
        self.problems: list[str] = []
        self.stopping = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                stand_in.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}" + ("/v1" if self.provider == "openai" else "")

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", "0"))
        body = json.loads(handler.rfile.read(length) or b"null")
        index = len(self.requests)
        headers = {name.lower(): value for name, value in handler.headers.items()}
        self.requests.append({"path": handler.path, "headers": headers, "body": body,
                              "at": time.monotonic()})
        if index >= len(self.exchanges):
            self.problems.append(f"request {index + 1}: the transcript has no more exchanges")
            return self._json(handler, 500, {"error": {"message": "transcript exhausted"}})
        exchange = self.exchanges[index]
        expected = exchange["request"]
        if handler.path != expected["path"]:
            self.problems.append(f"request {index + 1}: path {handler.path}")
        self.problems.extend(f"request {index + 1}: {p}" for p in subset(expected["body"], body))
        response = exchange["response"]
        if "delay" in response and self.stopping.wait(response["delay"]):
            return None
        if "body" in response:
            return self._json(handler, response["status"], response["body"],
                              response.get("headers", {}))
        handler.send_response(response["status"])
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for event in response["events"]:
            # "pace": seconds between two events (a model that trickles its answer)
            if response.get("pace") and self.stopping.wait(response["pace"]):
                return None
            if self.provider == "openai":
                frame = "data: " + (event if isinstance(event, str) else json.dumps(event))
            else:
                frame = f"event: {event['event']}\ndata: {json.dumps(event['data'])}"
            handler.wfile.write((frame + "\n\n").encode())
            handler.wfile.flush()
        handler.close_connection = True
        return None

    @staticmethod
    def _json(handler: BaseHTTPRequestHandler, status: int, body: Any,
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def messages(self, index: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.requests[index]["body"]["messages"]
        return messages


def agent_for(server: StandIn, settings: ModelSettings = FAST,
              clock: Clock | None = None) -> ModelAgent:
    if server.provider == "openai":
        return OpenAIAgent("test-model", settings, KEY, server.base_url, clock)
    return AnthropicAgent("test-model", settings, KEY, server.base_url, clock)


class Turn(FakeTurn):
    """The fake Turn of the offline agent's tests, with the usage Core collects."""

    def __init__(self, text: str, **options: Any) -> None:
        super().__init__(text, **options)
        self.usage: dict[str, int] = {}


def turn_with(text: str, history: list[dict[str, Any]] | None = None, **options: Any) -> Turn:
    turn = Turn(text, **options)
    if history is not None:
        turn.history = history
    return turn


def run(agent: ModelAgent, turn: Turn) -> str:
    return asyncio.run(asyncio.wait_for(agent.run(turn), 30))


def results_sent(server: StandIn, request: int) -> list[tuple[str, Any, bool]]:
    """(call id, result, is_error) of the tool results in a request's last messages."""
    messages = server.messages(request)
    if server.provider == "openai":
        return [(m["tool_call_id"], json.loads(m["content"]), False)
                for m in messages if m["role"] == "tool"]
    last = messages[-1]["content"]
    return [(b["tool_use_id"], json.loads(b["content"]), b.get("is_error", False))
            for b in last if b["type"] == "tool_result"]


def demo_handlers() -> dict[str, Callable[[Any], Any]]:
    counter = {"value": 0}

    def update_counter(args: Any) -> Any:
        counter["value"] += args["delta"]
        return {"value": counter["value"]}

    return {
        "get_current_page": lambda args: {"title": "Demo", "url": "http://127.0.0.1:8765/"},
        "update_counter": update_counter,
        "get_selection": lambda args: {"text": "selected words"},
        "save_document": lambda args: tool_error(
            "TOOL_HANDLER_ERROR", "ZeroDivisionError: division by zero"
        ),
    }
