"""Anthropic adapter (official ``anthropic`` SDK, Messages API).

Tool use, streaming, extended thinking (thinking blocks are replayed verbatim so their
signatures survive tool turns) and prompt caching (``cache_control`` on the system prompt
and the tool list).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from stepstone.exceptions import MissingExtraError, UserError
from stepstone.providers._base import (
    Provider,
    RetryInfo,
    SDKClientMixin,
    StreamItem,
    retry_after_from_headers,
    status_retryable,
)
from stepstone.providers._types import (
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ToolCall,
    Usage,
)

__all__ = ["AnthropicProvider"]

_NATIVE: dict[NativeTool, dict[str, Any]] = {
    NativeTool.WEB_SEARCH: {"type": "web_search_20250305", "name": "web_search"},
    NativeTool.WEB_FETCH: {"type": "web_fetch_20250910", "name": "web_fetch"},
    NativeTool.CODE_EXECUTION: {"type": "code_execution_20250825", "name": "code_execution"},
}


def _import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError as exc:  # pragma: no cover - the dev venv has the SDK
        raise MissingExtraError("anthropic", "anthropic") from exc
    return anthropic


def _schema_instruction(request: ModelRequest) -> str:
    return (
        "When you give your final answer, reply with only a JSON value (no prose, no code "
        "fence) that matches this JSON schema:\n" + json.dumps(request.output_schema)
    )


class AnthropicProvider(SDKClientMixin, Provider):
    """Claude through the official ``anthropic`` SDK (``pip install stepstone[anthropic]``).

    Args:
        api_key: Defaults to ``ANTHROPIC_API_KEY``.
        base_url: Defaults to ``ANTHROPIC_BASE_URL``, else Anthropic's endpoint.
        max_tokens: Output cap per turn (the API requires one; default 4096, or 16000 with
            thinking).
        strict_native_tools: Raise instead of warning when a native tool is unsupported.
        client_options: Passed to ``anthropic.AsyncAnthropic``.
    """

    name = "anthropic"
    tiers: ClassVar[dict[str, str]] = {
        "top": "claude-opus-4-6",
        "medium": "claude-sonnet-4-6",
        "cheap": "claude-haiku-4-5",
    }
    native_tools_supported: ClassVar[frozenset[NativeTool]] = frozenset(_NATIVE)
    api_key_envs = ("ANTHROPIC_API_KEY",)
    base_url_env = "ANTHROPIC_BASE_URL"
    default_base_url = "https://api.anthropic.com"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        strict_native_tools: bool = False,
        **client_options: Any,
    ) -> None:
        self._anthropic = _import_anthropic()
        self._configure(
            api_key=api_key,
            base_url=base_url,
            max_tokens=max_tokens,
            strict_native_tools=strict_native_tools,
        )
        self._client_options = client_options

    def _build_client(self) -> Any:
        api_key = self._resolve_api_key()
        # The engine owns retries and deadlines, so the SDK's own are turned off.
        return self._anthropic.AsyncAnthropic(
            api_key=api_key, base_url=self.base_url, max_retries=0, **self._client_options
        )

    # -- request ---------------------------------------------------------------------------

    def _message(self, m: Message) -> dict[str, Any]:
        if m.role == "user":
            return {"role": "user", "content": m.text}
        if m.role == "tool":
            return {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": r.call_id,
                        "content": r.content,
                        "is_error": r.is_error,
                    }
                    for r in m.tool_results
                ],
            }
        if m.raw_provider == self.name and m.raw is not None:
            # Invalid tool-call JSON cannot be sent back as a tool_use input; the loop has
            # already told the model about it in the tool result.
            return {
                "role": "assistant",
                "content": [
                    {**b, "input": {}}
                    if b.get("type") == "tool_use" and not isinstance(b.get("input"), dict)
                    else b
                    for b in m.raw
                ],
            }
        blocks: list[dict[str, Any]] = []
        if m.text:
            blocks.append({"type": "text", "text": m.text})
        for c in m.tool_calls:
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
        return {"role": "assistant", "content": blocks or ""}

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        system = request.system or ""
        if request.output_schema is not None:
            system = (system + "\n\n" if system else "") + _schema_instruction(request)
        thinking = request.thinking
        max_tokens = request.max_tokens or self.max_tokens or (16000 if thinking else 4096)
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": max_tokens,
            "messages": [self._message(m) for m in request.messages],
        }
        cache = (
            {"type": "ephemeral", "ttl": request.cache.ttl}
            if request.cache is not None and request.cache.enabled
            else None
        )
        if system:
            if cache is not None:
                params["system"] = [{"type": "text", "text": system, "cache_control": cache}]
            else:
                params["system"] = system
        tools: list[dict[str, Any]] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        for native in request.native_tools:
            spec = _NATIVE.get(native)
            if spec is None:
                message = f"anthropic has no native tool {native.value!r}; it was not sent"
                if self.strict_native_tools:
                    raise UserError(message)
                warnings.warn(message, UserWarning, stacklevel=4)
            else:
                tools.append(dict(spec))
        if tools:
            if cache is not None:
                tools[-1] = {**tools[-1], "cache_control": cache}
            params["tools"] = tools
            if request.tools:
                # Thinking only allows "auto"; forcing a tool would be rejected.
                forced = request.tool_choice == "required" and thinking is None
                params["tool_choice"] = {"type": "any" if forced else "auto"}
        if thinking is not None:
            config: dict[str, Any]
            if thinking.budget_tokens is not None:
                config = {"type": "enabled", "budget_tokens": thinking.budget_tokens}
            else:
                config = {"type": "adaptive"}
            if thinking.display is not None:
                config["display"] = thinking.display
            params["thinking"] = config
            if thinking.effort is not None:
                params["output_config"] = {"effort": thinking.effort}
        elif request.temperature is not None:
            # This SDK's create() has no temperature argument; the API still takes it.
            params["extra_body"] = {"temperature": request.temperature}
        return params

    # -- response --------------------------------------------------------------------------

    @staticmethod
    def _usage(data: dict[str, Any] | None) -> Usage:
        data = data or {}
        return Usage(
            input_tokens=int(data.get("input_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
            cache_read_tokens=int(data.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(data.get("cache_creation_input_tokens") or 0),
        )

    @staticmethod
    def _calls_and_text(blocks: list[dict[str, Any]]) -> tuple[str, list[ToolCall], str]:
        text: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                text.append(block.get("text") or "")
            elif kind == "thinking":
                thinking.append(block.get("thinking") or "")
            elif kind == "tool_use":
                raw_input = block.get("input")
                if isinstance(raw_input, dict):
                    calls.append(ToolCall(id=block["id"], name=block["name"], arguments=raw_input))
                else:
                    calls.append(
                        ToolCall(
                            id=block["id"],
                            name=block["name"],
                            raw_arguments=raw_input
                            if isinstance(raw_input, str)
                            else json.dumps(raw_input),
                        )
                    )
        return "".join(text), calls, "".join(thinking)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        client = await self._get_client()
        message = await client.messages.create(**self._params(request))
        if isinstance(message, str):
            raise ValueError(f"anthropic returned a non-JSON body: {message[:200]!r}")
        data = message.model_dump(exclude_none=True, warnings=False)
        blocks = data.get("content") or []
        text, calls, thinking = self._calls_and_text(blocks)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=self._usage(data.get("usage")),
            stop_reason=data.get("stop_reason"),
            model=data.get("model"),
            thinking=thinking,
            raw=blocks,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        client = await self._get_client()
        stream = await client.messages.create(**self._params(request), stream=True)
        blocks: dict[int, dict[str, Any]] = {}
        partial_json: dict[int, list[str]] = {}
        usage = Usage()
        stop: str | None = None
        model: str | None = None
        try:
            async for event in stream:
                data = event.model_dump(exclude_none=True, warnings=False)
                kind = data.get("type")
                piece = ""
                if kind == "message_start":
                    message = data.get("message") or {}
                    model = message.get("model")
                    usage = self._usage(message.get("usage"))
                elif kind == "content_block_start":
                    blocks[int(data["index"])] = dict(data.get("content_block") or {})
                elif kind == "content_block_delta":
                    index = int(data["index"])
                    block = blocks.setdefault(index, {"type": "text", "text": ""})
                    delta = data.get("delta") or {}
                    dtype = delta.get("type")
                    if dtype == "text_delta":
                        piece = delta.get("text") or ""
                        block["text"] = block.get("text", "") + piece
                    elif dtype == "input_json_delta":
                        partial_json.setdefault(index, []).append(delta.get("partial_json") or "")
                    elif dtype == "thinking_delta":
                        block["thinking"] = block.get("thinking", "") + (
                            delta.get("thinking") or ""
                        )
                    elif dtype == "signature_delta":
                        block["signature"] = delta.get("signature") or ""
                elif kind == "message_delta":
                    stop = (data.get("delta") or {}).get("stop_reason") or stop
                    out = (data.get("usage") or {}).get("output_tokens")
                    if out is not None:
                        usage.output_tokens = int(out)
                yield piece
        finally:
            await stream.close()
        ordered = []
        for index in sorted(blocks):
            block = blocks[index]
            if block.get("type") in ("tool_use", "server_tool_use") and index in partial_json:
                raw = "".join(partial_json[index])
                try:
                    block["input"] = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    block["input"] = raw
            ordered.append(block)
        text, calls, thinking = self._calls_and_text(ordered)
        yield ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            stop_reason=stop,
            model=model,
            thinking=thinking,
            raw=ordered,
        )

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """429 / 408 / 409 / 5xx / 529 (honouring ``retry-after``) and network errors retry."""
        anthropic = self._anthropic
        if isinstance(exc, anthropic.APIStatusError):
            return RetryInfo(
                status_retryable(exc.status_code), retry_after_from_headers(exc.response.headers)
            )
        if isinstance(exc, anthropic.APIConnectionError):
            return RetryInfo(True)
        return super().retry_info(exc)
