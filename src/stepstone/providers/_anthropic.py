"""Anthropic adapter (official ``anthropic`` SDK, Messages API).

Tool use, streaming, extended thinking (thinking blocks are replayed verbatim so their
signatures survive tool turns) and prompt caching (``cache_control`` on the system prompt
and the tool list).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from stepstone.exceptions import MissingExtraError, UserError
from stepstone.providers._base import (
    NOT_JSON_TYPE,
    IncompleteStream,
    Provider,
    RetryInfo,
    SDKClientMixin,
    StreamItem,
    classify,
    invalid_response,
    json_body,
    shared_ssl_context,
    transport_info,
)
from stepstone.providers._types import (
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ThinkingConfig,
    ToolCall,
    Usage,
)

__all__ = ["AnthropicProvider"]

_NATIVE: dict[NativeTool, dict[str, Any]] = {
    NativeTool.WEB_SEARCH: {"type": "web_search_20250305", "name": "web_search"},
    NativeTool.WEB_FETCH: {"type": "web_fetch_20250910", "name": "web_fetch"},
    NativeTool.CODE_EXECUTION: {"type": "code_execution_20250825", "name": "code_execution"},
}


#: Anthropic's stop reasons -> the normalised ones (``ModelResponse.stop_reason``).
STOP_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
    "pause_turn": "pause",
}

#: Anthropic error types (HTTP bodies and ``event: error`` stream events) -> error kinds.
ERROR_KINDS: dict[str, str] = {
    "overloaded_error": "overloaded",
    "rate_limit_error": "rate_limit",
    "api_error": "server",
    "timeout_error": "timeout",
    "invalid_request_error": "bad_request",
    "request_too_large": "bad_request",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "auth",
    "not_found_error": "not_found",
}

#: Efforts Anthropic does not take -> the nearest one it does.
_EFFORTS = {"minimal": "low"}

#: Above this output cap the SDK refuses a non-streamed request; complete() streams then.
_NONSTREAMING_MAX_TOKENS = 21_333


def _normal_stop(raw: str | None) -> str | None:
    return None if raw is None else STOP_REASONS.get(raw, "other")


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
        options = dict(self._client_options)
        if "http_client" not in options:
            options["http_client"] = self._anthropic.DefaultAsyncHttpxClient(
                verify=shared_ssl_context()
            )
        # The engine owns retries and deadlines, so the SDK's own are turned off.
        return self._anthropic.AsyncAnthropic(
            api_key=api_key, base_url=self.base_url, max_retries=0, **options
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

    def _native_format(self, request: ModelRequest) -> dict[str, Any] | None:
        """Native structured output (``output_config.format``), None where unsupported."""
        if request.output_schema is None or not self.native_output(request.model):
            return None
        try:  # the SDK's own transformation to the subset its structured output accepts
            from anthropic.lib._parse._transform import transform_schema
        except ImportError:  # pragma: no cover - an SDK without it: the instruction instead
            return None
        return {"type": "json_schema", "schema": transform_schema(request.output_schema)}

    @staticmethod
    def native_output(model: str) -> bool:
        """Whether ``model`` takes ``output_config.format`` (Claude 4.5 and later)."""
        legacy = ("claude-3", "claude-opus-4-0", "claude-opus-4-1", "claude-sonnet-4-0")
        return not model.startswith(legacy) and model not in ("claude-opus-4", "claude-sonnet-4")

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        system = request.system or ""
        native_format = self._native_format(request)
        if request.output_schema is not None and native_format is None:
            system = (system + "\n\n" if system else "") + _schema_instruction(request)
        thinking = request.thinking
        max_tokens = request.max_tokens or self.max_tokens or (16000 if thinking else 4096)
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": max_tokens,
            "messages": [self._message(m) for m in request.messages],
        }
        if request.timeout is not None:
            params["timeout"] = request.timeout
        cache = (
            {"type": "ephemeral", "ttl": request.cache.ttl}
            if request.cache is not None and request.cache.enabled
            else None
        )
        if cache is not None and params["messages"]:
            # The growing history is cached too: a breakpoint on the newest message.
            params["messages"][-1] = _with_cache(params["messages"][-1], cache)
        if system:
            if cache is not None:
                params["system"] = [{"type": "text", "text": system, "cache_control": cache}]
            else:
                params["system"] = system
        params.update(self._tool_params(request, cache))
        if thinking is not None:
            params.update(_thinking_params(thinking))
        elif request.temperature is not None:
            # This SDK's create() has no temperature argument; the API still takes it.
            params["extra_body"] = {"temperature": request.temperature}
        if native_format is not None:
            params["output_config"] = {**params.get("output_config", {}), "format": native_format}
        return params

    def _tool_params(self, request: ModelRequest, cache: dict[str, Any] | None) -> dict[str, Any]:
        """``tools`` (the function tools, then the native ones) and ``tool_choice``."""
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
                warnings.warn(message, UserWarning, stacklevel=5)
            else:
                tools.append(dict(spec))
        if not tools:
            return {}
        if cache is not None:
            tools[-1] = {**tools[-1], "cache_control": cache}
        params: dict[str, Any] = {"tools": tools}
        if request.tools:
            # Thinking only allows "auto"; forcing a tool would be rejected.
            forced = request.tool_choice == "required" and request.thinking is None
            params["tool_choice"] = {"type": "any" if forced else "auto"}
        return params

    # -- response --------------------------------------------------------------------------

    @staticmethod
    def _usage(data: dict[str, Any] | None) -> Usage:
        # Anthropic's input_tokens are the uncached ones; ours count every input token.
        data = data or {}
        read = int(data.get("cache_read_input_tokens") or 0)
        write = int(data.get("cache_creation_input_tokens") or 0)
        return Usage(
            input_tokens=int(data.get("input_tokens") or 0) + read + write,
            output_tokens=int(data.get("output_tokens") or 0),
            cache_read_tokens=read,
            cache_write_tokens=write,
            requests=1,
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
        params = self._params(request)
        if params["max_tokens"] > _NONSTREAMING_MAX_TOKENS:
            # The SDK requires streaming for long outputs; collect the stream instead.
            final: ModelResponse | None = None
            async for item in self.stream(request):
                if isinstance(item, ModelResponse):
                    final = item
            assert final is not None
            return final
        async with self._use_client() as client:
            with json_body(self.name, request.model):
                message = await client.messages.create(**params)
        if isinstance(message, str):
            raise invalid_response(self.name, request.model, NOT_JSON_TYPE, message)
        data = message.model_dump(exclude_none=True, warnings=False)
        blocks = data.get("content") or []
        text, calls, thinking = self._calls_and_text(blocks)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=self._usage(data.get("usage")),
            stop_reason=_normal_stop(data.get("stop_reason")),
            raw_stop_reason=data.get("stop_reason"),
            model=data.get("model"),
            thinking=thinking,
            raw=blocks,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        async with self._use_client() as client:
            async for item in self._stream(client, request):
                yield item

    async def _stream(self, client: Any, request: ModelRequest) -> AsyncIterator[StreamItem]:
        # Not the SDK's ``messages.stream()`` helper, on purpose: its accumulator re-parses a
        # tool call's whole input buffer on every ``input_json_delta`` (quadratic in the
        # argument size) and raises ``ValueError`` on malformed argument JSON, which would
        # fail the turn; here the raw text goes to the engine, which hands the model a tool
        # error it can correct. The events are read as plain dicts (``model_dump``).
        stream = await client.messages.create(**self._params(request), stream=True)
        events = _Events(self._usage)
        try:
            with json_body(self.name, request.model):
                async for event in stream:
                    yield events.feed(event.model_dump(exclude_none=True, warnings=False))
        finally:
            await stream.close()
        if not events.finished:
            raise IncompleteStream(
                f"anthropic stream for {request.model!r} ended without message_stop "
                f"(stop_reason={events.stop!r}); the partial answer was dropped"
            )
        blocks = events.blocks_in_order()
        text, calls, thinking = self._calls_and_text(blocks)
        yield ModelResponse(
            text=text,
            tool_calls=calls,
            usage=events.usage,
            stop_reason=_normal_stop(events.stop),
            raw_stop_reason=events.stop,
            model=events.model,
            thinking=thinking,
            raw=blocks,
        )

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """Classified by :data:`ERROR_KINDS`, then the status; transport errors retry."""
        anthropic = self._anthropic
        if isinstance(exc, anthropic.APIStatusError):
            body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
            nested = body.get("error")
            error: dict[str, Any] = nested if isinstance(nested, dict) else body
            return classify(
                status=exc.status_code,
                error_type=error.get("type"),
                table=ERROR_KINDS,
                headers=exc.response.headers,
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return RetryInfo(True, kind="timeout")
        if isinstance(exc, anthropic.APIConnectionError):
            return RetryInfo(True, kind="connection")
        return transport_info(exc) or super().retry_info(exc)


class _Events:
    """The state of one Messages stream, fed one event (as a dict) at a time."""

    def __init__(self, usage: Callable[[dict[str, Any] | None], Usage]) -> None:
        self._to_usage = usage
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.usage = Usage()
        self.stop: str | None = None
        self.model: str | None = None
        self.finished = False

    def feed(self, data: dict[str, Any]) -> str:
        """Take one event in; return the answer text it adds ("" for most events)."""
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model")
            self.usage = self._to_usage(message.get("usage"))
        elif kind == "content_block_start":
            self.blocks[int(data["index"])] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            return self._delta(int(data["index"]), data.get("delta") or {})
        elif kind == "message_delta":
            self.stop = (data.get("delta") or {}).get("stop_reason") or self.stop
            delta_usage = data.get("usage") or {}
            if delta_usage.get("input_tokens") is not None:
                self.usage = self._to_usage({**delta_usage})
            elif delta_usage.get("output_tokens") is not None:
                self.usage.output_tokens = int(delta_usage["output_tokens"])
        elif kind == "message_stop":
            self.finished = True
        return ""

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        dtype = delta.get("type")
        if dtype == "text_delta":
            piece: str = delta.get("text") or ""
            block["text"] = block.get("text", "") + piece
            return piece
        if dtype == "input_json_delta":
            self.partial_json.setdefault(index, []).append(delta.get("partial_json") or "")
        elif dtype == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
        elif dtype == "signature_delta":
            block["signature"] = delta.get("signature") or ""
        return ""

    def blocks_in_order(self) -> list[dict[str, Any]]:
        """The content blocks, tool inputs decoded (kept as text when not valid JSON)."""
        ordered = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") in ("tool_use", "server_tool_use") and index in self.partial_json:
                raw = "".join(self.partial_json[index])
                try:
                    block["input"] = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    block["input"] = raw
            ordered.append(block)
        return ordered


def _with_cache(message: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        if not content:
            return message
        content = [{"type": "text", "text": content}]
    if not content:
        return message
    last = {**content[-1], "cache_control": cache}
    if last.get("type") in ("thinking", "redacted_thinking"):
        return message
    return {**message, "content": [*content[:-1], last]}


def _thinking_params(thinking: ThinkingConfig) -> dict[str, Any]:
    """``thinking`` (a token budget, else adaptive) and the ``output_config`` effort."""
    config: dict[str, Any]
    if thinking.budget_tokens is not None:
        config = {"type": "enabled", "budget_tokens": thinking.budget_tokens}
    else:
        config = {"type": "adaptive"}
    if thinking.display is not None:
        config["display"] = thinking.display
    params: dict[str, Any] = {"thinking": config}
    if thinking.effort is not None:
        effort = _EFFORTS.get(thinking.effort, thinking.effort)
        params["output_config"] = {"effort": effort}
    return params
