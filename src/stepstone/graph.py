"""Typed-state graphs with durable checkpoints and schema migrations.

Nodes are functions (or Agents) that take the typed, frozen :class:`State` and return a dict
of field updates; edges (fixed or conditional, loops allowed) connect them. With a
checkpointer, every completed node is committed through stepstone's durable kernel before
the next node starts, so ``invoke(state, resume_invocation=id)`` continues a crashed or
failed invocation at its first uncompleted node, migrating the saved state first when the
state class's ``schema_version`` changed.

Example::

    from typing import Annotated, ClassVar
    from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State, append

    class Mission(State):
        schema_version: ClassVar[str] = "v1"
        destination: str
        objective: str = ""
        trace: Annotated[list[str], append] = []

    def define_objective(state: Mission) -> dict:
        return {"objective": f"Land at {state.destination}", "trace": ["define_objective"]}

    graph = (
        GraphBuilder(Mission)
        .add_node("define_objective", define_objective)
        .add_edge("define_objective", END)
        .set_entry("define_objective")
        .with_checkpointer(SQLiteCheckpointer("checkpoints.sqlite"))
        .compile()
    )
    final = graph.invoke(Mission(destination="Lunar South Pole"), correlation_id="m-1")
"""

from stepstone.engines.graph import (
    END,
    Checkpointer,
    CheckpointFilter,
    CheckpointRecord,
    CompiledGraph,
    FanOutProgress,
    GraphBuilder,
    GraphEvent,
    InMemoryCheckpointer,
    NodePosition,
    Reducer,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
    append,
    concat_flatten,
    last_write_wins,
    merge,
    merge_all,
)
from stepstone.exceptions import (
    CheckpointError,
    CheckpointNotFound,
    CheckpointRecordInvalid,
    CheckpointSaveFailed,
    CheckpointStateMigrationChainAmbiguous,
    CheckpointStateMigrationError,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    ConcurrentGraphResumeError,
    EdgeException,
    GraphCompileError,
    NodeException,
    ReducerError,
    RoutingError,
    StateValidationError,
)

__all__ = [
    # building and running
    "END",
    "CompiledGraph",
    "GraphBuilder",
    "GraphEvent",
    "Reducer",
    "State",
    "append",
    "concat_flatten",
    "last_write_wins",
    "merge",
    "merge_all",
    # checkpoints
    "CheckpointFilter",
    "CheckpointRecord",
    "Checkpointer",
    "FanOutProgress",
    "InMemoryCheckpointer",
    "NodePosition",
    "SQLiteCheckpointer",
    "StoreCheckpointer",
    # errors
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
]
