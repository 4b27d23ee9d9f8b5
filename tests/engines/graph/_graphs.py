"""State classes and graphs shared by the graph tests and their subprocess workers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field

from stepstone.graph import END, CompiledGraph, GraphBuilder, State, StoreCheckpointer, append


class Mission(State):
    """The lunar-mission state at v1."""

    schema_version: ClassVar[str] = "v1"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    trace: Annotated[list[str], append] = Field(default_factory=list)


class MissionV2(State):
    """v2 adds risk_assessment."""

    schema_version: ClassVar[str] = "v2"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    risk_assessment: str
    trace: Annotated[list[str], append] = Field(default_factory=list)


class Calls:
    """Counts node executions (in this process) and can make a node fail once."""

    def __init__(self, fail_once: set[str] | None = None) -> None:
        self.calls: list[str] = []
        self.fail_once = set(fail_once or ())

    def node(self, name: str, update: dict[str, Any]) -> Any:
        def run(state: State) -> dict[str, Any]:
            self.calls.append(name)
            if name in self.fail_once:
                self.fail_once.discard(name)
                raise RuntimeError(f"simulated transient failure in {name}")
            return {**update, "trace": [name]}

        run.__name__ = name
        return run


def mission_v1(cp: StoreCheckpointer | None, calls: Calls) -> CompiledGraph[Mission]:
    """define_objective -> size_crew -> draft_timeline -> END."""
    b = (
        GraphBuilder(Mission)
        .add_node("define_objective", calls.node("define_objective", {"objective": "land"}))
        .add_node("size_crew", calls.node("size_crew", {"crew_size": 4}))
        .add_node("draft_timeline", calls.node("draft_timeline", {"timeline": "T+3d"}))
        .add_edge("define_objective", "size_crew")
        .add_edge("size_crew", "draft_timeline")
        .add_edge("draft_timeline", END)
        .set_entry("define_objective")
    )
    if cp is not None:
        b = b.with_checkpointer(cp)
    return b.compile()


def migrate_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Backfill the v2 field."""
    return {**state, "risk_assessment": ""}


def mission_v2(cp: StoreCheckpointer, calls: Calls) -> CompiledGraph[MissionV2]:
    """The v1 chain plus assess_risks, with the v1 -> v2 migration."""
    return (
        GraphBuilder(MissionV2)
        .add_node("define_objective", calls.node("define_objective", {"objective": "land"}))
        .add_node("size_crew", calls.node("size_crew", {"crew_size": 4}))
        .add_node("draft_timeline", calls.node("draft_timeline", {"timeline": "T+3d"}))
        .add_node("assess_risks", calls.node("assess_risks", {"risk_assessment": "dust"}))
        .add_edge("define_objective", "size_crew")
        .add_edge("size_crew", "draft_timeline")
        .add_edge("draft_timeline", "assess_risks")
        .add_edge("assess_risks", END)
        .set_entry("define_objective")
        .with_checkpointer(cp)
        .with_state_migration("v1", "v2", migrate_v1_to_v2)
        .compile()
    )


class Counter(State):
    """A loop: ``tick`` runs until ``n`` reaches ``limit``."""

    n: int = 0
    limit: int = 5
    trace: Annotated[list[str], append] = Field(default_factory=list)


def loop_graph(
    cp: StoreCheckpointer | None,
    *,
    log: Path | None = None,
    fail_at: int | None = None,
    sleep: float = 0.0,
) -> CompiledGraph[Counter]:
    """start -> tick (loops back to itself until n == limit) -> finish -> END.

    ``log`` gets one line per tick execution (``tick <n> <pid>``): the side-effect log the
    process tests count. ``fail_at`` makes the tick that would produce that n raise once
    per process.
    """
    failed: list[bool] = []

    def start(state: Counter) -> dict[str, Any]:
        return {"trace": ["start"]}

    def tick(state: Counter) -> dict[str, Any]:
        n = state.n + 1
        if fail_at is not None and n == fail_at and not failed:
            failed.append(True)
            raise RuntimeError(f"tick {n} failed")
        if sleep:
            time.sleep(sleep)
        if log is not None:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"tick {n} {os.getpid()}\n")
                fh.flush()
                os.fsync(fh.fileno())
        return {"n": n, "trace": [f"tick{n}"]}

    def finish(state: Counter) -> dict[str, Any]:
        return {"trace": ["finish"]}

    b = (
        GraphBuilder(Counter)
        .add_node("start", start)
        .add_node("tick", tick)
        .add_node("finish", finish)
        .add_edge("start", "tick")
        .add_conditional_edge(
            "tick", lambda s: "tick" if s.n < s.limit else "finish", ["tick", "finish"]
        )
        .add_edge("finish", END)
        .set_entry("start")
    )
    if cp is not None:
        b = b.with_checkpointer(cp)
    return b.compile()
