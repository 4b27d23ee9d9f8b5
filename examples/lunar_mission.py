"""Checkpointing and migration: a lunar-mission planning graph.

A three-node planning pipeline writes a SQLite checkpoint after every node, survives a
simulated crash in ``size_crew`` (phase 1: resume from the saved invocation), then resumes
the completed invocation under a v2 state schema whose migration backfills a new field and
whose new ``assess_risks`` node is the only new work (phase 2).

Offline by default: the agents are driven by ``stepstone.testing.FakeModel``. Set
``STEPSTONE_MODEL`` (e.g. ``claude-haiku-4-5``, with ``ANTHROPIC_API_KEY``) to use a real
model; ``--offline`` forces the scripted one.

    python examples/lunar_mission.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field

from stepstone import Agent, LLMEngine
from stepstone.graph import (
    END,
    CheckpointFilter,
    GraphBuilder,
    NodeException,
    SQLiteCheckpointer,
    State,
    append,
)
from stepstone.testing import FakeModel

DESTINATION = "Lunar South Pole"
RUN_ID = "demo-mission-plan-1"
RULE = "=" * 72


class MissionPlanState(State):
    """v1 of the plan."""

    schema_version: ClassVar[str] = "v1"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    trace: Annotated[list[str], append] = Field(default_factory=list)


class MissionPlanStateV2(State):
    """v2 adds ``risk_assessment`` (backfilled by the migration for v1 records)."""

    schema_version: ClassVar[str] = "v2"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    risk_assessment: str
    trace: Annotated[list[str], append] = Field(default_factory=list)


class CrewSize(BaseModel):
    """The structured answer of the crew-sizing agent."""

    crew_size: int = Field(ge=2, le=8)


def _agent(name: str, script: list[Any], *, offline: bool, output: type = str) -> Agent:
    model = os.environ.get("STEPSTONE_MODEL")
    if model and not offline:
        return Agent(engine=LLMEngine(model), name=name, output=output)
    return Agent(engine=LLMEngine(FakeModel(script)), name=name, output=output)


class MissionNodes:
    """The graph's nodes: one agent each (scripted offline, so the walkthrough repeats)."""

    def __init__(self, *, offline: bool) -> None:
        self.objective = _agent(
            "objective",
            ["Establish a crewed outpost at Shackleton crater to prospect for water ice."],
            offline=offline,
        )
        self.crew = _agent("crew", [{"crew_size": 4}], offline=offline, output=CrewSize)
        self.timeline = _agent(
            "timeline",
            ["Launch in month 1, land by day 5, prospect for 12 days, return on day 20."],
            offline=offline,
        )
        self.risks = _agent(
            "risks",
            ["Main risks: regolith dust in seals, comms blackout in polar shadow, cold soak."],
            offline=offline,
        )
        self.crash_size_crew_once = True

    async def define_objective(self, state: MissionPlanState) -> dict[str, Any]:
        env = await self.objective.run(
            f"State the primary objective of a mission to {state.destination} in one sentence."
        )
        return {"objective": env.text(), "trace": ["define_objective"]}

    async def size_crew(self, state: MissionPlanState) -> dict[str, Any]:
        if self.crash_size_crew_once:  # an OOM kill, a pod preemption, a network drop...
            self.crash_size_crew_once = False
            raise RuntimeError("simulated transient mid-pipeline crash before size_crew completed")
        env = await self.crew.run(f"Pick a crew size between 2 and 8 for: {state.objective}")
        return {"crew_size": env.payload.crew_size, "trace": ["size_crew"]}

    async def draft_timeline(self, state: MissionPlanState) -> dict[str, Any]:
        env = await self.timeline.run(
            f"Draft a one-sentence timeline for {state.crew_size} crew: {state.objective}"
        )
        return {"timeline": env.text(), "trace": ["draft_timeline"]}

    async def assess_risks(self, state: MissionPlanStateV2) -> dict[str, Any]:
        env = await self.risks.run(f"Assess the main risks of this plan: {state.timeline}")
        return {"risk_assessment": env.text(), "trace": ["assess_risks"]}


def build_v1(checkpointer: SQLiteCheckpointer, nodes: MissionNodes) -> Any:
    """define_objective -> size_crew -> draft_timeline."""
    return (
        GraphBuilder(MissionPlanState)
        .add_node("define_objective", nodes.define_objective)
        .add_node("size_crew", nodes.size_crew)
        .add_node("draft_timeline", nodes.draft_timeline)
        .add_edge("define_objective", "size_crew")
        .add_edge("size_crew", "draft_timeline")
        .add_edge("draft_timeline", END)
        .set_entry("define_objective")
        .with_checkpointer(checkpointer)
        .compile()
    )


def migrate_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Pure dict -> dict: keep every v1 field, backfill the new one."""
    return {**state, "risk_assessment": ""}


def build_v2(checkpointer: SQLiteCheckpointer, nodes: MissionNodes) -> Any:
    """The v1 nodes plus assess_risks at the end, with the v1 -> v2 migration."""
    return (
        GraphBuilder(MissionPlanStateV2)
        .add_node("define_objective", nodes.define_objective)
        .add_node("size_crew", nodes.size_crew)
        .add_node("draft_timeline", nodes.draft_timeline)
        .add_node("assess_risks", nodes.assess_risks)
        .add_edge("define_objective", "size_crew")
        .add_edge("size_crew", "draft_timeline")
        .add_edge("draft_timeline", "assess_risks")
        .add_edge("assess_risks", END)
        .set_entry("define_objective")
        .with_checkpointer(checkpointer)
        .with_state_migration("v1", "v2", migrate_v1_to_v2)
        .compile()
    )


def main(argv: list[str]) -> int:
    offline = "--offline" in argv
    nodes = MissionNodes(offline=offline)
    with tempfile.TemporaryDirectory(prefix="stepstone-checkpoint-demo-") as tmp:
        db = Path(tmp) / "checkpoints.sqlite"
        checkpointer = SQLiteCheckpointer(db, serialization="json")

        print(RULE)
        print("Phase 1 - invoke v1 graph; size_crew crashes; resume picks up")
        print(RULE)
        print(f"destination: {DESTINATION}")
        print(f"checkpoint db: {db}")
        graph_v1 = build_v1(checkpointer, nodes)
        print("first attempt:")
        try:
            graph_v1.invoke(MissionPlanState(destination=DESTINATION), correlation_id=RUN_ID)
        except NodeException as exc:
            print(f"  NodeException at node {exc.node_name!r}: {exc.__cause__}")
        (saved,) = checkpointer.list(CheckpointFilter(correlation_id=RUN_ID))
        print(f"  saved invocation_id: {saved.invocation_id}")
        print(f"  completed nodes: {[p.node_name for p in saved.completed_positions]}")

        print("second attempt (resume from saved invocation):")
        result = graph_v1.invoke(
            MissionPlanState(destination=DESTINATION), resume_invocation=saved.invocation_id
        )
        print(f"  objective: {result.objective}")
        print(f"  crew_size: {result.crew_size}")
        print(f"  timeline: {result.timeline}")
        print(f"  trace: {result.trace}")
        # Each invoke mints its own invocation_id: find the resumed attempt by correlation_id.
        resumed = checkpointer.list(CheckpointFilter(correlation_id=RUN_ID))[-1]
        print(f"  resumed invocation_id: {resumed.invocation_id}")

        print(RULE)
        print("Phase 2 - invoke v2 graph with resume; v1->v2 migration runs")
        print(RULE)
        print("v2 adds: risk_assessment field + assess_risks node")
        print("migration: backfills risk_assessment='' for v1 records")
        graph_v2 = build_v2(checkpointer, nodes)
        result_v2 = graph_v2.invoke(resume_invocation=resumed.invocation_id)
        print("v2 result after resume:")
        print(f"  objective: {result_v2.objective}")
        print(f"  crew_size: {result_v2.crew_size}")
        print(f"  timeline: {result_v2.timeline}")
        print(f"  risk_assessment: {result_v2.risk_assessment}")
        print(f"  trace: {result_v2.trace}")
        checkpointer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
