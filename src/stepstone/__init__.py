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

import typing as _typing

from stepstone.core._lazy import lazy_attributes as _lazy_attributes
from stepstone.engines._views import register_builtin_views as _register_builtin_views
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

if _typing.TYPE_CHECKING:
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
    from stepstone.engines.llm import (
        CacheConfig,
        LLMEngine,
        NativeTool,
        ThinkingConfig,
        UsageLimits,
    )
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
    from stepstone.observability import Event, EventType, Session
    from stepstone.runner import AgentResult, Runner, RunnerConfig, checkpoint_latest_key
    from stepstone.store import Store, StoreEntry
    from stepstone.worker import Worker

# The public names load on first use (PEP 562): a program that needs a Plan and a Store
# does not pay for importing every engine, the worker and the observability layer.
_LAZY: dict[str, tuple[str, str]] = {
    "Agent": ("stepstone.agent", "Agent"),
    "Envelope": ("stepstone.core", "Envelope"),
    "ErrorInfo": ("stepstone.core", "ErrorInfo"),
    "RunContext": ("stepstone.core", "RunContext"),
    "RunLocation": ("stepstone.core", "RunLocation"),
    "SignedPickle": ("stepstone.core", "SignedPickle"),
    "Tool": ("stepstone.core", "Tool"),
    "ToolContext": ("stepstone.core", "ToolContext"),
    "from_parallel": ("stepstone.core", "from_parallel"),
    "from_parallel_all": ("stepstone.core", "from_parallel_all"),
    "from_prev": ("stepstone.core", "from_prev"),
    "from_start": ("stepstone.core", "from_start"),
    "from_step": ("stepstone.core", "from_step"),
    "tool": ("stepstone.core", "tool"),
    "RunOutcome": ("stepstone.durable._messages", "RunOutcome"),
    "StreamItem": ("stepstone.durable._messages", "StreamItem"),
    "StreamReader": ("stepstone.durable._messages", "StreamReader"),
    "asend": ("stepstone.durable._messages", "asend"),
    "send": ("stepstone.durable._messages", "send"),
    "RunHandle": ("stepstone.durable._queue", "RunHandle"),
    "prune_queue": ("stepstone.durable._queue", "prune_queue"),
    "set_queue_limits": ("stepstone.durable._queue", "set_queue_limits"),
    "submit": ("stepstone.durable._queue", "submit"),
    "Schedule": ("stepstone.durable._schedules", "Schedule"),
    "ScheduleInfo": ("stepstone.durable._schedules", "ScheduleInfo"),
    "list_schedules": ("stepstone.durable._schedules", "list_schedules"),
    "schedule": ("stepstone.durable._schedules", "schedule"),
    "recv": ("stepstone.durable._time", "recv"),
    "set_event": ("stepstone.durable._time", "set_event"),
    "sleep": ("stepstone.durable._time", "sleep"),
    "sleep_until": ("stepstone.durable._time", "sleep_until"),
    "write_stream": ("stepstone.durable._time", "write_stream"),
    "Engine": ("stepstone.engines", "Engine"),
    "KeywordEngine": ("stepstone.engines", "KeywordEngine"),
    "CacheConfig": ("stepstone.engines.llm", "CacheConfig"),
    "LLMEngine": ("stepstone.engines.llm", "LLMEngine"),
    "NativeTool": ("stepstone.engines.llm", "NativeTool"),
    "ThinkingConfig": ("stepstone.engines.llm", "ThinkingConfig"),
    "UsageLimits": ("stepstone.engines.llm", "UsageLimits"),
    "CHECKPOINT_VERSION": ("stepstone.engines.plan", "CHECKPOINT_VERSION"),
    "Plan": ("stepstone.engines.plan", "Plan"),
    "Step": ("stepstone.engines.plan", "Step"),
    "StepToken": ("stepstone.engines.plan", "StepToken"),
    "PlanRound": ("stepstone.engines.replan", "PlanRound"),
    "ReplanEngine": ("stepstone.engines.replan", "ReplanEngine"),
    "ReplanTask": ("stepstone.engines.replan", "ReplanTask"),
    "Task": ("stepstone.engines.replan", "Task"),
    "BoundWorkflow": ("stepstone.engines.workflow", "BoundWorkflow"),
    "StepContext": ("stepstone.engines.workflow", "StepContext"),
    "Workflow": ("stepstone.engines.workflow", "Workflow"),
    "WorkflowStep": ("stepstone.engines.workflow", "WorkflowStep"),
    "deprecate_patch": ("stepstone.engines.workflow", "deprecate_patch"),
    "patched": ("stepstone.engines.workflow", "patched"),
    "step": ("stepstone.engines.workflow", "step"),
    "step_context": ("stepstone.engines.workflow", "step_context"),
    "workflow": ("stepstone.engines.workflow", "workflow"),
    "Event": ("stepstone.observability", "Event"),
    "EventType": ("stepstone.observability", "EventType"),
    "Session": ("stepstone.observability", "Session"),
    "AgentResult": ("stepstone.runner", "AgentResult"),
    "Runner": ("stepstone.runner", "Runner"),
    "RunnerConfig": ("stepstone.runner", "RunnerConfig"),
    "checkpoint_latest_key": ("stepstone.runner", "checkpoint_latest_key"),
    "Store": ("stepstone.store", "Store"),
    "StoreEntry": ("stepstone.store", "StoreEntry"),
    "Worker": ("stepstone.worker", "Worker"),
}


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())


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
