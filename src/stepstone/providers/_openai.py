"""OpenAI adapter (official ``openai`` SDK, Chat Completions), also for compatible servers.

Any server that speaks the Chat Completions wire format works through ``base_url``:
Ollama (``http://localhost:11434/v1``), vLLM, llama.cpp's server, LM Studio...
"""

from __future__ import annotations

import json
import logging
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

__all__ = ["OpenAIProvider"]

log = logging.getLogger("stepstone")


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
        # The engine owns retries and deadlines, so the SDK's own are turned off.
        return self._openai.AsyncOpenAI(
            api_key=api_key, base_url=self.base_url, max_retries=0, **self._client_options
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
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": (request.output_name or "output")[:64],
                    "schema": request.output_schema,
                    "strict": False,
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
        )

    def _response(self, data: dict[str, Any]) -> ModelResponse:
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
        return ModelResponse(
            text=message.get("content") or "",
            tool_calls=calls,
            usage=self._usage(data.get("usage")),
            stop_reason=choice.get("finish_reason"),
            model=data.get("model"),
            thinking=message.get("reasoning_content") or "",
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        client = await self._get_client()
        completion = await client.chat.completions.create(**self._params(request))
        if isinstance(completion, str):
            raise ValueError(f"{self.name} returned a non-JSON body: {completion[:200]!r}")
        return self._response(completion.model_dump(warnings=False))

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        client = await self._get_client()
        stream = await client.chat.completions.create(
            **self._params(request), stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        thinking: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage = Usage()
        finish: str | None = None
        model: str | None = None
        try:
            async for chunk in stream:
                data = chunk.model_dump(warnings=False)
                model = data.get("model") or model
                if data.get("usage"):
                    usage = self._usage(data["usage"])
                piece = ""
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        piece += delta["content"]
                    if delta.get("reasoning_content"):
                        thinking.append(delta["reasoning_content"])
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(
                            int(tc.get("index") or 0), {"id": None, "name": "", "arguments": ""}
                        )
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
                text.append(piece)
                yield piece
        finally:
            await stream.close()
        tool_calls = []
        for index in sorted(calls):
            slot = calls[index]
            args, raw = parse_arguments(slot["arguments"])
            tool_calls.append(
                ToolCall(
                    id=slot["id"] or f"call_{index}",
                    name=slot["name"],
                    arguments=args,
                    raw_arguments=raw,
                )
            )
        yield ModelResponse(
            text="".join(text),
            tool_calls=tool_calls,
            usage=usage,
            stop_reason=finish,
            model=model,
            thinking="".join(thinking),
        )

    def resolve_model(self, model: str) -> str:
        """Tier aliases apply to OpenAI itself, not to compatible servers."""
        return super().resolve_model(model) if self.name == "openai" else model

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """429 / 408 / 409 / 5xx (honouring ``retry-after``) and connection errors retry."""
        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            return RetryInfo(
                status_retryable(exc.status_code), retry_after_from_headers(exc.response.headers)
            )
        if isinstance(exc, openai.APIConnectionError):
            return RetryInfo(True)
        return super().retry_info(exc)
