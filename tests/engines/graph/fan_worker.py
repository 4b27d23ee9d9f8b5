"""Subprocess worker for test_fan_out.py: a fan-out over 10 stops, 2 branches at once, on a
SQLite file; each branch logs `start i` and `end i` around its work.

Usage:
    fan_worker.py <db> <log>    start correlation "fan", or resume its latest unfinished
                                attempt (prints READY first, DONE <trace> when finished)
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from stepstone.graph import (
    END,
    CheckpointFilter,
    GraphBuilder,
    SQLiteCheckpointer,
    State,
    append,
)

STOPS = [f"s{i}" for i in range(10)]


class Route(State):
    stops: list[str] = Field(default_factory=list)
    visited: Annotated[list[str], append] = Field(default_factory=list)


def main() -> int:
    db, log = sys.argv[1], Path(sys.argv[2])

    async def visit(stop: str) -> str:
        index = STOPS.index(stop)
        with log.open("a") as f:
            f.write(f"start {index}\n")
        await asyncio.sleep(0.08)
        with log.open("a") as f:
            f.write(f"end {index}\n")
        return stop.upper()

    cp = SQLiteCheckpointer(db)
    graph = (
        GraphBuilder(Route)
        .add_fan_out_node("visit", visit, over="stops", into="visited", concurrency=2)
        .add_edge("visit", END)
        .set_entry("visit")
        .with_checkpointer(cp)
        .compile()
    )
    print("READY", flush=True)
    attempts = cp.list(CheckpointFilter(correlation_id="fan"))
    if not attempts:
        final = graph.invoke(Route(stops=STOPS), correlation_id="fan")
    else:
        final = graph.invoke(resume_invocation=attempts[-1].invocation_id)
    print("DONE", ",".join(final.visited), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
