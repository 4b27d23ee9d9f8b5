"""The effect seam: every model call and every tool call of the LLM loop passes through here.

A durable effect journal (ARCHITECTURE.md, "Effect journal") implements :class:`EffectHandler`
to record intent before and outcome after each call, keyed by :class:`EffectKey`, and to
replay recorded outcomes on resume. The default handler just runs the call.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal, Protocol, TypeVar

from stepstone.durable._hashing import canonical_hash
from stepstone.providers._types import ModelResponse

__all__ = [
    "EffectHandler",
    "EffectKey",
    "PassThroughEffects",
    "bind_call_key",
    "current_call_key",
]

T = TypeVar("T")

_current_key: contextvars.ContextVar[EffectKey | None] = contextvars.ContextVar(
    "stepstone_effect_key", default=None
)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EffectKey:
    """Where an effect sits in a run: ``(run_id, turn, index)`` plus what went in.

    Attributes:
        run_id: The LLM run (one ``LLMEngine.run``/``stream`` call, or the Runner's run).
        kind: ``"model"`` (one LLM completion) or ``"tool"`` (one tool call).
        turn: The loop turn (0-based).
        index: The call's position in the turn (model calls are index 0).
        name: The tool name, or the model id.
        input: The request (model) or the validated arguments (tool).
        call_id: The model's id for a tool call (None for model calls).
        tool: The :class:`~stepstone.core.Tool` being called (None for model calls).
    """

    run_id: str
    kind: Literal["model", "tool"]
    turn: int
    index: int
    name: str
    input: Any
    call_id: str | None = None
    tool: Any = dataclasses.field(default=None, compare=False, repr=False)

    def input_hash(self) -> str:
        """SHA-256 of the canonical JSON of ``input`` (computed on demand): the same in
        every process, sets included (see :func:`stepstone.durable._hashing.canonical_hash`)."""
        return canonical_hash(_jsonable(self.input), separators=(", ", ": "))

    @property
    def idempotency_key(self) -> str:
        """A stable key for this call, to pass to external APIs (same on replay)."""
        return f"{self.run_id}:{self.kind}:{self.turn}:{self.index}"


class EffectHandler(Protocol):
    """Wraps each model call and each tool call (a journal records and replays them)."""

    async def model_call(
        self, key: EffectKey, invoke: Callable[[], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        """Run (or replay) one model completion, retries included."""
        ...

    async def tool_call(self, key: EffectKey, invoke: Callable[[], Awaitable[Any]]) -> Any:
        """Run (or replay) one tool call; exceptions it raises become ``is_error`` results."""
        ...


class PassThroughEffects:
    """The default handler: runs every call, records nothing."""

    async def model_call(
        self, key: EffectKey, invoke: Callable[[], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        """Run the model call."""
        return await invoke()

    async def tool_call(self, key: EffectKey, invoke: Callable[[], Awaitable[Any]]) -> Any:
        """Run the tool call."""
        return await invoke()


def current_call_key() -> EffectKey | None:
    """The :class:`EffectKey` of the tool call running now (None outside a tool call).

    A tool reads ``current_call_key().idempotency_key`` to make external writes idempotent.
    """
    return _current_key.get()


@contextlib.contextmanager
def bind_call_key(key: EffectKey) -> Iterator[None]:
    """Make ``key`` the running call's key inside the block (the engine wraps each tool)."""
    token = _current_key.set(key)
    try:
        yield
    finally:
        _current_key.reset(token)
