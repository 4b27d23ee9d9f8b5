"""Every error stepstone raises, in one place.

The tree::

    BaseException
    ├── PlanPaused                      a step asks the Plan to halt cooperatively (not an error)
    └── RunParked                       a waiting run gives its worker's slot back (not an error)
    Exception
    └── StepstoneError                  base of every error stepstone raises
        ├── UserError                   you used the API wrong; fix the call, do not retry
        │   ├── ConfigurationError (+ValueError)     a bad argument value (LLMEngine, Store...)
        │   │   └── ConfigurationTypeError (+TypeError)  an argument of the wrong type
        │   ├── PlanCompileError        invalid Plan, raised before anything runs
        │   ├── GraphCompileError       invalid graph, raised by GraphBuilder.compile()
        │   ├── MissingExtraError (+ImportError)  an optional dependency is not installed
        │   ├── ModelRequestsBlockedError  a real model request while requests are blocked
        │   ├── ApprovalTargetError     an approval names no paused run or no call it waits on
        │   ├── RunFinishedError        a message sent to a run that finished (none would read it)
        │   └── StoreKeyConflictError   a key holds a value of another kind (KV vs checkpoint)
        ├── ConcurrentRunError (+RuntimeError)   another live run owns the run record
        │   ├── ConcurrentPlanRunError  the same, raised to Plan users (checkpoint_key)
        │   └── ConcurrentGraphResumeError  another live invocation resumes (or runs) a record
        ├── StoreError                  the store could not do what was asked
        │   ├── StoreDamagedError       the store's data is damaged (malformed pages...)
        │   ├── StoreFullError          the disk holding the store is full
        │   └── CorruptRecordError      a stored run record cannot be decoded or used
        │       ├── CheckpointCorruptError          a Plan checkpoint
        │       ├── CheckpointRecordInvalid         a graph record (also a CheckpointError)
        │       ├── AgentCheckpointCorruptionError  an agent-run checkpoint, or its effects
        │       └── WorkflowCorruptError            a workflow run's journal
        ├── PlanRuntimeError (+RuntimeError)  a Plan misbehaved at run time (a route raised)
        │   └── StaleCheckpointError    resume target no longer exists in the Plan
        ├── SerializationError          a value cannot be persisted (strict mode) or a
        │                               signed pickle was refused
        ├── ToolTimeoutError            a tool exceeded LLMEngine.tool_timeout
        ├── StreamStallError            a provider stream went idle past stream_idle_timeout
        ├── MaxTurnsExceeded            the LLM loop hit max_turns
        ├── MaxRoundsExceeded           a ReplanEngine run hit max_rounds
        ├── EffectInDoubtError          a non-idempotent call started before a crash, outcome
        │                               unknown (the tool's or step's in_doubt="fail")
        ├── ApprovalPendingError        a workflow run stopped on tool calls that need an
        │                               approval (pydantic-ai, OpenAI Agents SDK runs)
        ├── NonDeterministicWorkflowError  a resumed workflow called another step (or other
        │                               arguments) at a position its journal recorded
        ├── ReplayedStepError           a step's recorded error, replayed where its exception
        │                               class cannot be rebuilt
        ├── CheckpointFlushError        an agent run's terminal checkpoint flush failed or
        │                               timed out
        ├── PlannerOutputError          a ReplanEngine planner answered something else than
        │                               a PlanRound
        ├── ModelAPIError               a provider request failed (retryable, retry_after,
        │   │                           retry_at say whether and when to try again)
        │   ├── ModelRateLimitError     429 / rate-limit error events
        │   ├── ModelOverloadedError    529 / overloaded error events
        │   └── IncompleteStreamError   a stream ended without its final event
        ├── ModelOutcomeError           the model answered, but not with a usable answer
        │   ├── ModelRefusalError       refusal, content filter, safety block
        │   └── ModelLengthError        the answer was cut off at the output-token cap
        ├── UsageLimitExceeded          a run's token / cost / request budget is spent
        ├── NodeException               a graph node raised; __cause__ is the original error
        │   ├── ReducerError (+TypeError)   a field's reducer refused a node's update
        │   ├── StateValidationError (+ValueError)  an update does not fit the state
        │   ├── EdgeException           a conditional edge's router raised
        │   └── RoutingError            a router returned something not among its targets
        ├── QueuedRunError              a queued run ended without a result (or is unknown)
        ├── RunCancelledError           an operator cancelled the run while it ran
        └── CheckpointError             a graph checkpoint cannot be used as asked
            ├── CheckpointNotFound      no record under that invocation_id
            ├── CheckpointSaveFailed    a checkpoint could not be saved after a node
            ├── CheckpointRecordInvalid (see CorruptRecordError above)
            └── CheckpointStateMigrationError   a saved state cannot reach the current schema
                ├── CheckpointStateMigrationMissing         no chain of registered migrations
                ├── CheckpointStateMigrationChainAmbiguous  two shortest chains
                └── CheckpointStateMigrationFailed          a migration raised or its output
                                                            does not validate
    Warning
    └── UserWarning
        └── UnserializableValueWarning  a value JSON cannot hold was stored as its str()

Every class has a ``category``: a stable snake_case string (``"reducer_error"``,
``"checkpoint_not_found"``...) to log, count or match on instead of a class name.
Migration errors also carry ``from_version`` and ``to_version``.

``(+X)`` marks a builtin base kept so callers that catch ``X`` keep working: a bad argument
is still a ``ValueError``, a live owner still a ``RuntimeError``.

``except StepstoneError`` catches everything stepstone raises; ``except UserError`` catches
misuse (fix the code, do not retry); ``except ConcurrentRunError`` catches every ownership
conflict, whatever the engine; ``except CorruptRecordError`` every record that cannot be read.

Messages name the ids involved and the fix. Every error pickles (its constructor
arguments are kept in ``args``) so it can cross process boundaries.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AgentCheckpointCorruptionError",
    "ApprovalPendingError",
    "ApprovalTargetError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFlushError",
    "CheckpointNotFound",
    "CheckpointRecordInvalid",
    "CheckpointSaveFailed",
    "CheckpointStateMigrationChainAmbiguous",
    "CheckpointStateMigrationError",
    "CheckpointStateMigrationFailed",
    "CheckpointStateMigrationMissing",
    "ConcurrentGraphResumeError",
    "ConcurrentPlanRunError",
    "ConcurrentRunError",
    "ConfigurationError",
    "ConfigurationTypeError",
    "CorruptRecordError",
    "EdgeException",
    "EffectInDoubtError",
    "GraphCompileError",
    "IncompleteStreamError",
    "MaxRoundsExceeded",
    "MaxTurnsExceeded",
    "MissingExtraError",
    "ModelAPIError",
    "ModelLengthError",
    "ModelOutcomeError",
    "ModelOverloadedError",
    "ModelRateLimitError",
    "ModelRefusalError",
    "ModelRequestsBlockedError",
    "NodeException",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "PlannerOutputError",
    "QueuedRunError",
    "ReducerError",
    "RoutingError",
    "RunCancelledError",
    "RunFinishedError",
    "RunParked",
    "SerializationError",
    "StaleCheckpointError",
    "StateValidationError",
    "StepstoneError",
    "StoreDamagedError",
    "StoreError",
    "StoreFullError",
    "StoreKeyConflictError",
    "StreamStallError",
    "ToolTimeoutError",
    "UnserializableValueWarning",
    "UsageLimitExceeded",
    "UserError",
    "NonDeterministicWorkflowError",
    "ReplayedStepError",
    "WorkflowCorruptError",
]


class StepstoneError(Exception):
    """Base class of every error stepstone raises (``PlanPaused`` is a signal, not an error)."""

    category: ClassVar[str] = "error"


class UserError(StepstoneError):
    """The API was used wrongly; the message says how to call it instead."""

    category: ClassVar[str] = "user_error"


class RunFinishedError(UserError):
    """A message was sent to a run that has finished (``done``): no receive would ever
    read it, so nothing was stored."""

    category: ClassVar[str] = "run_finished"


class ConfigurationError(UserError, ValueError):
    """An argument has a value stepstone cannot accept; the message names it and the fix.

    Still a ``ValueError``, so ``except ValueError`` around a constructor keeps working.
    """

    category: ClassVar[str] = "configuration_error"


class ConfigurationTypeError(ConfigurationError, TypeError):
    """An argument has the wrong type (also a ``TypeError``)."""

    category: ClassVar[str] = "configuration_type_error"


class PlanCompileError(UserError):
    """A Plan is invalid. Raised at construction, before any step or LLM call runs."""

    category: ClassVar[str] = "plan_compile_error"


class MissingExtraError(UserError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    category: ClassVar[str] = "missing_extra"

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

    category: ClassVar[str] = "store_key_conflict"


class StoreError(StepstoneError):
    """The store could not complete an operation."""

    category: ClassVar[str] = "store_error"


class StoreDamagedError(StoreError):
    """The store's data is damaged (SQLite reports malformed pages; PostgreSQL, damaged
    data or a damaged index); the message names the store and how to check and recover it.
    The operation that met the damage wrote nothing."""

    category: ClassVar[str] = "store_damaged"


class StoreFullError(StoreError):
    """The disk holding the store (its SQLite file, or the PostgreSQL server's data) is
    full; nothing of the operation was written. A run stopped by it continues after its
    last committed step once there is space again (``resume=True``)."""

    category: ClassVar[str] = "store_full"


class CorruptRecordError(StoreError):
    """A stored run record exists but cannot be decoded or used; the message names the key
    (or run id) and what is wrong with it. Each engine raises its own subclass.

    Attributes:
        fault: What is wrong, without the key and the fix, where the store found it (a
            journal row that does not match its checksum, say); else None.
    """

    category: ClassVar[str] = "corrupt_record"

    fault: str | None = None


class CheckpointCorruptError(CorruptRecordError):
    """A stored Plan checkpoint exists but cannot be decoded; the message names the key."""

    category: ClassVar[str] = "plan_checkpoint_corrupt"


class SerializationError(StepstoneError):
    """A value cannot be persisted (``strict=True``), or a signed pickle was refused."""

    category: ClassVar[str] = "serialization_error"


class ToolTimeoutError(StepstoneError):
    """A tool ran longer than ``LLMEngine.tool_timeout``.

    The LLM engine reports it to the model as an ``is_error`` tool result; the run goes on.
    """

    category: ClassVar[str] = "tool_timeout"


class StreamStallError(StepstoneError):
    """A provider stream sent nothing for longer than ``stream_idle_timeout`` seconds."""

    category: ClassVar[str] = "stream_stall"


class ModelAPIError(StepstoneError):
    """A provider request failed after the engine's retries (or could not be retried).

    Attributes:
        provider: The provider name (``"anthropic"``...).
        model: The model id of the request.
        kind: What the failure is: ``"rate_limit"``, ``"overloaded"``, ``"server"``,
            ``"connection"``, ``"timeout"``, ``"incomplete_stream"``, ``"invalid_response"``
            (an HTTP 200 whose body is not valid JSON: cut off or damaged on the way),
            ``"bad_request"``, ``"auth"``, ``"not_found"`` or ``"other"``.
        status: The HTTP status (None for transport failures and stream events).
        retryable: Whether trying again later can succeed.
        retry_after: Seconds the server asked to wait (None: it did not say).
        retry_at: When (UTC POSIX seconds) the step may be tried again: set when the wait the
            server asked for is longer than ``LLMEngine(max_retry_wait=...)``, so a durable
            run can be resumed then instead of sleeping with its lease held.
    """

    category: ClassVar[str] = "model_api_error"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        kind: str = "other",
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        retry_at: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.model = model
        self.kind = kind
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.retry_at = retry_at

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


class ModelRateLimitError(ModelAPIError):
    """The provider rate-limited the request (HTTP 429 or a rate-limit stream event)."""

    category: ClassVar[str] = "model_rate_limit"


class ModelOverloadedError(ModelAPIError):
    """The provider is overloaded (Anthropic 529 / ``overloaded_error``, Gemini 503)."""

    category: ClassVar[str] = "model_overloaded"


class IncompleteStreamError(ModelAPIError):
    """A provider stream ended without its terminal event; the partial answer was dropped."""

    category: ClassVar[str] = "incomplete_stream"


class ModelOutcomeError(StepstoneError):
    """The model answered, but with an outcome that is not a usable answer. Not retryable.

    Attributes:
        provider: The provider name.
        model: The model id.
        stop_reason: The normalised stop reason (``"refusal"``, ``"content_filter"``,
            ``"length"``...).
        raw_stop_reason: The provider's own value (``"max_tokens"``, ``"SAFETY"``...).
        text: What the model said (a refusal's explanation, the truncated answer).
    """

    category: ClassVar[str] = "model_outcome"

    retryable = False
    retry_after: float | None = None
    retry_at: float | None = None

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        stop_reason: str | None = None,
        raw_stop_reason: str | None = None,
        text: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.model = model
        self.stop_reason = stop_reason
        self.raw_stop_reason = raw_stop_reason
        self.text = text

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


class ModelRefusalError(ModelOutcomeError):
    """The model refused, or the provider's content filter / safety system blocked it."""

    category: ClassVar[str] = "model_refusal"


class ModelLengthError(ModelOutcomeError):
    """The answer was cut off at the output-token cap (raise ``max_tokens``, or pass
    ``LLMEngine(continue_on_length=N)`` to ask the model to go on)."""

    category: ClassVar[str] = "model_length"


class UsageLimitExceeded(StepstoneError):
    """A run reached one of its ``UsageLimits``; raised before the next model request.

    Attributes:
        limit: Which limit (``"max_requests"``, ``"max_input_tokens"``,
            ``"max_output_tokens"``, ``"max_total_tokens"``, ``"max_cost_usd"``).
        value: The run's value for that limit when it stopped.
        maximum: The configured cap.
    """

    category: ClassVar[str] = "usage_limit_exceeded"

    retryable = False

    def __init__(
        self, message: str, *, limit: str = "", value: float = 0, maximum: float = 0
    ) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.value = value
        self.maximum = maximum

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


def _rebuild(cls: type[Exception], message: str, state: dict[str, Any]) -> Exception:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class MaxTurnsExceeded(StepstoneError):
    """The LLM tool-calling loop used all of ``max_turns`` without a final answer."""

    category: ClassVar[str] = "max_turns_exceeded"


class AgentCheckpointCorruptionError(CorruptRecordError):
    """An agent-run checkpoint is missing, malformed, or its recorded effects disagree."""

    category: ClassVar[str] = "agent_checkpoint_corrupt"


class EffectInDoubtError(StepstoneError):
    """A tool or workflow step declared ``in_doubt="fail"`` started before a crash and has
    no recorded outcome.

    The message names the run, the call and where it was made; the call is not run
    again (it may or may not have taken effect).
    """

    category: ClassVar[str] = "effect_in_doubt"


class ApprovalPendingError(StepstoneError):
    """A workflow run stopped on tool calls that need a person's approval (an agent of the
    pydantic-ai or OpenAI Agents SDK integrations, ``stepstone.integrations``).

    Each pending call is recorded in the run's journal; approve (or deny) it with
    ``stepstone approve KEY CALL_ID`` from any process, then run the key again: the run
    resumes and the call runs (or the model reads the refusal).

    Attributes:
        calls: The pending calls, ``[{"call_id", "tool", "arguments"}]``.
    """

    category: ClassVar[str] = "approval_pending"

    def __init__(self, message: str, calls: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.calls = list(calls or [])

    def __reduce__(self) -> tuple[type[ApprovalPendingError], tuple[str, list[dict[str, Any]]]]:
        return (type(self), (str(self), self.calls))


class WorkflowCorruptError(CorruptRecordError):
    """A workflow run's journal cannot be read back (a malformed or damaged row)."""

    category: ClassVar[str] = "workflow_corrupt"


class NonDeterministicWorkflowError(StepstoneError):
    """A resumed workflow did not call what its journal recorded at a position.

    The message names the run, the position, the recorded call and the current one, and
    the ways out: ``stepstone.patched("id")`` around the change, or a new key.
    """

    category: ClassVar[str] = "workflow_nondeterministic"


class ReplayedStepError(StepstoneError):
    """The recorded error of a step (or child workflow), replayed where its exception class
    cannot be imported or rebuilt from its arguments.

    Attributes:
        type: The original exception's class, ``"module:QualName"``.
        message: Its text.
    """

    category: ClassVar[str] = "replayed_step_error"

    def __init__(self, message: str, type: str = "Exception") -> None:
        super().__init__(message, type)
        self.message = message
        self.type = type

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


class CheckpointFlushError(StepstoneError):
    """An agent run's buffered checkpoint records could not be committed at its end
    (the flush failed or exceeded ``RunnerConfig.checkpoint_flush_timeout_s``)."""

    category: ClassVar[str] = "checkpoint_flush_failed"


class GraphCompileError(UserError):
    """A graph is invalid; raised by ``GraphBuilder.compile()`` before any node runs.

    The message names the node (or edge) at fault and how to fix it.
    """

    category: ClassVar[str] = "graph_compile_error"


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

    category: ClassVar[str] = "node_exception"

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

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class ReducerError(NodeException, TypeError):
    """A field's reducer refused a node's update (``append`` given something that is not a
    list, ``merge`` a value that is not a dict...). Also a ``TypeError``.

    Attributes:
        field: The state field whose reducer failed.
        reducer: The reducer's name (``"append"``, ``"merge"``...).

    ``__cause__`` is the reducer's own error. The node's update was not applied or saved.
    """

    category: ClassVar[str] = "reducer_error"

    def __init__(
        self,
        message: str,
        *,
        node_name: str = "",
        field: str = "",
        reducer: str = "",
        recoverable_state: object = None,
        invocation_id: str | None = None,
        namespace: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            message,
            node_name=node_name,
            recoverable_state=recoverable_state,
            invocation_id=invocation_id,
            namespace=namespace,
        )
        self.field = field
        self.reducer = reducer


class StateValidationError(NodeException, ValueError):
    """A node's update does not fit the state: an unknown field, or a new state that does
    not validate. Also a ``ValueError``; ``__cause__`` is pydantic's error, if any."""

    category: ClassVar[str] = "state_validation_error"


class EdgeException(NodeException):
    """The router of a conditional edge raised. ``node_name`` is the node the edge leaves
    (its completion is saved first); ``__cause__`` is the router's error."""

    category: ClassVar[str] = "edge_exception"


class RoutingError(NodeException):
    """A router returned something that is not one of its targets (an unknown node name,
    a value missing from its ``targets`` mapping). ``node_name`` is the node it leaves."""

    category: ClassVar[str] = "routing_error"


class CheckpointError(StepstoneError):
    """Base of the graph checkpoint errors below."""

    category: ClassVar[str] = "checkpoint_error"


class CheckpointNotFound(CheckpointError):
    """No graph checkpoint record exists under the requested ``invocation_id``."""

    category: ClassVar[str] = "checkpoint_not_found"


class CheckpointSaveFailed(CheckpointError):
    """A graph checkpoint could not be saved after a node (or a fan-out branch) completed.

    ``__cause__`` is the checkpointer's error. The node's update is not in the record, so
    resuming runs that node again. Ownership conflicts keep their own type
    (:class:`ConcurrentRunError`, :class:`RunCancelledError`).

    Attributes:
        invocation_id: The invocation whose save failed.
        node_name: The node whose completion was being saved.
    """

    category: ClassVar[str] = "checkpoint_save_failed"

    def __init__(
        self, message: str, *, invocation_id: str | None = None, node_name: str = ""
    ) -> None:
        super().__init__(message)
        self.invocation_id = invocation_id
        self.node_name = node_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class CheckpointRecordInvalid(CheckpointError, CorruptRecordError):
    """A graph checkpoint record cannot be decoded or does not fit the graph.

    Also raised when a pickle record is unsigned, tampered with, or signed with another
    key: stepstone never unpickles data it cannot authenticate.
    """

    category: ClassVar[str] = "checkpoint_record_invalid"


class CheckpointStateMigrationError(CheckpointError):
    """Base of the errors raised while migrating a saved state to the current schema.

    Attributes:
        from_version: The ``schema_version`` the record was saved at.
        to_version: The ``schema_version`` of the state class it was loaded into.
    """

    category: ClassVar[str] = "checkpoint_state_migration"

    def __init__(
        self, message: str, *, from_version: str | None = None, to_version: str | None = None
    ) -> None:
        super().__init__(message)
        self.from_version = from_version
        self.to_version = to_version

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class CheckpointStateMigrationMissing(CheckpointStateMigrationError):
    """No chain of ``with_state_migration`` edges leads from the saved schema version to
    the state class's ``schema_version``."""

    category: ClassVar[str] = "checkpoint_state_migration_missing"


class CheckpointStateMigrationChainAmbiguous(CheckpointStateMigrationError):
    """Two different shortest chains of migrations lead to the current schema version."""

    category: ClassVar[str] = "checkpoint_state_migration_chain_ambiguous"


class CheckpointStateMigrationFailed(CheckpointStateMigrationError):
    """A migration function raised, returned something else than a dict, or its result
    does not validate against the current state class (``__cause__`` says why)."""

    category: ClassVar[str] = "checkpoint_state_migration_failed"


class PlanRuntimeError(StepstoneError, RuntimeError):
    """A Plan misbehaved at run time in a way that is a programming bug.

    The canonical case is a ``Step(routes={...})`` predicate that raises; the message names
    the step and the route target, and ``__cause__`` is the original exception.
    """

    category: ClassVar[str] = "plan_runtime_error"


class StaleCheckpointError(PlanRuntimeError):
    """A saved checkpoint points at a step the current Plan does not have."""

    category: ClassVar[str] = "stale_checkpoint"


class ConcurrentRunError(StepstoneError, RuntimeError):
    """Another live run owns this run record (same process, another process or host).

    Raised by the durable kernel for every engine: claiming a record whose owner is alive,
    or committing to a record this run no longer owns (its lease expired and another run
    took over, or the record was deleted). A run is live while its owner renews its lease;
    a run whose owner died (lease expired, or its process is gone on this host) can be
    taken over by a resume. Nothing is written when this is raised.
    """

    category: ClassVar[str] = "concurrent_run"


class ConcurrentPlanRunError(ConcurrentRunError):
    """Another live run owns this Plan's ``checkpoint_key`` (the Plan-facing name of
    :class:`ConcurrentRunError`; its message speaks of Plan options)."""

    category: ClassVar[str] = "concurrent_plan_run"


class ConcurrentGraphResumeError(ConcurrentRunError):
    """A graph record is being resumed (or is still running) in another live invocation.

    Two resumes of one record never both execute: the second gets this error. Wait for the
    other one, or resume the record it produces.
    """

    category: ClassVar[str] = "concurrent_graph_resume"


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

    category: ClassVar[str] = "plan_paused"

    retryable = True  # a pause waits for something external: resuming may succeed

    def __init__(
        self, message: str = "Plan paused", *, pending_approvals: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        #: For an LLM step paused on tool calls that need approval: one dict per call
        #: (``call_id, tool, arguments, turn, index, reason``); the paused envelope's
        #: ``metadata["pending_approvals"]`` shows them.
        self.pending_approvals: list[Any] = list(pending_approvals or [])


class RunParked(BaseException):
    """A signal, not an error: the run waits (a durable sleep, a receive) longer than the
    worker running it keeps a slot for a waiting run (``Worker(park_after=...)``), so it
    stops here and its worker puts its queue entry back, runnable at ``wake_at`` or when a
    message on one of ``topics`` arrives. The wait is recorded in the run's journal: when a
    worker takes the run again, it resumes into the same wait, which is then over or
    shorter.

    Derives from ``BaseException`` so ``except Exception`` in user code does not swallow
    it. Only raised inside runs a worker runs.

    Attributes:
        key: The waiting run's key.
        wake_at: Until when it waits (unix time, the database's clock); None: no time
            limit (a receive without a timeout).
        topics: The topics whose next message ends the wait.
    """

    category: ClassVar[str] = "run_parked"

    def __init__(
        self, key: str, wake_at: float | None = None, topics: tuple[str, ...] = ()
    ) -> None:
        until = "no time limit" if wake_at is None else f"until {wake_at:.3f}"
        on = f", or a message on {', '.join(map(repr, topics))}" if topics else ""
        super().__init__(f"run {key!r} waits ({until}{on}): parked by its worker")
        self.key = key
        self.wake_at = wake_at
        self.topics = topics

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.wake_at, self.topics))


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

    category: ClassVar[str] = "model_requests_blocked"


class MaxRoundsExceeded(StepstoneError):
    """A ReplanEngine run reached ``max_rounds`` without its planner answering ``done=True``.

    Surfaces as an error envelope and leaves the run ``failed``; a ``resume=True`` run with
    a higher ``max_rounds`` continues from the last round.
    """

    category: ClassVar[str] = "max_rounds_exceeded"


class PlannerOutputError(StepstoneError):
    """A ReplanEngine planner returned something other than a ``PlanRound``.

    Surfaces as an error envelope naming the planner and what it returned; the run is left
    ``failed`` at that round, and a ``resume=True`` run asks the planner again.
    """

    category: ClassVar[str] = "planner_output"


class QueuedRunError(StepstoneError):
    """A queued run ended without a result (cancelled, its target could not be loaded, or
    its workers kept dying), or its id is unknown."""

    category: ClassVar[str] = "queued_run"


class RunCancelledError(StepstoneError):
    """An operator cancelled this run (``stepstone cancel KEY``) while it ran.

    The owner noticed at its next commit: that step's result was committed, the run was
    marked ``failed`` with this error, and nothing else ran. ``resume=True`` continues it.
    """

    category: ClassVar[str] = "run_cancelled"


class ApprovalTargetError(UserError):
    """An approval decision (``stepstone approve``, the inspector's Approve button) names a
    run that does not exist, is not paused on a tool approval, or does not wait for that
    call id; the message lists the ids the run waits for."""

    category: ClassVar[str] = "approval_target"
