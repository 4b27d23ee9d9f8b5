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
    "Usage",
]


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
    """Token counts of one model response (or the sum over a run)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to this one."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict of the counts."""
        return dataclasses.asdict(self)


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


@dataclasses.dataclass(slots=True, kw_only=True)
class ModelResponse:
    """One model reply: text and/or tool calls, usage, and the provider's raw content."""

    text: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    usage: Usage = dataclasses.field(default_factory=Usage)
    stop_reason: str | None = None
    model: str | None = None
    thinking: str = ""
    raw: Any = None
