"""Subprocess: a graph invocation whose process dies inside its last node (``os._exit``),
leaving its record ``running`` with a dead owner: a stranded invocation.

Usage: ``_graph_crash.py (--db FILE | --url URL)``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pydantic import Field

from stepstone import Store
from stepstone.graph import END, CompiledGraph, GraphBuilder, State, StoreCheckpointer, append


class Trip(State):
    """Three nodes' trace."""

    trace: Annotated[list[str], append] = Field(default_factory=list)


def trip_graph(store: Store, *, die_in: str | None = None) -> CompiledGraph[Trip]:
    """book -> pack -> leave -> END; ``die_in`` names the node whose process dies."""

    def node(name: str) -> Any:
        def run(state: Trip) -> dict[str, Any]:
            if name == die_in:
                os._exit(9)  # the process dies: no cleanup, no final commit
            return {"trace": [name]}

        run.__name__ = name
        return run

    return (
        GraphBuilder(Trip)
        .add_node("book", node("book"))
        .add_node("pack", node("pack"))
        .add_node("leave", node("leave"))
        .add_edge("book", "pack")
        .add_edge("pack", "leave")
        .add_edge("leave", END)
        .set_entry("book")
        .with_checkpointer(StoreCheckpointer(store))
        .compile()
    )


def main() -> int:
    option, where = sys.argv[1], sys.argv[2]
    store = Store(db=where) if option == "--db" else Store(url=where)
    trip_graph(store, die_in="leave").invoke(Trip(), correlation_id="trip")
    return 1  # never reached: the process died in "leave"


if __name__ == "__main__":
    sys.exit(main())
