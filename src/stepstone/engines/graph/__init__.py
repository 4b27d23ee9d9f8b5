"""The graph engine: typed-state graphs with durable checkpoints and schema migrations.

Users import it as :mod:`stepstone.graph`.
"""

from stepstone.engines.graph._builder import END, GraphBuilder
from stepstone.engines.graph._checkpoint import (
    InMemoryCheckpointer,
    SQLiteCheckpointer,
    StoreCheckpointer,
)
from stepstone.engines.graph._compiled import CompiledGraph
from stepstone.engines.graph._observe import GraphEvent
from stepstone.engines.graph._protocol import Checkpointer
from stepstone.engines.graph._records import (
    CheckpointFilter,
    CheckpointRecord,
    FanOutProgress,
    NodePosition,
)
from stepstone.engines.graph._state import (
    Reducer,
    State,
    append,
    concat_flatten,
    last_write_wins,
    merge,
    merge_all,
)

__all__ = [
    "END",
    "CheckpointFilter",
    "CheckpointRecord",
    "Checkpointer",
    "CompiledGraph",
    "FanOutProgress",
    "GraphBuilder",
    "GraphEvent",
    "InMemoryCheckpointer",
    "NodePosition",
    "Reducer",
    "SQLiteCheckpointer",
    "State",
    "StoreCheckpointer",
    "append",
    "concat_flatten",
    "last_write_wins",
    "merge",
    "merge_all",
]
