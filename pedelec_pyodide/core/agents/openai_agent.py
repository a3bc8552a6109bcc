"""``--agent openai:MODEL``: OpenAI's Chat Completions API with tools, streamed, through the
official ``openai`` SDK. ``OPENAI_BASE_URL`` points it at any OpenAI-compatible server
(Ollama, vLLM, llama.cpp's server); ``OPENAI_API_KEY`` is its key (a local server at
``OPENAI_BASE_URL`` may need none).

History messages are Chat Completions messages: ``user``, ``assistant`` (with
``tool_calls``), and ``tool`` (``tool_call_id``, the result's JSON as ``content``).
"""

from __future__ import annotations

import os
from typing import Any, cast

import openai

from ..clock import Clock
from .model import (
    AgentUnavailable,
    AnswerParts,
    Failure,
    ModelAgent,
    ModelAnswer,
    ModelCall,
    ModelSettings,
    Say,
    Usage,
    read_calls,
    result_text,
    sdk_failure,
    tool_description,
    tool_schema,
)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: sent as the key to a server at ``OPENAI_BASE_URL`` when ``OPENAI_API_KEY`` is not set
NO_KEY = "no-key"


class OpenAIAgent(ModelAgent):
    provider = "openai"
    key_env = "OPENAI_API_KEY"

    @classmethod
    def from_env(cls, model: str, settings: ModelSettings | None = None,
                 clock: Clock | None = None) -> OpenAIAgent:
        """The agent configured by ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``."""
        key = os.environ.get("OPENAI_API_KEY", "").strip()
        base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
        if not key and not base_url:
            raise AgentUnavailable(
                f"agent openai:{model} needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local "
                "OpenAI-compatible server such as Ollama: http://127.0.0.1:11434/v1)")
        return cls(model, settings or ModelSettings.from_env(), key or NO_KEY,
                   base_url or DEFAULT_BASE_URL, clock)

    def tool_definitions(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {
                "name": tool["name"], "description": tool_description(tool),
                "parameters": tool_schema(tool)}}
            for tool in tools
        ]

    def user_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def result_messages(self, answered: list[tuple[ModelCall, Any]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call.call_id, "content": result_text(result)}
                for call, result in answered]

    def has_calls(self, message: dict[str, Any]) -> bool:
        return bool(message.get("tool_calls"))

    async def answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     say: Say) -> ModelAnswer:
        options: dict[str, Any] = {"tools": tools} if tools else {}
        text: list[str] = []
        parts = AnswerParts(self.provider)
        usage = Usage()
        async with openai.AsyncOpenAI(
            api_key=self._api_key, base_url=self.base_url,
            timeout=self.settings.request_timeout, max_retries=0,
        ) as client:
            stream = await client.chat.completions.create(
                model=self.model, messages=cast(Any, messages), stream=True,
                stream_options={"include_usage": True}, **options)
            async for chunk in stream:
                if chunk.usage is not None:
                    usage.input_tokens = chunk.usage.prompt_tokens
                    usage.output_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    if delta.content:
                        text.append(parts.took(delta.content))
                        await say(delta.content)
                    for piece in delta.tool_calls or ():
                        call = parts.call(piece.index)
                        if piece.id:
                            call.call_id = parts.took(piece.id)
                        if piece.function is not None:
                            call.name.append(parts.took(piece.function.name or ""))
                            call.arguments.append(parts.took(piece.function.arguments or ""))
        calls = [call.call(f"call_{index}") for index, call in sorted(parts.calls.items())]
        content = "".join(text)
        if not content and not calls:
            return ModelAnswer(calls, None, usage)
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            await read_calls(calls)
            message["tool_calls"] = [
                {"id": call.call_id, "type": "function", "function": {
                    "name": call.name, "arguments": call.read.kept_text}}
                for call in calls
            ]
        return ModelAnswer(calls, message, usage)

    def failure(self, exc: Exception) -> Failure | None:
        return sdk_failure(self, exc, status_error=openai.APIStatusError,
                           timeout_error=openai.APITimeoutError,
                           connection_error=openai.APIConnectionError,
                           api_error=openai.APIError)
