"""The Envelope: what flows between steps, agents and tools."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Generic, TypeVar

from stepstone.core._serialization import (
    ENCODING_VERSION,
    from_typed_json,
    is_model,
    to_typed_json,
)

__all__ = ["TRANSIENT_BUILTINS", "Envelope", "ErrorInfo", "is_retryable"]

T = TypeVar("T")

#: The one default for exceptions that don't say whether they are retryable: the builtin
#: transient failures (timeouts, refused/reset connections). Everything else is not
#: retryable unless the raising code sets ``exc.retryable = True`` (or a class attribute).
TRANSIENT_BUILTINS: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)


def is_retryable(exc: BaseException) -> bool:
    """Whether running the same thing again may succeed, as the raising code says.

    ``exc.retryable`` (an instance or class attribute, a bool) wins: stepstone's own code
    sets it (``PlanPaused`` is retryable; the LLM engine marks a provider error it gave up
    on with its own transient/permanent verdict). Without it, :data:`TRANSIENT_BUILTINS`
    are retryable and nothing else is; class names are never consulted.
    """
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):
        return flag
    return isinstance(exc, TRANSIENT_BUILTINS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """What went wrong in a step, agent or tool.

    Attributes:
        type: The exception class name (``"ValueError"``, ``"PlanPaused"``...).
        message: The exception message.
        retryable: Whether running the same thing again may succeed (a pause, a rate limit),
            as the raising code said: see :func:`is_retryable`.
    """

    type: str
    message: str
    retryable: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"type": self.type, "message": self.message, "retryable": self.retryable}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErrorInfo:
        """Rebuild from :meth:`to_dict` output."""
        return cls(
            type=str(data["type"]),
            message=str(data.get("message", "")),
            retryable=bool(data.get("retryable", False)),
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class Envelope(Generic[T]):
    """A task, its context, the payload produced for it, metadata and an optional error.

    Example::

        env = Envelope.from_task("summarise the Q3 report")
        env.task      # "summarise the Q3 report"
        env.payload   # the same string: the first step's ``from_prev`` resolves to it
        env.ok        # True
    """

    task: str | None = None
    context: str | None = None
    payload: T = None  # type: ignore[assignment]  # None until a step produces one
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        """True when the envelope carries no error."""
        return self.error is None

    def text(self) -> str:
        """The payload as text: strings as they are, models and data as JSON."""
        return payload_text(self.payload)

    @classmethod
    def from_task(cls, task: str, *, context: str | None = None) -> Envelope[Any]:
        """Wrap a user task; sets both ``task`` and ``payload`` so ``from_prev`` sees it."""
        return Envelope(task=task, context=context, payload=task)

    @classmethod
    def error_envelope(
        cls,
        exc: BaseException,
        *,
        retryable: bool | None = None,
        task: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Envelope[Any]:
        """An envelope whose ``error`` describes ``exc``.

        ``retryable`` defaults to :func:`is_retryable` (``exc.retryable`` when the raising
        code set it, else the builtin default).
        """
        if retryable is None:
            retryable = is_retryable(exc)
        message = getattr(exc, "message", None)
        if not isinstance(message, str):
            message = str(exc)
        return Envelope(
            task=task,
            payload=None,
            metadata=dict(metadata or {}),
            error=ErrorInfo(type=type(exc).__name__, message=message, retryable=retryable),
        )

    def to_dict(self, *, where: str = "envelope", strict: bool = False) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` turns back into an equal envelope.

        Payload and metadata use the type-tagged encoding (``"encoding": 2``): pydantic
        models, dataclasses, ``datetime``, ``Decimal``, ``UUID``, bytes, paths, enums, sets
        and tuples load back as themselves. Other values JSON cannot hold are stringified
        with a warning naming ``where`` (``strict=True`` raises instead).
        """
        out: dict[str, Any] = {
            "task": self.task,
            "payload": to_typed_json(self.payload, where=f"{where}.payload", strict=strict),
            "encoding": ENCODING_VERSION,
        }
        if self.context is not None:
            out["context"] = self.context
        if self.metadata:
            out["metadata"] = to_typed_json(self.metadata, where=f"{where}.metadata", strict=strict)
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Envelope[Any]:
        """Rebuild from :meth:`to_dict` output (either encoding version)."""
        error = data.get("error")
        version = int(data.get("encoding") or 1)
        metadata = from_typed_json(data.get("metadata"), version=version) or {}
        return Envelope(
            task=data.get("task"),
            context=data.get("context"),
            payload=from_typed_json(data.get("payload"), version=version),
            metadata=dict(metadata),
            error=ErrorInfo.from_dict(error) if error else None,
        )


def payload_text(payload: Any) -> str:
    """Render any payload as text (used for tasks, contexts and ``Envelope.text``)."""
    if payload is None:
        return ""
    if isinstance(payload, str):
        return payload
    if is_model(payload):
        return payload.model_dump_json()
    if isinstance(payload, Envelope):
        return payload.text()
    try:
        return json.dumps(payload, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(payload)
