"""Every error stepstone raises, in one place.

The tree::

    BaseException
    └── PlanPaused                      a step asks the Plan to halt cooperatively (not an error)
    Exception
    ├── StepstoneError                  base of everything below that is ours
    │   ├── UserError                   you used the API wrong; fix the call, do not retry
    │   │   ├── PlanCompileError        invalid Plan, raised before anything runs
    │   │   ├── GraphCompileError       invalid graph, raised by GraphBuilder.compile()
    │   │   ├── MissingExtraError       an optional dependency is not installed
    │   │   ├── ModelRequestsBlockedError  a real model request while requests are blocked
    │   │   └── StoreKeyConflictError   a key holds a value of another kind (KV vs checkpoint)
    │   ├── StoreError                  the store could not do what was asked
    │   │   └── CheckpointCorruptError  a stored checkpoint cannot be decoded
    │   ├── SerializationError          a value cannot be persisted (strict mode) or a
    │   │                               signed pickle was refused
    │   ├── ToolTimeoutError            a tool exceeded LLMEngine.tool_timeout
    │   ├── StreamStallError            a provider stream went idle past stream_idle_timeout
    │   ├── MaxTurnsExceeded            the LLM loop hit max_turns
    │   ├── AgentCheckpointCorruptionError  an agent-run checkpoint is missing or malformed
    │   ├── NodeException               a graph node raised; __cause__ is the original error
    │   ├── RunCancelledError           an operator cancelled the run (`stepstone cancel`)
    │   └── CheckpointError             a graph checkpoint cannot be used as asked
    │       ├── CheckpointNotFound      no record under that invocation_id
    │       ├── CheckpointRecordInvalid a record cannot be decoded (or its pickle was refused)
    │       └── CheckpointStateMigrationError   a saved state cannot reach the current schema
    │           ├── CheckpointStateMigrationMissing         no chain of registered migrations
    │           ├── CheckpointStateMigrationChainAmbiguous  two shortest chains
    │           └── CheckpointStateMigrationFailed          a migration raised or its output
    │                                                       does not validate
    └── RuntimeError
        ├── PlanRuntimeError            a Plan misbehaved at run time (a route predicate raised)
        │   └── StaleCheckpointError    resume target no longer exists in the Plan
        └── ConcurrentPlanRunError      another live run owns the checkpoint key
            └── ConcurrentGraphResumeError  another live invocation resumes (or runs) the record
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
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointRecordInvalid",
    "CheckpointStateMigrationChainAmbiguous",
    "CheckpointStateMigrationError",
    "CheckpointStateMigrationFailed",
    "CheckpointStateMigrationMissing",
    "ConcurrentGraphResumeError",
    "ConcurrentPlanRunError",
    "GraphCompileError",
    "MaxTurnsExceeded",
    "MissingExtraError",
    "ModelRequestsBlockedError",
    "NodeException",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "RunCancelledError",
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


class GraphCompileError(UserError):
    """A graph is invalid; raised by ``GraphBuilder.compile()`` before any node runs.

    The message names the node (or edge) at fault and how to fix it.
    """


class NodeException(StepstoneError):
    """A graph node raised; this is the error boundary of ``CompiledGraph.invoke()``.

    Every node completed before the failure is already checkpointed when this reaches the
    caller, so ``invoke(..., resume_invocation=exc.invocation_id)`` picks up at the failed
    node.

    Attributes:
        node_name: The node that raised (the innermost one, for a node inside a subgraph).
        recoverable_state: The state of the node's graph as it was just before the node ran.
        invocation_id: The invocation whose record holds the completed nodes (None when the
            graph has no checkpointer).
        namespace: The subgraph path of the node (``()`` for the outermost graph).

    ``__cause__`` is the original exception.

    Example::

        try:
            graph.invoke(state, correlation_id="mission-1")
        except NodeException as exc:
            print(exc.node_name, exc.__cause__)
            graph.invoke(state, resume_invocation=exc.invocation_id)
    """

    def __init__(
        self,
        message: str,
        *,
        node_name: str,
        recoverable_state: object = None,
        invocation_id: str | None = None,
        namespace: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.node_name = node_name
        self.recoverable_state = recoverable_state
        self.invocation_id = invocation_id
        self.namespace = namespace

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_node_exception,
            (
                str(self),
                self.node_name,
                self.recoverable_state,
                self.invocation_id,
                self.namespace,
            ),
        )


def _rebuild_node_exception(
    message: str,
    node_name: str,
    recoverable_state: object,
    invocation_id: str | None,
    namespace: tuple[str, ...],
) -> NodeException:
    return NodeException(
        message,
        node_name=node_name,
        recoverable_state=recoverable_state,
        invocation_id=invocation_id,
        namespace=namespace,
    )


class CheckpointError(StepstoneError):
    """Base of the graph checkpoint errors below."""


class CheckpointNotFound(CheckpointError):
    """No graph checkpoint record exists under the requested ``invocation_id``."""


class CheckpointRecordInvalid(CheckpointError):
    """A graph checkpoint record cannot be decoded or does not fit the graph.

    Also raised when a pickle record is unsigned, tampered with, or signed with another
    key: stepstone never unpickles data it cannot authenticate.
    """


class CheckpointStateMigrationError(CheckpointError):
    """Base of the errors raised while migrating a saved state to the current schema."""


class CheckpointStateMigrationMissing(CheckpointStateMigrationError):
    """No chain of ``with_state_migration`` edges leads from the saved schema version to
    the state class's ``schema_version``."""


class CheckpointStateMigrationChainAmbiguous(CheckpointStateMigrationError):
    """Two different shortest chains of migrations lead to the current schema version."""


class CheckpointStateMigrationFailed(CheckpointStateMigrationError):
    """A migration function raised, returned something else than a dict, or its result
    does not validate against the current state class (``__cause__`` says why)."""


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


class ConcurrentGraphResumeError(ConcurrentPlanRunError):
    """A graph record is being resumed (or is still running) in another live invocation.

    Two resumes of one record never both execute: the second gets this error. Wait for the
    other one, or resume the record it produces.
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


class ModelRequestsBlockedError(UserError):
    """A real model request was made while requests are blocked.

    Raised by provider adapters inside ``stepstone.testing.block_model_requests()`` or when
    the ``STEPSTONE_BLOCK_MODEL_REQUESTS`` environment variable is set. Requests to loopback
    addresses (test servers) stay allowed.
    """


class RunCancelledError(StepstoneError):
    """An operator cancelled this run (``stepstone cancel KEY``) while it ran.

    The owner noticed at its next commit: that step's result was committed, the run was
    marked ``failed`` with this error, and nothing else ran. ``resume=True`` continues it.
    """
