"""The `stepstone demo` lunar-mission story (as examples/lunar_mission.py): a typed-state
graph that crashes, resumes from its SQLite checkpoint, then resumes again under a
migrated v2 schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from stepstone.agent import Agent
from stepstone.graph import (
    END,
    CheckpointFilter,
    CheckpointRecord,
    CompiledGraph,
    GraphBuilder,
    NodeException,
    SQLiteCheckpointer,
    State,
    append,
)

__all__ = ["run_lunar_demo"]

RUN_ID = "demo-mission-plan-1"


class MissionPlanState(State):
    """v1 of the mission plan."""

    schema_version: ClassVar[str] = "v1"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    trace: Annotated[list[str], append] = Field(default_factory=list)


class MissionPlanStateV2(State):
    """v2: adds ``risk_assessment``."""

    schema_version: ClassVar[str] = "v2"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    risk_assessment: str
    trace: Annotated[list[str], append] = Field(default_factory=list)


class CrewSize(BaseModel):
    """The crew agent's structured answer."""

    crew_size: int = Field(ge=2, le=8)


def _scripted(name: str, reply: Any, output: type = str) -> Agent:
    from stepstone.engines.llm import LLMEngine
    from stepstone.testing import FakeModel

    return Agent(engine=LLMEngine(FakeModel([reply])), name=name, output=output)


class _Nodes:
    """The four nodes, each asking a scripted agent; size_crew crashes once."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.crash = True
        self.objective = _scripted(
            "objective", "Establish a crewed outpost at Shackleton crater to prospect for ice."
        )
        self.crew = _scripted("crew", {"crew_size": 4}, CrewSize)
        self.timeline = _scripted(
            "timeline", "Launch in month 1, land by day 5, prospect 12 days, return day 20."
        )
        self.risks = _scripted(
            "risks", "Regolith dust in seals, comms blackout in polar shadow, cold soak."
        )

    def _say(self, node: str, what: str) -> None:
        self.console.print(f"    [cyan]▶ {node}[/] {what}")

    async def define_objective(self, state: MissionPlanState) -> dict[str, Any]:
        env = await self.objective.run(f"One-sentence objective for {state.destination}")
        self._say("define_objective", env.text())
        return {"objective": env.text(), "trace": ["define_objective"]}

    async def size_crew(self, state: MissionPlanState) -> dict[str, Any]:
        if self.crash:
            self.crash = False
            self._say("size_crew", "[red]crashes mid-call (simulated pod preemption)[/]")
            raise RuntimeError("simulated transient mid-pipeline crash before size_crew completed")
        env = await self.crew.run(f"Crew size (2-8) for: {state.objective}")
        self._say("size_crew", f"crew of {env.payload.crew_size}")
        return {"crew_size": env.payload.crew_size, "trace": ["size_crew"]}

    async def draft_timeline(self, state: MissionPlanState) -> dict[str, Any]:
        env = await self.timeline.run(f"Timeline for {state.crew_size} crew")
        self._say("draft_timeline", env.text())
        return {"timeline": env.text(), "trace": ["draft_timeline"]}

    async def assess_risks(self, state: MissionPlanStateV2) -> dict[str, Any]:
        env = await self.risks.run(f"Risks of: {state.timeline}")
        self._say("assess_risks", env.text())
        return {"risk_assessment": env.text(), "trace": ["assess_risks"]}


def _build(cp: SQLiteCheckpointer, nodes: _Nodes, *, v2: bool) -> CompiledGraph[Any]:
    names = ["define_objective", "size_crew", "draft_timeline"] + (["assess_risks"] if v2 else [])
    builder: Any = GraphBuilder(MissionPlanStateV2 if v2 else MissionPlanState)
    for name in names:
        builder.add_node(name, getattr(nodes, name))
    for a, b in zip(names, [*names[1:], END], strict=True):
        builder.add_edge(a, b)
    builder.set_entry(names[0]).with_checkpointer(cp)
    if v2:
        builder.with_state_migration("v1", "v2", lambda s: {**s, "risk_assessment": ""})
    graph: CompiledGraph[Any] = builder.compile()
    return graph


def _record_table(title: str, records: list[CheckpointRecord]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in ("invocation_id", "schema", "status", "completed positions (node@step/attempt)"):
        table.add_column(col)
    for r in records:
        table.add_row(
            r.invocation_id,
            r.schema_version,
            r.status,
            ", ".join(f"{p.node_name}@{p.step}/{p.attempt_index}" for p in r.completed_positions),
        )
    return table


def run_lunar_demo(console: Console, workdir: Path) -> None:
    """Narrate the lunar-mission story in ``workdir`` (a SQLite file is created there)."""
    db = workdir / "lunar-checkpoints.sqlite"
    cp = SQLiteCheckpointer(db)
    nodes = _Nodes(console)
    try:
        for old in cp.list(CheckpointFilter(correlation_id=RUN_ID)):  # an earlier demo's
            cp.delete(old.invocation_id)
        resumed = _crash_and_resume(console, cp, nodes, db)
        _migrate_and_resume(console, cp, nodes, resumed)
    finally:
        cp.close()


def _crash_and_resume(console: Console, cp: SQLiteCheckpointer, nodes: _Nodes, db: Path) -> str:
    """Phase 1: a node crashes, the resume skips what was saved; the resumed invocation id."""
    console.print()
    console.print(Rule("Graph story, phase 1: size_crew crashes; resume picks up"))
    console.print(f"  a typed-state graph, checkpointed to {db} after every node")
    v1 = _build(cp, nodes, v2=False)
    try:
        v1.invoke(MissionPlanState(destination="Lunar South Pole"), correlation_id=RUN_ID)
    except NodeException as exc:
        console.print(
            f"  [red]NodeException[/] at node {exc.node_name!r}: {exc.__cause__}"
            "  — the record of the nodes before it is already on disk:"
        )
    (saved,) = cp.list(CheckpointFilter(correlation_id=RUN_ID))
    console.print(
        f"  saved invocation_id {saved.invocation_id}: completed "
        f"{[p.node_name for p in saved.completed_positions]}"
    )
    console.print("  resume_invocation=<that id>: define_objective is skipped by position")
    result = v1.invoke(resume_invocation=saved.invocation_id)
    resumed = cp.list(CheckpointFilter(correlation_id=RUN_ID))[-1]
    console.print(f"  [green]done[/]: crew_size={result.crew_size}, trace={result.trace}")
    console.print(
        f"  the resume minted a new invocation_id {resumed.invocation_id}; "
        f"correlation_id {RUN_ID!r} joins the attempts"
    )
    return resumed.invocation_id


def _migrate_and_resume(
    console: Console, cp: SQLiteCheckpointer, nodes: _Nodes, resumed: str
) -> None:
    """Phase 2: a v2 schema resumes the v1 record, migrated on load."""
    console.print(Rule("Graph story, phase 2: a v2 schema lands; v1 record migrates on load"))
    console.print(
        "  v2 adds risk_assessment + an assess_risks node; migration v1→v2 "
        "backfills risk_assessment=''"
    )
    v2 = _build(cp, nodes, v2=True)
    final = v2.invoke(resume_invocation=resumed)
    console.print(
        f"  [green]done[/]: trace={final.trace}  (only assess_risks ran; the v1 nodes "
        "were skipped by their completed positions)"
    )
    console.print(
        _record_table(
            "  every attempt of " + RUN_ID, cp.list(CheckpointFilter(correlation_id=RUN_ID))
        )
    )
