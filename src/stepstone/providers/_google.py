"""Google Gemini adapter (official ``google-genai`` SDK).

Function calling, streaming, thinking (``thinking_config``), structured output
(``response_json_schema``) and native tools (Google Search, code execution, URL context).
Model parts are replayed verbatim so thought signatures survive tool turns.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import AsyncIterator
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
    retry_delay_from_body,
    shared_ssl_context,
    transport_info,
)
from stepstone.providers._schema import object_root
from stepstone.providers._types import (
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ThinkingConfig,
    ToolCall,
    Usage,
)

__all__ = ["GoogleProvider"]

_NATIVE: dict[NativeTool, dict[str, Any]] = {
    NativeTool.WEB_SEARCH: {"google_search": {}},
    NativeTool.WEB_FETCH: {"url_context": {}},
    NativeTool.CODE_EXECUTION: {"code_execution": {}},
}

#: Gemini finish reasons -> the normalised ones (``ModelResponse.stop_reason``).
STOP_REASONS: dict[str, str] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "MODEL_ARMOR": "content_filter",
    "MALFORMED_FUNCTION_CALL": "malformed_tool_call",
    "UNEXPECTED_TOOL_CALL": "malformed_tool_call",
}

#: Google RPC statuses (the error body's ``status``) -> error kinds.
ERROR_KINDS: dict[str, str] = {
    "RESOURCE_EXHAUSTED": "rate_limit",
    "UNAVAILABLE": "overloaded",
    "INTERNAL": "server",
    "DEADLINE_EXCEEDED": "timeout",
    "INVALID_ARGUMENT": "bad_request",
    "FAILED_PRECONDITION": "bad_request",
    "PERMISSION_DENIED": "auth",
    "UNAUTHENTICATED": "auth",
    "NOT_FOUND": "not_found",
}

#: Our efforts -> Gemini's ``thinking_level``.
_LEVELS = {"minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH"}


def _raw_stop(value: Any) -> str | None:
    """``FinishReason.STOP`` -> ``"STOP"``."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _normal_stop(raw: str | None, has_calls: bool) -> str | None:
    if raw is None:
        return None
    if raw == "STOP" and has_calls:
        return "tool_calls"
    return STOP_REASONS.get(raw, "other")


def mixes_schema_and_tools(model: str) -> bool:
    """Whether ``model`` takes a response JSON schema together with function tools."""
    return not model.startswith(("gemini-1", "gemini-2"))


#: The function that carries a structured answer on models that cannot combine a response
#: schema with function tools.
OUTPUT_TOOL = "final_result"


def _uses_output_tool(request: ModelRequest) -> bool:
    return (
        request.output_schema is not None
        and bool(request.tools)
        and not mixes_schema_and_tools(request.model)
    )


def _import_genai() -> Any:
    try:
        from google import genai
    except ImportError as exc:  # pragma: no cover - the dev venv has the SDK
        raise MissingExtraError("google-genai", "google") from exc
    return genai


class GoogleProvider(SDKClientMixin, Provider):
    """Gemini through the official ``google-genai`` SDK (``pip install stepstone[google]``).

    Args:
        api_key: Defaults to ``GOOGLE_API_KEY``, then ``GEMINI_API_KEY``.
        base_url: Defaults to ``GOOGLE_GEMINI_BASE_URL``, else Google's endpoint.
        max_tokens: Default output cap (None: the model's default).
        strict_native_tools: Raise instead of warning when a native tool is unsupported.
    """

    name = "google"
    tiers: ClassVar[dict[str, str]] = {
        "top": "gemini-2.5-pro",
        "medium": "gemini-2.5-flash",
        "cheap": "gemini-2.5-flash-lite",
    }
    native_tools_supported: ClassVar[frozenset[NativeTool]] = frozenset(_NATIVE)
    api_key_envs = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
    base_url_env = "GOOGLE_GEMINI_BASE_URL"
    default_base_url = "https://generativelanguage.googleapis.com"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        strict_native_tools: bool = False,
    ) -> None:
        self._genai = _import_genai()
        self._configure(
            api_key=api_key,
            base_url=base_url,
            max_tokens=max_tokens,
            strict_native_tools=strict_native_tools,
        )

    def _build_client(self) -> Any:
        api_key = self._resolve_api_key()
        types = self._genai.types
        # One attempt: the engine owns retries and deadlines.
        options = types.HttpOptions(
            base_url=self.base_url,
            retry_options=types.HttpRetryOptions(attempts=1),
            client_args={"verify": shared_ssl_context()},
            # "ssl" is the websocket / aiohttp spelling; the SDK drops it for httpx.
            async_client_args={"verify": shared_ssl_context(), "ssl": shared_ssl_context()},
        )
        return self._genai.Client(api_key=api_key, http_options=options)

    @staticmethod
    async def _close_client(client: Any) -> None:
        await client.aio.aclose()

    # -- request ---------------------------------------------------------------------------

    def _content(self, m: Message) -> dict[str, Any]:
        if m.role == "user":
            return {"role": "user", "parts": [{"text": m.text}]}
        if m.role == "tool":
            return {
                "role": "user",
                "parts": [
                    {
                        "function_response": {
                            "id": r.call_id,
                            "name": r.name,
                            "response": {"error": r.content}
                            if r.is_error
                            else {"output": r.content},
                        }
                    }
                    for r in m.tool_results
                ],
            }
        if m.raw_provider == self.name and m.raw:
            parts = [
                {**p, "function_call": {**p["function_call"], "args": {}}}
                if "function_call" in p and not isinstance(p["function_call"].get("args"), dict)
                else p
                for p in m.raw
            ]
            return {"role": "model", "parts": parts}
        out: list[dict[str, Any]] = []
        if m.text:
            out.append({"text": m.text})
        for c in m.tool_calls:
            out.append({"function_call": {"id": c.id, "name": c.name, "args": c.arguments}})
        return {"role": "model", "parts": out}

    def _config(self, request: ModelRequest) -> dict[str, Any]:
        config: dict[str, Any] = {"automatic_function_calling": {"disable": True}}
        if request.timeout is not None:
            config["http_options"] = {"timeout": max(1, int(request.timeout * 1000))}
        output_tool = _uses_output_tool(request)
        schema_natively = request.output_schema is not None and not output_tool
        system = request.system or ""
        if system:
            config["system_instruction"] = system
        config.update(self._tools_config(request, output_tool))
        if request.temperature is not None:
            config["temperature"] = request.temperature
        max_tokens = request.max_tokens or self.max_tokens
        if max_tokens is not None:
            config["max_output_tokens"] = max_tokens
        if request.thinking is not None:
            config["thinking_config"] = _thinking_config(request.thinking)
        if schema_natively:
            config["response_mime_type"] = "application/json"
            config["response_json_schema"] = request.output_schema
        return config

    def _tools_config(self, request: ModelRequest, output_tool: bool) -> dict[str, Any]:
        """``tool_config`` (when there are function tools) and ``tools`` (the function
        declarations, then the native tools)."""
        config: dict[str, Any] = {}
        tools: list[dict[str, Any]] = []
        if request.tools:
            tools.append({"function_declarations": _declarations(request, output_tool)})
            mode = "ANY" if request.tool_choice == "required" or output_tool else "AUTO"
            config["tool_config"] = {"function_calling_config": {"mode": mode}}
        for native in request.native_tools:
            spec = _NATIVE.get(native)
            if spec is None:
                message = f"google has no native tool {native.value!r}; it was not sent"
                if self.strict_native_tools:
                    raise UserError(message)
                warnings.warn(message, UserWarning, stacklevel=5)
            else:
                tools.append(dict(spec))
        if tools:
            config["tools"] = tools
        return config

    def _call_args(self, request: ModelRequest) -> dict[str, Any]:
        return {
            "model": request.model,
            "contents": [self._content(m) for m in request.messages],
            # Typed config: the SDK then writes the API's field names at every depth.
            "config": self._genai.types.GenerateContentConfig.model_validate(self._config(request)),
        }

    # -- response --------------------------------------------------------------------------

    @staticmethod
    def _usage(data: dict[str, Any] | None) -> Usage:
        data = data or {}
        return Usage(
            input_tokens=int(data.get("prompt_token_count") or 0),
            output_tokens=int(data.get("candidates_token_count") or 0)
            + int(data.get("thoughts_token_count") or 0),
            cache_read_tokens=int(data.get("cached_content_token_count") or 0),
            reasoning_tokens=int(data.get("thoughts_token_count") or 0),
            requests=1,
        )

    @staticmethod
    def _parts(data: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        candidates = data.get("candidates") or []
        if not candidates:
            return [], None
        candidate = candidates[0]
        content = candidate.get("content") or {}
        return list(content.get("parts") or []), _raw_stop(candidate.get("finish_reason"))

    @staticmethod
    def _blocked(data: dict[str, Any]) -> str | None:
        """The block reason of a prompt refused before any candidate (``prompt_feedback``)."""
        feedback = data.get("prompt_feedback") or {}
        return _raw_stop(feedback.get("block_reason"))

    @staticmethod
    def _read_parts(parts: list[dict[str, Any]]) -> tuple[str, str, list[ToolCall]]:
        text: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        for i, part in enumerate(parts):
            call = part.get("function_call")
            if call:
                args = call.get("args")
                call_id = call.get("id") or f"fc_{i}"
                if isinstance(args, dict) or args is None:
                    calls.append(
                        ToolCall(id=call_id, name=call.get("name") or "", arguments=args or {})
                    )
                else:
                    calls.append(
                        ToolCall(
                            id=call_id,
                            name=call.get("name") or "",
                            raw_arguments=args if isinstance(args, str) else json.dumps(args),
                        )
                    )
            elif part.get("text"):
                (thoughts if part.get("thought") else text).append(part["text"])
        return "".join(text), "".join(thoughts), calls

    @staticmethod
    def _dump(obj: Any, model: str) -> dict[str, Any]:
        if isinstance(obj, str):
            raise invalid_response("google", model, NOT_JSON_TYPE, obj)
        data: dict[str, Any] = obj.model_dump(exclude_none=True, warnings=False)
        return data

    def _json_body(self, request: ModelRequest) -> contextlib.AbstractContextManager[None]:
        """A body the SDK could not parse (``UnknownApiResponseError`` when streamed) is an
        :class:`InvalidResponse`."""
        return json_body(self.name, request.model, (self._genai.errors.UnknownApiResponseError,))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        async with self._use_client() as client:
            with self._json_body(request):
                response = await client.aio.models.generate_content(**self._call_args(request))
        data = self._dump(response, request.model)
        parts, finish = self._parts(data)
        blocked = self._blocked(data)
        return self._response(
            request,
            parts,
            finish,
            blocked,
            self._usage(data.get("usage_metadata")),
            data.get("model_version"),
        )

    def _response(
        self,
        request: ModelRequest,
        parts: list[dict[str, Any]],
        finish: str | None,
        blocked: str | None,
        usage: Usage,
        model: str | None,
    ) -> ModelResponse:
        text, thoughts, calls = self._read_parts(parts)
        answer = next((c for c in calls if c.name == OUTPUT_TOOL), None)
        if answer is not None and _uses_output_tool(request):
            # The answer came as the output function's arguments: hand it on as text, and
            # replay it as text (the call has no function response to pair with).
            args = answer.arguments
            if request.output_schema is not None and request.output_schema.get("type") != "object":
                args = args.get("result", args)
            text = json.dumps(args) if answer.raw_arguments is None else answer.raw_arguments
            calls = []
            parts = [{"text": text}]
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            stop_reason="content_filter" if blocked else _normal_stop(finish, bool(calls)),
            raw_stop_reason=f"prompt_blocked:{blocked}" if blocked else finish,
            model=model,
            thinking=thoughts,
            raw=parts,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        async with self._use_client() as client:
            async for item in self._stream(client, request):
                yield item

    async def _stream(self, client: Any, request: ModelRequest) -> AsyncIterator[StreamItem]:
        with self._json_body(request):
            stream = await client.aio.models.generate_content_stream(**self._call_args(request))
        all_parts: list[dict[str, Any]] = []
        usage = Usage()
        finish: str | None = None
        blocked: str | None = None
        model: str | None = None
        try:
            with self._json_body(request):
                async for chunk in stream:
                    data = self._dump(chunk, request.model)
                    parts, chunk_finish = self._parts(data)
                    finish = chunk_finish or finish
                    blocked = self._blocked(data) or blocked
                    model = data.get("model_version") or model
                    if data.get("usage_metadata"):
                        usage = self._usage(data["usage_metadata"])
                    piece = ""
                    for part in parts:
                        if part.get("text") and not part.get("thought") and all_parts:
                            last = all_parts[-1]
                            if set(last) == {"text"} and set(part) == {"text"}:
                                last["text"] += part["text"]
                                piece += part["text"]
                                continue
                        all_parts.append(dict(part))
                        if part.get("text") and not part.get("thought"):
                            piece += part["text"]
                    yield piece
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if finish is None and blocked is None:
            raise IncompleteStream(
                f"google stream for {request.model!r} ended without a finishReason; the "
                "partial answer was dropped"
            )
        yield self._response(request, all_parts, finish, blocked, usage, model)

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """Classified by :data:`ERROR_KINDS` (the RPC status), then the HTTP code; the
        wait is ``retry-after`` or the body's ``RetryInfo.retryDelay``."""
        errors = self._genai.errors
        if isinstance(exc, errors.APIError):
            headers = getattr(getattr(exc, "response", None), "headers", None)
            info = classify(
                status=exc.code, error_type=exc.status, table=ERROR_KINDS, headers=headers
            )
            if info.retry_after is None:
                info.retry_after = retry_delay_from_body(exc.details)
            return info
        return transport_info(exc) or super().retry_info(exc)


def _declarations(request: ModelRequest, output_tool: bool) -> list[dict[str, Any]]:
    """The function declarations of ``request``'s tools (and of the output tool)."""
    declarations = [
        {
            "name": t.name,
            "description": t.description,
            "parameters_json_schema": t.parameters,
        }
        for t in request.tools
    ]
    if output_tool and request.output_schema is not None:
        # Older Gemini models reject a response schema next to function tools: the
        # answer is given as the arguments of one more function, which must be
        # called (mode ANY) to finish.
        declarations.append(
            {
                "name": OUTPUT_TOOL,
                "description": "Give your final answer: its arguments are the answer. "
                "Call it once you have the answer, instead of replying with text.",
                "parameters_json_schema": object_root(request.output_schema)[0],
            }
        )
    return declarations


def _thinking_config(thinking: ThinkingConfig) -> dict[str, Any]:
    config: dict[str, Any] = {"include_thoughts": thinking.display != "omitted"}
    if thinking.budget_tokens is not None:
        config["thinking_budget"] = thinking.budget_tokens
    elif thinking.effort is not None:
        config["thinking_level"] = _LEVELS[thinking.effort]
    return config
