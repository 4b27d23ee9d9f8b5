"""stepstone: durable LLM-agent pipelines.

Every step of a pipeline (a Plan step, a graph node, an LLM turn, a tool call) is committed
to a store before the next one starts, so a crash, a deploy, a rate limit or a pause for
human approval costs one step, never the whole run.

Example::

    from stepstone import Agent, Plan, Step, Store

    store = Store(db="pipeline.sqlite")
    plan = Plan(Step(extract, writes="raw"), Step(transform, writes="clean"),
                store=store, checkpoint_key="etl-2026-04-30", resume=True)
    Agent(engine=plan)("today's batch")
"""

from stepstone.agent import Agent
from stepstone.core import (
    Envelope,
    ErrorInfo,
    RunContext,
    RunLocation,
    SignedPickle,
    Tool,
    ToolContext,
    from_parallel,
    from_parallel_all,
    from_prev,
    from_start,
    from_step,
    tool,
)
from stepstone.durable._messages import RunOutcome, StreamItem, StreamReader, asend, send
from stepstone.durable._queue import RunHandle, prune_queue, set_queue_limits, submit
from stepstone.durable._schedules import Schedule, ScheduleInfo, list_schedules, schedule
from stepstone.durable._time import recv, set_event, sleep, sleep_until, write_stream
from stepstone.engines import Engine, KeywordEngine
from stepstone.engines._views import register_builtin_views as _register_builtin_views
from stepstone.engines.llm import CacheConfig, LLMEngine, NativeTool, ThinkingConfig, UsageLimits
from stepstone.engines.plan import CHECKPOINT_VERSION, Plan, Step, StepToken
from stepstone.engines.replan import PlanRound, ReplanEngine, ReplanTask, Task
from stepstone.engines.workflow import (
    BoundWorkflow,
    StepContext,
    Workflow,
    WorkflowStep,
    deprecate_patch,
    patched,
    step,
    step_context,
    workflow,
)
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    ApprovalPendingError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointFlushError,
    CheckpointNotFound,
    CheckpointRecordInvalid,
    CheckpointSaveFailed,
    CheckpointStateMigrationChainAmbiguous,
    CheckpointStateMigrationError,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    ConcurrentGraphResumeError,
    ConcurrentPlanRunError,
    ConcurrentRunError,
    ConfigurationError,
    ConfigurationTypeError,
    CorruptRecordError,
    EdgeException,
    EffectInDoubtError,
    GraphCompileError,
    IncompleteStreamError,
    MaxTurnsExceeded,
    MissingExtraError,
    ModelAPIError,
    ModelLengthError,
    ModelOutcomeError,
    ModelOverloadedError,
    ModelRateLimitError,
    ModelRefusalError,
    ModelRequestsBlockedError,
    NodeException,
    NonDeterministicWorkflowError,
    PlanCompileError,
    PlanPaused,
    PlanRuntimeError,
    QueuedRunError,
    ReducerError,
    ReplayedStepError,
    RoutingError,
    RunFinishedError,
    RunParked,
    SerializationError,
    StaleCheckpointError,
    StateValidationError,
    StepstoneError,
    StoreDamagedError,
    StoreError,
    StoreFullError,
    StoreKeyConflictError,
    StreamStallError,
    ToolTimeoutError,
    UnserializableValueWarning,
    UsageLimitExceeded,
    UserError,
    WorkflowCorruptError,
)
from stepstone.observability import Event, EventType, Session
from stepstone.runner import AgentResult, Runner, RunnerConfig, checkpoint_latest_key
from stepstone.store import Store, StoreEntry
from stepstone.worker import Worker

# The one place stepstone's run views are registered (see stepstone.engines._views).
_register_builtin_views()

__version__ = "0.1.0"

__all__ = [
    # pipelines
    "Agent",
    "CHECKPOINT_VERSION",
    "Envelope",
    "ErrorInfo",
    "Plan",
    "Step",
    "StepToken",
    "Store",
    "StoreEntry",
    "from_parallel",
    "from_parallel_all",
    "from_prev",
    "from_start",
    "from_step",
    # adaptive plans
    "PlanRound",
    "ReplanEngine",
    "ReplanTask",
    "Task",
    # tools
    "Tool",
    "ToolContext",
    "tool",
    # llm agents
    "CacheConfig",
    "LLMEngine",
    "NativeTool",
    "ThinkingConfig",
    "UsageLimits",
    # custom engines
    "Engine",
    "KeywordEngine",
    "RunContext",
    "RunLocation",
    # durable functions
    "BoundWorkflow",
    "StepContext",
    "Workflow",
    "WorkflowStep",
    "deprecate_patch",
    "patched",
    "step",
    "step_context",
    "workflow",
    # durable agent runs
    "AgentResult",
    "Runner",
    "RunnerConfig",
    "checkpoint_latest_key",
    # serialization
    "SignedPickle",
    # observability
    "Event",
    "EventType",
    "Session",
    # work queue and workers
    "RunHandle",
    "Worker",
    "prune_queue",
    "set_queue_limits",
    "submit",
    # time and messages
    "RunOutcome",
    "Schedule",
    "ScheduleInfo",
    "StreamItem",
    "StreamReader",
    "asend",
    "list_schedules",
    "recv",
    "schedule",
    "send",
    "set_event",
    "sleep",
    "sleep_until",
    "write_stream",
    # errors
    "AgentCheckpointCorruptionError",
    "ApprovalPendingError",
    "CheckpointCorruptError",
    "CheckpointFlushError",
    "ConcurrentPlanRunError",
    "ConcurrentRunError",
    "ConfigurationError",
    "ConfigurationTypeError",
    "CorruptRecordError",
    "EffectInDoubtError",
    "IncompleteStreamError",
    "MaxTurnsExceeded",
    "MissingExtraError",
    "ModelAPIError",
    "ModelLengthError",
    "ModelOutcomeError",
    "ModelOverloadedError",
    "ModelRateLimitError",
    "ModelRefusalError",
    "ModelRequestsBlockedError",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "QueuedRunError",
    "RunFinishedError",
    "RunParked",
    "SerializationError",
    "StaleCheckpointError",
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
    # typed-graph errors (GraphBuilder, State and the checkpointers are in stepstone.graph)
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointRecordInvalid",
    "CheckpointSaveFailed",
    "CheckpointStateMigrationChainAmbiguous",
    "CheckpointStateMigrationError",
    "CheckpointStateMigrationFailed",
    "CheckpointStateMigrationMissing",
    "ConcurrentGraphResumeError",
    "EdgeException",
    "GraphCompileError",
    "NodeException",
    "ReducerError",
    "RoutingError",
    "StateValidationError",
    # workflow errors
    "NonDeterministicWorkflowError",
    "ReplayedStepError",
    "WorkflowCorruptError",
]
