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
    SignedPickle,
    Tool,
    from_parallel,
    from_parallel_all,
    from_prev,
    from_start,
    from_step,
    tool,
)
from stepstone.durable._queue import RunHandle, set_queue_limits, submit
from stepstone.engines.llm import CacheConfig, LLMEngine, NativeTool, ThinkingConfig
from stepstone.engines.plan import CHECKPOINT_VERSION, Plan, Step
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFound,
    CheckpointRecordInvalid,
    CheckpointStateMigrationChainAmbiguous,
    CheckpointStateMigrationError,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    ConcurrentGraphResumeError,
    ConcurrentPlanRunError,
    GraphCompileError,
    MaxTurnsExceeded,
    MissingExtraError,
    ModelRequestsBlockedError,
    NodeException,
    PlanCompileError,
    PlanPaused,
    PlanRuntimeError,
    QueuedRunError,
    SerializationError,
    StaleCheckpointError,
    StepstoneError,
    StoreError,
    StoreKeyConflictError,
    StreamStallError,
    ToolTimeoutError,
    UnserializableValueWarning,
    UserError,
)
from stepstone.observability import Event, EventType, Session
from stepstone.store import Store, StoreEntry
from stepstone.worker import Worker

__version__ = "0.1.0"

__all__ = [
    # pipelines
    "Agent",
    "CHECKPOINT_VERSION",
    "Envelope",
    "ErrorInfo",
    "Plan",
    "Step",
    "Store",
    "StoreEntry",
    "from_parallel",
    "from_parallel_all",
    "from_prev",
    "from_start",
    "from_step",
    # tools
    "Tool",
    "tool",
    # llm agents
    "CacheConfig",
    "LLMEngine",
    "NativeTool",
    "ThinkingConfig",
    # serialization
    "SignedPickle",
    # observability
    "Event",
    "EventType",
    "Session",
    # work queue and workers
    "RunHandle",
    "Worker",
    "set_queue_limits",
    "submit",
    # errors
    "AgentCheckpointCorruptionError",
    "CheckpointCorruptError",
    "ConcurrentPlanRunError",
    "MaxTurnsExceeded",
    "MissingExtraError",
    "ModelRequestsBlockedError",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "QueuedRunError",
    "SerializationError",
    "StaleCheckpointError",
    "StepstoneError",
    "StoreError",
    "StoreKeyConflictError",
    "StreamStallError",
    "ToolTimeoutError",
    "UnserializableValueWarning",
    "UserError",
    # typed-graph errors (GraphBuilder, State and the checkpointers are in stepstone.graph)
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointRecordInvalid",
    "CheckpointStateMigrationChainAmbiguous",
    "CheckpointStateMigrationError",
    "CheckpointStateMigrationFailed",
    "CheckpointStateMigrationMissing",
    "ConcurrentGraphResumeError",
    "GraphCompileError",
    "NodeException",
]
