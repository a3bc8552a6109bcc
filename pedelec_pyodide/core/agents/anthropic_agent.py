"""``--agent anthropic:MODEL``: Anthropic's Messages API with tools, streamed, through the
official ``anthropic`` SDK. ``ANTHROPIC_API_KEY`` is its key; ``ANTHROPIC_BASE_URL``, when
set, replaces the API's address.

History messages are Messages API messages: ``user`` (text, or ``tool_result`` blocks with
``is_error`` for error results) and ``assistant`` (``text`` and ``tool_use`` blocks).
"""

from __future__ import annotations

import os
from typing import Any, cast

import anthropic

from ...results import is_error_result
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

DEFAULT_BASE_URL = "https://api.anthropic.com"


def _blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


class AnthropicAgent(ModelAgent):
    provider = "anthropic"
    key_env = "ANTHROPIC_API_KEY"

    @classmethod
    def from_env(cls, model: str, settings: ModelSettings | None = None,
                 clock: Clock | None = None) -> AnthropicAgent:
        """The agent configured by ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``."""
        key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
        if not key:
            raise AgentUnavailable(f"agent anthropic:{model} needs ANTHROPIC_API_KEY")
        base_url = os.environ.get("ANTHROPIC_BASE_URL", "").strip() or DEFAULT_BASE_URL
        return cls(model, settings or ModelSettings.from_env(), key, base_url, clock)

    def tool_definitions(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": tool["name"], "description": tool_description(tool),
                 "input_schema": tool_schema(tool)} for tool in tools]

    def user_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def result_messages(self, answered: list[tuple[ModelCall, Any]]) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        for call, result in answered:
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.call_id,
                                     "content": result_text(result)}
            if is_error_result(result):
                block["is_error"] = True
            blocks.append(block)
        return [{"role": "user", "content": blocks}]

    def has_calls(self, message: dict[str, Any]) -> bool:
        content = message.get("content")
        return message.get("role") == "assistant" and isinstance(content, list) and any(
            isinstance(block, dict) and block.get("type") == "tool_use" for block in content)

    def request_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Consecutive messages of one role merged into one (a turn that failed after its
        tool results leaves a user message the next turn's text joins)."""
        merged: list[dict[str, Any]] = []
        for message in messages:
            if merged and merged[-1]["role"] == message["role"]:
                merged[-1] = {"role": message["role"],
                              "content": _blocks(merged[-1]["content"])
                              + _blocks(message["content"])}
            else:
                merged.append(message)
        return merged

    async def answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     say: Say) -> ModelAnswer:
        options: dict[str, Any] = {"tools": tools} if tools else {}
        parts = AnswerParts(self.provider)
        texts: dict[int, list[str]] = {}  # the text blocks' pieces, by index
        usage = Usage()
        async with anthropic.AsyncAnthropic(
            api_key=self._api_key, base_url=self.base_url,
            timeout=self.settings.request_timeout, max_retries=0,
        ) as client:
            stream = await client.messages.create(
                model=self.model, max_tokens=self.settings.max_tokens,
                messages=cast(Any, messages), stream=True, **options)
            async for event in stream:
                if event.type == "message_start":
                    usage.input_tokens = event.message.usage.input_tokens
                    usage.output_tokens = event.message.usage.output_tokens
                elif event.type == "content_block_start":
                    started = event.content_block
                    # a block begun again at an index takes the place of the one before
                    if started.type == "text":
                        parts.calls.pop(event.index, None)
                        texts[event.index] = []
                    elif started.type == "tool_use":
                        texts.pop(event.index, None)
                        begun = parts.begin(event.index)
                        begun.call_id = parts.took(started.id)
                        begun.name.append(parts.took(started.name))
                elif event.type == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta" and event.index in texts:
                        texts[event.index].append(parts.took(delta.text))
                        await say(delta.text)
                    elif delta.type == "input_json_delta" and event.index in parts.calls:
                        parts.calls[event.index].arguments.append(
                            parts.took(delta.partial_json))
                elif event.type == "message_delta":
                    usage.output_tokens = event.usage.output_tokens
        calls = [call.call("") for _, call in sorted(parts.calls.items())]
        await read_calls(calls)
        called = iter(calls)
        content: list[dict[str, Any]] = []
        for index in sorted({*texts, *parts.calls}):
            if index in texts:
                text = "".join(texts[index])
                if text:
                    content.append({"type": "text", "text": text})
                continue
            call = next(called)
            content.append({"type": "tool_use", "id": call.call_id, "name": call.name,
                            "input": call.read.kept})
        message = {"role": "assistant", "content": content} if content else None
        return ModelAnswer(calls, message, usage)

    def failure(self, exc: Exception) -> Failure | None:
        return sdk_failure(self, exc, status_error=anthropic.APIStatusError,
                           timeout_error=anthropic.APITimeoutError,
                           connection_error=anthropic.APIConnectionError,
                           api_error=anthropic.APIError)
