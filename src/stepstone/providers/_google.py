"""Google Gemini adapter (official ``google-genai`` SDK).

Function calling, streaming, thinking (``thinking_config``), structured output
(``response_json_schema``) and native tools (Google Search, code execution, URL context).
Model parts are replayed verbatim so thought signatures survive tool turns.
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

__all__ = ["GoogleProvider"]

_NATIVE: dict[NativeTool, dict[str, Any]] = {
    NativeTool.WEB_SEARCH: {"google_search": {}},
    NativeTool.WEB_FETCH: {"url_context": {}},
    NativeTool.CODE_EXECUTION: {"code_execution": {}},
}
_TRANSPORT_ERRORS = ("TransportError", "TimeoutException", "NetworkError", "ConnectError")


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
            base_url=self.base_url, retry_options=types.HttpRetryOptions(attempts=1)
        )
        return self._genai.Client(api_key=api_key, http_options=options)

    async def _close_client(self, client: Any) -> None:
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
        if request.system:
            config["system_instruction"] = request.system
        tools: list[dict[str, Any]] = []
        if request.tools:
            tools.append(
                {
                    "function_declarations": [
                        {
                            "name": t.name,
                            "description": t.description,
                            "parameters_json_schema": t.parameters,
                        }
                        for t in request.tools
                    ]
                }
            )
            mode = "ANY" if request.tool_choice == "required" else "AUTO"
            config["tool_config"] = {"function_calling_config": {"mode": mode}}
        for native in request.native_tools:
            spec = _NATIVE.get(native)
            if spec is None:
                message = f"google has no native tool {native.value!r}; it was not sent"
                if self.strict_native_tools:
                    raise UserError(message)
                warnings.warn(message, UserWarning, stacklevel=4)
            else:
                tools.append(dict(spec))
        if tools:
            config["tools"] = tools
        if request.temperature is not None:
            config["temperature"] = request.temperature
        max_tokens = request.max_tokens or self.max_tokens
        if max_tokens is not None:
            config["max_output_tokens"] = max_tokens
        if request.thinking is not None:
            thinking: dict[str, Any] = {"include_thoughts": request.thinking.display != "omitted"}
            if request.thinking.budget_tokens is not None:
                thinking["thinking_budget"] = request.thinking.budget_tokens
            config["thinking_config"] = thinking
        if request.output_schema is not None:
            config["response_mime_type"] = "application/json"
            config["response_json_schema"] = request.output_schema
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
        )

    @staticmethod
    def _parts(data: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        candidates = data.get("candidates") or []
        if not candidates:
            return [], None
        candidate = candidates[0]
        content = candidate.get("content") or {}
        return list(content.get("parts") or []), candidate.get("finish_reason")

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
    def _dump(obj: Any) -> dict[str, Any]:
        if isinstance(obj, str):
            raise ValueError(f"google returned a non-JSON body: {obj[:200]!r}")
        data: dict[str, Any] = obj.model_dump(exclude_none=True, warnings=False)
        return data

    async def complete(self, request: ModelRequest) -> ModelResponse:
        client = await self._get_client()
        response = await client.aio.models.generate_content(**self._call_args(request))
        data = self._dump(response)
        parts, finish = self._parts(data)
        text, thoughts, calls = self._read_parts(parts)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=self._usage(data.get("usage_metadata")),
            stop_reason=str(finish) if finish is not None else None,
            model=data.get("model_version"),
            thinking=thoughts,
            raw=parts,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        client = await self._get_client()
        stream = await client.aio.models.generate_content_stream(**self._call_args(request))
        all_parts: list[dict[str, Any]] = []
        usage = Usage()
        finish: str | None = None
        model: str | None = None
        try:
            async for chunk in stream:
                data = self._dump(chunk)
                parts, chunk_finish = self._parts(data)
                finish = chunk_finish or finish
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
        text, thoughts, calls = self._read_parts(all_parts)
        yield ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            stop_reason=str(finish) if finish is not None else None,
            model=model,
            thinking=thoughts,
            raw=all_parts,
        )

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """429 / 408 / 5xx (honouring ``retry-after``) and transport errors retry."""
        errors = self._genai.errors
        if isinstance(exc, errors.APIError):
            headers = getattr(getattr(exc, "response", None), "headers", None)
            return RetryInfo(status_retryable(exc.code), retry_after_from_headers(headers))
        if any(cls.__name__ in _TRANSPORT_ERRORS for cls in type(exc).__mro__):
            return RetryInfo(True)
        return super().retry_info(exc)
