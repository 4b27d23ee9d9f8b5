"""Provider-neutral messages, requests and responses.

The LLM engine speaks only these types; each provider adapter translates them to and from
its SDK. Scripted models (``stepstone.testing``) produce them directly.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal

__all__ = [
    "CacheConfig",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "NativeTool",
    "ThinkingConfig",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "STOP_REASONS",
    "Usage",
    "UsageLimits",
]

#: The normalised stop reasons every adapter maps its provider's values to:
#: ``"stop"`` (a final answer), ``"tool_calls"``, ``"length"`` (cut off at the output cap),
#: ``"refusal"``, ``"content_filter"`` (a provider's filter or safety block), ``"pause"``
#: (a server-side tool paused the turn; the engine continues it), ``"malformed_tool_call"``
#: and ``"other"``.
STOP_REASONS = (
    "stop",
    "tool_calls",
    "length",
    "refusal",
    "content_filter",
    "pause",
    "malformed_tool_call",
    "other",
)


class NativeTool(enum.StrEnum):
    """Provider-side tools the model runs on the provider's servers.

    ``CODE_EXECUTION`` and ``COMPUTER_USE`` grant the model code execution or control of a
    computer, so ``LLMEngine`` refuses them unless ``allow_dangerous_native_tools=True``.
    """

    WEB_SEARCH = "web_search"
    WEB_FETCH = "web_fetch"
    FILE_SEARCH = "file_search"
    CODE_EXECUTION = "code_execution"
    COMPUTER_USE = "computer_use"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ThinkingConfig:
    """Extended thinking / reasoning settings.

    Attributes:
        budget_tokens: Anthropic thinking budget (None: the provider's adaptive default).
        effort: Reasoning effort for providers that take one (``"low"``, ``"medium"``,
            ``"high"``).
        display: ``"omitted"`` hides thoughts where the provider supports it.
    """

    budget_tokens: int | None = None
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    display: Literal["summarized", "omitted"] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Prompt caching: ``enabled`` marks the system prompt and tools cacheable (Anthropic).

    Attributes:
        enabled: Whether to ask for caching.
        ttl: ``"5m"`` (default) or ``"1h"``.
    """

    enabled: bool = True
    ttl: Literal["5m", "1h"] = "5m"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call the model asked for.

    Attributes:
        id: The provider's call id (results are matched to calls by it).
        name: The tool name.
        arguments: Parsed arguments; empty when ``raw_arguments`` was not valid JSON.
        raw_arguments: The arguments as the model sent them, when they were not a JSON
            object (the engine reports this to the model as an error).
    """

    id: str
    name: str
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    raw_arguments: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """The outcome of one tool call, as the model will see it."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ToolDefinition:
    """A tool as offered to the model: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclasses.dataclass(slots=True, kw_only=True)
class Usage:
    """Token counts of one model response (or the sum over a run), the same on every provider.

    Attributes:
        input_tokens: Every input token, cached or not (Anthropic's uncached
            ``input_tokens`` plus its cache reads and writes).
        output_tokens: Every output token, reasoning included.
        cache_read_tokens: Input tokens read from the prompt cache (part of ``input_tokens``).
        cache_write_tokens: Input tokens written to the prompt cache (part of
            ``input_tokens``).
        reasoning_tokens: Output tokens spent on reasoning (part of ``output_tokens``).
        requests: Model requests that produced these counts.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to this one."""
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict of the counts (in field order)."""
        # Written out: ``dataclasses.asdict`` deep-copies every field, and a durable run
        # asks for this several times a turn.
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "requests": self.requests,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UsageLimits:
    """Caps on one run's usage, checked before every model request.

    A run that has reached a cap stops with
    :class:`~stepstone.exceptions.UsageLimitExceeded` instead of sending the next request.
    ``None`` means no cap. A cost cap needs the model's price: with an unknown price the
    run stops before its first request rather than spending without a bound.

    Attributes:
        max_requests: Model requests per run (retries of one turn count once).
        max_input_tokens: Input tokens per run (cached ones included).
        max_output_tokens: Output tokens per run.
        max_total_tokens: Input plus output tokens per run.
        max_cost_usd: Estimated cost per run, in USD.
    """

    max_requests: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and value < 0:
                raise ValueError(f"UsageLimits({field.name}={value!r}): must be >= 0 or None")


@dataclasses.dataclass(slots=True, kw_only=True)
class Message:
    """One conversation message.

    ``role="user"`` carries ``text``; ``role="assistant"`` carries ``text`` and/or
    ``tool_calls`` (and ``raw``: the provider's own content blocks, replayed verbatim to the
    same provider so thinking signatures survive); ``role="tool"`` carries ``tool_results``.
    """

    role: Literal["user", "assistant", "tool"]
    text: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_results: list[ToolResult] = dataclasses.field(default_factory=list)
    raw: Any = None
    raw_provider: str | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class ModelRequest:
    """Everything a provider needs for one completion.

    Attributes:
        model: The model id sent on the wire.
        messages: The conversation so far.
        system: The system prompt (engine ``system`` plus the envelope's context).
        tools: Tools offered to the model.
        tool_choice: ``"auto"``, or ``"required"`` (the model must call a tool this turn).
        temperature: Sampling temperature (None: provider default).
        max_tokens: Output token cap (None: the adapter's default).
        thinking: Extended thinking settings, or None.
        cache: Prompt caching settings, or None.
        native_tools: Provider-side tools.
        output_schema: JSON schema the final answer must match (structured output).
        output_name: A name for that schema (the pydantic model's name).
        turn: The loop turn this request belongs to (0-based).
        timeout: Seconds the SDK may take for this request (None: the SDK's default).
    """

    model: str
    messages: list[Message]
    system: str | None = None
    tools: list[ToolDefinition] = dataclasses.field(default_factory=list)
    tool_choice: Literal["auto", "required"] = "auto"
    temperature: float | None = None
    max_tokens: int | None = None
    thinking: ThinkingConfig | None = None
    cache: CacheConfig | None = None
    native_tools: list[NativeTool] = dataclasses.field(default_factory=list)
    output_schema: dict[str, Any] | None = None
    output_name: str | None = None
    turn: int = 0
    timeout: float | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class ModelResponse:
    """One model reply: text and/or tool calls, usage, and the provider's raw content.

    ``stop_reason`` is normalised (one of :data:`STOP_REASONS`); ``raw_stop_reason`` keeps
    the provider's own value. ``refusal`` holds a refusal's explanation when the provider
    sends it apart from the text (OpenAI's ``message.refusal``).
    """

    text: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    usage: Usage = dataclasses.field(default_factory=Usage)
    stop_reason: str | None = None
    raw_stop_reason: str | None = None
    refusal: str = ""
    model: str | None = None
    thinking: str = ""
    raw: Any = None
