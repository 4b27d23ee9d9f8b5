"""Every error stepstone raises, in one place.

The tree::

    BaseException
    └── PlanPaused                      a step asks the Plan to halt cooperatively (not an error)
    Exception
    ├── StepstoneError                  base of everything below that is ours
    │   ├── UserError                   you used the API wrong; fix the call, do not retry
    │   │   ├── PlanCompileError        invalid Plan, raised before anything runs
    │   │   ├── MissingExtraError       an optional dependency is not installed
    │   │   └── StoreKeyConflictError   a key holds a value of another kind (KV vs checkpoint)
    │   ├── StoreError                  the store could not do what was asked
    │   │   └── CheckpointCorruptError  a stored checkpoint cannot be decoded
    │   ├── SerializationError          a value cannot be persisted (strict mode) or a
    │   │                               signed pickle was refused
    │   ├── ToolTimeoutError            a tool exceeded LLMEngine.tool_timeout
    │   ├── StreamStallError            a provider stream went idle past stream_idle_timeout
    │   ├── MaxTurnsExceeded            the LLM loop hit max_turns
    │   └── AgentCheckpointCorruptionError  an agent-run checkpoint is missing or malformed
    └── RuntimeError
        ├── PlanRuntimeError            a Plan misbehaved at run time (a route predicate raised)
        │   └── StaleCheckpointError    resume target no longer exists in the Plan
        └── ConcurrentPlanRunError      another live run owns the checkpoint key
    Warning
    └── UserWarning
        └── UnserializableValueWarning  a value JSON cannot hold was stored as its str()

Messages name the ids involved and the fix. Every error pickles (its constructor
arguments are kept in ``args``) so it can cross process boundaries.
"""

from __future__ import annotations

__all__ = [
    "AgentCheckpointCorruptionError",
    "CheckpointCorruptError",
    "ConcurrentPlanRunError",
    "MaxTurnsExceeded",
    "MissingExtraError",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "SerializationError",
    "StaleCheckpointError",
    "StepstoneError",
    "StoreError",
    "StoreKeyConflictError",
    "StreamStallError",
    "ToolTimeoutError",
    "UnserializableValueWarning",
    "UserError",
]


class StepstoneError(Exception):
    """Base class of stepstone's own errors (except the RuntimeError family)."""


class UserError(StepstoneError):
    """The API was used wrongly; the message says how to call it instead."""


class PlanCompileError(UserError):
    """A Plan is invalid. Raised at construction, before any step or LLM call runs."""


class MissingExtraError(UserError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package!r} is not installed; install it with `pip install stepstone[{extra}]`"
        )
        self.package = package
        self.extra = extra

    def __reduce__(self) -> tuple[type[MissingExtraError], tuple[str, str]]:
        return (type(self), (self.package, self.extra))


class StoreKeyConflictError(UserError):
    """A store key already holds a value of another kind (a plain value vs a checkpoint)."""


class StoreError(StepstoneError):
    """The store could not complete an operation."""


class CheckpointCorruptError(StoreError):
    """A stored checkpoint exists but cannot be decoded; the message names the key."""


class SerializationError(StepstoneError):
    """A value cannot be persisted (``strict=True``), or a signed pickle was refused."""


class ToolTimeoutError(StepstoneError):
    """A tool ran longer than ``LLMEngine.tool_timeout``.

    The LLM engine reports it to the model as an ``is_error`` tool result; the run goes on.
    """


class StreamStallError(StepstoneError):
    """A provider stream sent nothing for longer than ``stream_idle_timeout`` seconds."""


class MaxTurnsExceeded(StepstoneError):
    """The LLM tool-calling loop used all of ``max_turns`` without a final answer."""


class AgentCheckpointCorruptionError(StepstoneError):
    """An agent-run checkpoint is missing, malformed, or its recorded effects disagree."""


class PlanRuntimeError(RuntimeError):
    """A Plan misbehaved at run time in a way that is a programming bug.

    The canonical case is a ``Step(routes={...})`` predicate that raises; the message names
    the step and the route target, and ``__cause__`` is the original exception.
    """


class StaleCheckpointError(PlanRuntimeError):
    """A saved checkpoint points at a step the current Plan does not have."""


class ConcurrentPlanRunError(RuntimeError):
    """Another live run owns this checkpoint key (same process, another process or host).

    A run is live while its owner renews its lease; a run whose owner died (lease expired,
    or its process is gone on this host) can be taken over with ``resume=True``.
    """


class PlanPaused(BaseException):
    """Raised by a step to halt the Plan and persist a resumable checkpoint.

    Derives from ``BaseException`` so ``except Exception`` in user code does not swallow
    it. The Plan writes ``status="paused"`` with ``next_step`` at the paused step (or its
    parallel band's first step) and returns an Envelope whose error is
    ``ErrorInfo(type="PlanPaused", retryable=True)``. A later ``resume=True`` run re-invokes
    the paused step.

    Example::

        def wait_for_approval(task: str) -> str:
            if not approved(task):
                raise PlanPaused("waiting for human approval")
            return task
    """

    def __init__(self, message: str = "Plan paused") -> None:
        super().__init__(message)
        self.message = message


class UnserializableValueWarning(UserWarning):
    """A value JSON cannot hold was persisted as ``str(value)``; the message names where.

    Pass ``strict=True`` (to ``Plan``) to make this a :class:`SerializationError` instead.
    """
