"""Record ag_ui_langgraph.json: two AG-UI runs of a LangGraph agent served by
``ag-ui-langgraph``, offline (a fake chat model), as Core would make them: the first
calls the page's ``update_counter``, the second answers from its result.

Not part of the test extra (LangGraph is not a dependency); in a virtualenv of its own:

    python -m venv /tmp/lg && /tmp/lg/bin/pip install ag-ui-langgraph fastapi uvicorn
    /tmp/lg/bin/python tests/core/transcripts/record_ag_ui_langgraph.py
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import uvicorn
from ag_ui_langgraph import LangGraphAgent, add_langgraph_fastapi_endpoint
from fastapi import FastAPI
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.checkpoint.memory import MemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

OUT = Path(__file__).with_name("ag_ui_langgraph.json")
CALL_ID = "call_lg_1"
TOOL = {"name": "update_counter", "description": "Add delta to the counter.",
        "parameters": {"type": "object", "properties": {"delta": {"type": "integer"}},
                       "required": ["delta"], "additionalProperties": False}}


class FakeModel(BaseChatModel):
    """Calls the first frontend tool with ``{"delta": 2}``, then answers from its result;
    streamed as a model streams: words, then the call's name, then its args in pieces."""

    tool: str = ""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            value = json.loads(str(last.content))["value"]
            return AIMessage(content=f"The counter is now {value}.")
        return AIMessage(content="Adding two.", tool_calls=[
            {"name": self.tool, "args": {"delta": 2}, "id": CALL_ID}])

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    def _stream(self, messages: list[BaseMessage], stop: Any = None,
                run_manager: Any = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        reply = self._reply(messages)
        message_id = f"lc-{len(messages)}"  # one id per answer, as a provider's
        pieces: list[AIMessageChunk] = [AIMessageChunk(content=word + " ", id=message_id)
                                        for word in str(reply.content).split(" ")]
        for call in reply.tool_calls:
            args = json.dumps(call["args"])
            pieces += [AIMessageChunk(content="", id=message_id, tool_call_chunks=[chunk])
                       for chunk in (
                           {"name": call["name"], "args": "", "id": call["id"], "index": 0},
                           {"name": None, "args": args[:5], "id": None, "index": 0},
                           {"name": None, "args": args[5:], "id": None, "index": 0})]
        for piece in pieces:
            chunk = ChatGenerationChunk(message=piece)
            if run_manager:
                run_manager.on_llm_new_token(str(piece.content), chunk=chunk)
            yield chunk

    @property
    def _llm_type(self) -> str:
        return "fake"


class State(MessagesState):
    tools: list[Any]


async def chat(state: State) -> dict[str, Any]:
    tools = state.get("tools") or []
    model = FakeModel(tool=tools[0]["name"] if tools else "none")
    return {"messages": [await model.ainvoke(state["messages"])]}


def app() -> FastAPI:
    graph = StateGraph(State)
    graph.add_node("chat", chat)
    graph.add_edge(START, "chat")
    graph.add_edge("chat", END)
    served = FastAPI()
    agent = LangGraphAgent(name="counter", graph=graph.compile(checkpointer=MemorySaver()))
    add_langgraph_fastapi_endpoint(served, agent, "/agent")
    return served


def post(url: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Accept": "text/event-stream"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app(), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/agent"
    user = {"id": "u1", "role": "user", "content": "add two"}
    first = {"threadId": "thread-1", "runId": "run-1", "messages": [user], "tools": [TOOL],
             "context": [], "state": {}, "forwardedProps": {}}
    runs = [{"request": first, "stream": post(url, first)}]
    events = [json.loads(line[6:]) for line in runs[0]["stream"].splitlines()
              if line.startswith("data: ")]
    started = next(event for event in events if event["type"] == "TOOL_CALL_START")
    # what Core sends back: the agent's own message id, the call's args joined
    assistant = {"id": started["parentMessageId"], "role": "assistant", "content": "".join(
        event["delta"] for event in events if event["type"] == "TEXT_MESSAGE_CONTENT"),
        "toolCalls": [{"id": started["toolCallId"], "type": "function", "function": {
            "name": started["toolCallName"], "arguments": "".join(
                event["delta"] for event in events if event["type"] == "TOOL_CALL_ARGS")}}]}
    result = {"id": f"{CALL_ID}-result", "role": "tool", "toolCallId": CALL_ID,
              "content": '{"value": 2}'}
    second = {**first, "runId": "run-2", "messages": [user, assistant, result]}
    runs.append({"request": second, "stream": post(url, second)})
    server.should_exit = True
    thread.join(10)
    OUT.write_text(json.dumps({
        "recorded": time.strftime("%Y-%m-%d"),
        "versions": {name: version(name) for name in (
            "ag-ui-langgraph", "ag-ui-protocol", "langgraph", "langchain-core")},
        "call_id": CALL_ID, "runs": runs}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
