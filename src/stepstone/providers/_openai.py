"""OpenAI adapter (official ``openai`` SDK, Chat Completions), also for compatible servers.

Any server that speaks the Chat Completions wire format works through ``base_url``:
Ollama (``http://localhost:11434/v1``), vLLM, llama.cpp's server, LM Studio...
"""

from __future__ import annotations

import json
import logging
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
from stepstone.providers._schema import object_root, strict_schema, unwrap_result
from stepstone.providers._types import (
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ToolCall,
    Usage,
)

__all__ = ["OpenAIProvider"]

log = logging.getLogger("stepstone")


#: Chat Completions finish reasons -> the normalised ones (``ModelResponse.stop_reason``).
STOP_REASONS: dict[str, str] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

#: OpenAI error types and codes (HTTP bodies and mid-stream ``{"error": ...}``) -> kinds.
ERROR_KINDS: dict[str, str] = {
    "server_error": "server",
    "internal_error": "server",
    "service_unavailable": "overloaded",
    "overloaded": "overloaded",
    "overloaded_error": "overloaded",
    "rate_limit_exceeded": "rate_limit",
    "rate_limit_error": "rate_limit",
    "requests": "rate_limit",
    "tokens": "rate_limit",
    "insufficient_quota": "auth",
    "invalid_request_error": "bad_request",
    "invalid_api_key": "auth",
    "authentication_error": "auth",
    "permission_error": "auth",
    "not_found_error": "not_found",
    "model_not_found": "not_found",
    "timeout": "timeout",
}


def _normal_stop(raw: str | None, refusal: str) -> str | None:
    if refusal:
        return "refusal"
    return None if raw is None else STOP_REASONS.get(raw, "other")


def _answer(text: str, request: ModelRequest) -> str:
    """The final text, unwrapped when a non-object output was wrapped in ``result``."""
    if request.output_schema is None or not object_root(request.output_schema)[1]:
        return text
    return unwrap_result(text)


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - the dev venv has the SDK
        raise MissingExtraError("openai", "openai") from exc
    return openai


def parse_arguments(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """Parse tool-call arguments: ``(dict, None)``, or ``({}, raw)`` when not a JSON object."""
    if raw is None or raw.strip() == "":
        return {}, None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}, raw
    if not isinstance(value, dict):
        return {}, raw
    return value, None


class OpenAIProvider(SDKClientMixin, Provider):
    """Chat Completions through the official ``openai`` SDK (``pip install stepstone[openai]``).

    Args:
        api_key: Defaults to ``OPENAI_API_KEY`` (local servers accept any string).
        base_url: Defaults to ``OPENAI_BASE_URL``, else OpenAI's endpoint.
        name: Routing name (``"openai"``; ``"ollama"`` for the Ollama preset).
        strict_native_tools: Raise instead of warning when a native tool is unsupported.
        max_tokens: Default output cap (None: the server's default).
        client_options: Passed to ``openai.AsyncOpenAI`` (``default_headers``,
            ``http_client``...).

    Example::

        local = OpenAIProvider(base_url="http://localhost:11434/v1", api_key="ollama")
        Agent(engine=LLMEngine("llama3.2", provider=local))("hello")
    """

    tiers: ClassVar[dict[str, str]] = {
        "top": "gpt-5",
        "medium": "gpt-5-mini",
        "cheap": "gpt-5-nano",
    }
    native_tools_supported: ClassVar[frozenset[NativeTool]] = frozenset({NativeTool.WEB_SEARCH})
    api_key_envs = ("OPENAI_API_KEY",)
    base_url_env = "OPENAI_BASE_URL"
    default_base_url = "https://api.openai.com/v1"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        name: str = "openai",
        strict_native_tools: bool = False,
        max_tokens: int | None = None,
        **client_options: Any,
    ) -> None:
        self._openai = _import_openai()
        self.name = name
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
            options["http_client"] = self._openai.DefaultAsyncHttpxClient(
                verify=shared_ssl_context()
            )
        # The engine owns retries and deadlines, so the SDK's own are turned off.
        return self._openai.AsyncOpenAI(
            api_key=api_key, base_url=self.base_url, max_retries=0, **options
        )

    # -- request ---------------------------------------------------------------------------

    def _messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if request.system:
            out.append({"role": "system", "content": request.system})
        for m in request.messages:
            out.extend(self._message(m))
        return out

    @staticmethod
    def _message(m: Message) -> list[dict[str, Any]]:
        if m.role == "user":
            return [{"role": "user", "content": m.text}]
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.raw_arguments
                            if c.raw_arguments is not None
                            else json.dumps(c.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            return [msg]
        return [
            {"role": "tool", "tool_call_id": r.call_id, "content": r.content}
            for r in m.tool_results
        ]

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"model": request.model, "messages": self._messages(request)}
        if request.timeout is not None:
            params["timeout"] = request.timeout
        if request.tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
            params["tool_choice"] = request.tool_choice
        if request.temperature is not None:
            params["temperature"] = request.temperature
        max_tokens = request.max_tokens or self.max_tokens
        if max_tokens is not None:
            params["max_completion_tokens"] = max_tokens
        if request.thinking is not None:
            params["reasoning_effort"] = request.thinking.effort or "medium"
        if request.output_schema is not None:
            # The API wants an object at the root: a list or a scalar answer is wrapped.
            schema, _ = object_root(request.output_schema)
            strict = strict_schema(schema)
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": (request.output_name or "output")[:64],
                    "schema": strict if strict is not None else schema,
                    "strict": strict is not None,
                },
            }
        for tool in request.native_tools:
            if tool is NativeTool.WEB_SEARCH:
                params["web_search_options"] = {}
            else:
                self._unsupported(tool)
        if request.cache is not None and request.cache.ttl == "1h":
            params["prompt_cache_retention"] = "24h"
        return params

    def _unsupported(self, tool: NativeTool) -> None:
        message = f"{self.name} Chat Completions has no native tool {tool.value!r}; it was not sent"
        if self.strict_native_tools:
            raise UserError(message)
        warnings.warn(message, UserWarning, stacklevel=4)

    # -- response --------------------------------------------------------------------------

    @staticmethod
    def _usage(data: dict[str, Any] | None) -> Usage:
        if not data:
            return Usage()
        prompt_details = data.get("prompt_tokens_details") or {}
        completion_details = data.get("completion_tokens_details") or {}
        return Usage(
            input_tokens=int(data.get("prompt_tokens") or 0),
            output_tokens=int(data.get("completion_tokens") or 0),
            cache_read_tokens=int(prompt_details.get("cached_tokens") or 0),
            reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
            requests=1,
        )

    def _response(self, data: dict[str, Any], request: ModelRequest) -> ModelResponse:
        choices = data.get("choices") or []
        if not choices:
            raise ValueError(f"{self.name} returned a completion without choices: {data!r:.300}")
        choice = choices[0]
        message = choice.get("message") or {}
        calls = []
        for i, tc in enumerate(message.get("tool_calls") or []):
            fn = tc.get("function") or {}
            args, raw = parse_arguments(fn.get("arguments"))
            calls.append(
                ToolCall(
                    id=tc.get("id") or f"call_{i}",
                    name=fn.get("name") or "",
                    arguments=args,
                    raw_arguments=raw,
                )
            )
        refusal = message.get("refusal") or ""
        return ModelResponse(
            text=_answer(message.get("content") or "", request),
            tool_calls=calls,
            usage=self._usage(data.get("usage")),
            stop_reason=_normal_stop(choice.get("finish_reason"), refusal),
            raw_stop_reason=choice.get("finish_reason"),
            refusal=refusal,
            model=data.get("model"),
            thinking=message.get("reasoning_content") or "",
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        async with self._use_client() as client:
            with json_body(self.name, request.model):
                completion = await client.chat.completions.create(**self._params(request))
        if isinstance(completion, str):
            raise invalid_response(self.name, request.model, NOT_JSON_TYPE, completion)
        return self._response(completion.model_dump(warnings=False), request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        async with self._use_client() as client:
            async for item in self._stream(client, request):
                yield item

    async def _stream(self, client: Any, request: ModelRequest) -> AsyncIterator[StreamItem]:
        # Not the SDK's ``chat.completions.stream()`` helper, on purpose: with a response
        # format or strict tools it raises on ``finish_reason`` "length" or
        # "content_filter" instead of reporting them, while the engine maps them to stop
        # reasons and acts on them (continue, fall back, or a clear error). Each chunk is
        # read as a plain dict, which also keeps compatible servers' extra fields.
        stream = await client.chat.completions.create(
            **self._params(request), stream=True, stream_options={"include_usage": True}
        )
        chunks = _Chunks(self._usage)
        try:
            with json_body(self.name, request.model):
                async for chunk in stream:
                    yield chunks.feed(chunk.model_dump(warnings=False))
        finally:
            await stream.close()
        if chunks.finish is None:
            raise IncompleteStream(
                f"{self.name} stream for {request.model!r} ended without a finish_reason; "
                "the partial answer was dropped"
            )
        refusal = "".join(chunks.refusal)
        yield ModelResponse(
            text=_answer("".join(chunks.text), request),
            tool_calls=chunks.tool_calls(),
            usage=chunks.usage,
            stop_reason=_normal_stop(chunks.finish, refusal),
            raw_stop_reason=chunks.finish,
            refusal=refusal,
            model=chunks.model,
            thinking="".join(chunks.thinking),
        )

    def resolve_model(self, model: str) -> str:
        """Tier aliases apply to OpenAI itself, not to compatible servers."""
        return super().resolve_model(model) if self.name == "openai" else model

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """Classified by :data:`ERROR_KINDS` (type, then code), then the status; a mid-stream
        ``{"error": ...}`` has no status and is judged by its type alone."""
        openai = self._openai
        if isinstance(exc, openai.APITimeoutError):
            return RetryInfo(True, kind="timeout")
        if isinstance(exc, openai.APIConnectionError):
            return RetryInfo(True, kind="connection")
        if isinstance(exc, openai.APIError):
            body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
            nested = body.get("error")
            error: dict[str, Any] = nested if isinstance(nested, dict) else body
            error_type = next(
                (
                    str(v)
                    for v in (error.get("type"), error.get("code"))
                    if v is not None and str(v) in ERROR_KINDS
                ),
                None,
            )
            status = getattr(exc, "status_code", None)
            response = getattr(exc, "response", None)
            return classify(
                status=status,
                error_type=error_type,
                table=ERROR_KINDS,
                headers=getattr(response, "headers", None),
            )
        return transport_info(exc) or super().retry_info(exc)


class _Chunks:
    """The state of one Chat Completions stream, fed one chunk (as a dict) at a time."""

    def __init__(self, usage: Callable[[dict[str, Any] | None], Usage]) -> None:
        self._to_usage = usage
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage = Usage()
        self.finish: str | None = None
        self.model: str | None = None

    def feed(self, data: dict[str, Any]) -> str:
        """Take one chunk in; return the answer text it adds."""
        self.model = data.get("model") or self.model
        if data.get("usage"):
            self.usage = self._to_usage(data["usage"])
        piece = ""
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            piece += delta.get("content") or ""
            if delta.get("reasoning_content"):
                self.thinking.append(delta["reasoning_content"])
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
            for tc in delta.get("tool_calls") or []:
                self._call_delta(tc)
            self.finish = choice.get("finish_reason") or self.finish
        self.text.append(piece)
        return piece

    def _call_delta(self, tc: dict[str, Any]) -> None:
        slot = self.calls.setdefault(
            int(tc.get("index") or 0), {"id": None, "name": "", "arguments": ""}
        )
        if tc.get("id"):
            slot["id"] = tc["id"]
        fn = tc.get("function") or {}
        slot["name"] += fn.get("name") or ""
        slot["arguments"] += fn.get("arguments") or ""

    def tool_calls(self) -> list[ToolCall]:
        out = []
        for index in sorted(self.calls):
            slot = self.calls[index]
            args, raw = parse_arguments(slot["arguments"])
            out.append(
                ToolCall(
                    id=slot["id"] or f"call_{index}",
                    name=slot["name"],
                    arguments=args,
                    raw_arguments=raw,
                )
            )
        return out
