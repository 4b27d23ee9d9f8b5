"""State schema versions and migrations on resume (guarantee 116-120)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

import pytest
from pydantic import Field

from stepstone.graph import (
    END,
    CheckpointFilter,
    CheckpointRecordInvalid,
    CheckpointStateMigrationChainAmbiguous,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    GraphBuilder,
    GraphCompileError,
    InMemoryCheckpointer,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
    append,
)
from tests.engines.graph._graphs import (
    Calls,
    Mission,
    MissionV2,
    migrate_v1_to_v2,
    mission_v1,
    mission_v2,
)


def test_schema_version_is_a_classvar_and_empty_opts_out() -> None:
    # guarantee 116
    assert Mission.schema_version == "v1"
    assert "schema_version" not in Mission.model_fields
    assert State.schema_version == ""

    class Plain(State):
        x: int = 0

    # "" opts out: registering a migration is a compile error naming the fix
    with pytest.raises(GraphCompileError, match="schema_version"):
        (
            GraphBuilder(Plain)
            .add_node("n", lambda s: None)
            .add_edge("n", END)
            .set_entry("n")
            .with_state_migration("v1", "v2", lambda d: d)
            .compile()
        )


def test_opted_out_class_loads_records_without_migrating() -> None:
    # guarantee 116: a class with schema_version "" never migrates (a v1 record loads as is)
    cp = InMemoryCheckpointer()
    mission_v1(cp, Calls()).invoke(Mission(destination="x"))
    (rec,) = cp.list()

    class Unversioned(State):
        destination: str
        objective: str = ""
        crew_size: int = 0
        timeline: str = ""
        trace: Annotated[list[str], append] = Field(default_factory=list)

    g = (
        GraphBuilder(Unversioned)
        .add_node("draft_timeline", lambda s: None)
        .add_edge("draft_timeline", END)
        .set_entry("draft_timeline")
        .with_checkpointer(cp)
        .compile()
    )
    assert g.invoke(resume_invocation=rec.invocation_id).crew_size == 4


def _completed_v1(cp: StoreCheckpointer) -> tuple[Calls, str]:
    calls = Calls()
    mission_v1(cp, calls).invoke(Mission(destination="Moon"), correlation_id="mission")
    (rec,) = cp.list(CheckpointFilter(correlation_id="mission"))
    return calls, rec.invocation_id


def test_v1_record_resumed_under_v2_runs_only_the_new_node(tmp_path: Path) -> None:
    # guarantee 117, 118, 120
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls, inv = _completed_v1(cp)
    final = mission_v2(cp, calls).invoke(resume_invocation=inv)
    assert isinstance(final, MissionV2)
    assert calls.calls == ["define_objective", "size_crew", "draft_timeline", "assess_risks"]
    assert final.trace == ["define_objective", "size_crew", "draft_timeline", "assess_risks"]
    # fields preserved by {**state, ...}; the new one backfilled, then set by assess_risks
    assert (final.destination, final.objective, final.crew_size) == ("Moon", "land", 4)
    assert final.risk_assessment == "dust"
    new = cp.list(CheckpointFilter(correlation_id="mission"))[-1]
    assert new.schema_version == "v2"
    assert new.completed_positions[-1].node_name == "assess_risks"


def test_migration_runs_once_on_load_and_is_not_written_back(tmp_path: Path) -> None:
    # guarantee 117, 118
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls, inv = _completed_v1(cp)
    seen: list[dict[str, Any]] = []

    def migrate(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(state))
        return {**state, "risk_assessment": ""}

    g = (
        GraphBuilder(MissionV2)
        .add_node("draft_timeline", calls.node("draft_timeline", {}))
        .add_node("assess_risks", calls.node("assess_risks", {"risk_assessment": "ok"}))
        .add_edge("draft_timeline", "assess_risks")
        .add_edge("assess_risks", END)
        .set_entry("draft_timeline")
        .with_checkpointer(cp)
        .with_state_migration("v1", "v2", migrate)
        .compile()
    )
    g.invoke(resume_invocation=inv)
    assert len(seen) == 1  # once, with the plain dict of the saved v1 state
    assert seen[0]["crew_size"] == 4 and "risk_assessment" not in seen[0]
    old = cp.load(inv)  # the v1 record is unchanged
    assert old.schema_version == "v1"
    assert "risk_assessment" not in old.state
    # the migrated state is saved only by the new invocation's first save
    new = cp.list(CheckpointFilter(correlation_id="mission"))[-1]
    assert new.schema_version == "v2" and new.state["risk_assessment"] == "ok"
    typed = g.load_record(inv)  # typed + migrated view of the old record
    assert isinstance(typed.state, MissionV2) and typed.schema_version == "v2"
    assert len(seen) == 2


class V3(State):
    schema_version: ClassVar[str] = "v3"
    destination: str
    objective: str = ""
    crew_size: int = 0
    timeline: str = ""
    risk_assessment: str
    crew_names: list[str]
    trace: Annotated[list[str], append] = Field(default_factory=list)


def _v3_graph(cp: StoreCheckpointer, *edges: tuple[str, str, Any]) -> Any:
    b = (
        GraphBuilder(V3)
        .add_node("draft_timeline", lambda s: None)
        .add_edge("draft_timeline", END)
        .set_entry("draft_timeline")
        .with_checkpointer(cp)
    )
    for a, z, fn in edges:
        b = b.with_state_migration(a, z, fn)
    return b.compile()


def _to_v3(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "crew_names": ["A"] * state["crew_size"]}


def test_bfs_picks_the_shortest_chain() -> None:
    # guarantee 119: v1 -> v2 -> v3 composed automatically; a longer detour is not taken
    cp = InMemoryCheckpointer()
    _, inv = _completed_v1(cp)
    order: list[str] = []

    def log(name: str, fn: Any) -> Any:
        def run(state: dict[str, Any]) -> dict[str, Any]:
            order.append(name)
            return dict(fn(state))

        return run

    g = _v3_graph(
        cp,
        ("v2", "v3", log("v2->v3", _to_v3)),
        ("v1", "v2", log("v1->v2", migrate_v1_to_v2)),
        ("v1", "v1b", log("v1->v1b", lambda s: s)),
        ("v1b", "v1c", log("v1b->v1c", lambda s: s)),
        ("v1c", "v3", log("v1c->v3", lambda s: s)),
    )
    final = g.invoke(resume_invocation=inv)
    assert order == ["v1->v2", "v2->v3"]
    assert final.crew_names == ["A"] * 4 and final.risk_assessment == ""


def test_ambiguous_chain_is_an_error() -> None:
    # guarantee 119: two shortest chains
    cp = InMemoryCheckpointer()
    _, inv = _completed_v1(cp)
    g = _v3_graph(
        cp,
        ("v1", "v2", migrate_v1_to_v2),
        ("v2", "v3", _to_v3),
        ("v1", "v2b", migrate_v1_to_v2),
        ("v2b", "v3", _to_v3),
    )
    with pytest.raises(CheckpointStateMigrationChainAmbiguous, match="'v1' to 'v3'"):
        g.invoke(resume_invocation=inv)


def test_missing_chain_is_an_error() -> None:
    cp = InMemoryCheckpointer()
    _, inv = _completed_v1(cp)
    g = _v3_graph(cp, ("v2", "v3", _to_v3))
    with pytest.raises(CheckpointStateMigrationMissing, match="with_state_migration"):
        g.invoke(resume_invocation=inv)


def test_failing_or_bad_migration_is_an_error() -> None:
    cp = InMemoryCheckpointer()
    _, inv = _completed_v1(cp)

    def boom(state: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("crew")

    with pytest.raises(CheckpointStateMigrationFailed, match="KeyError") as info:
        _v3_graph(cp, ("v1", "v3", boom)).invoke(resume_invocation=inv)
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(CheckpointStateMigrationFailed, match="not a dict"):
        _v3_graph(cp, ("v1", "v3", lambda s: None)).invoke(resume_invocation=inv)
    with pytest.raises(CheckpointStateMigrationFailed, match="does not validate"):
        _v3_graph(cp, ("v1", "v3", migrate_v1_to_v2)).invoke(resume_invocation=inv)


def test_version_mismatch_without_migration_on_a_changed_class() -> None:
    cp = InMemoryCheckpointer()
    _, inv = _completed_v1(cp)

    class Same(State):  # same version, incompatible fields
        schema_version: ClassVar[str] = "v1"
        other: int

    g = (
        GraphBuilder(Same)
        .add_node("draft_timeline", lambda s: None)
        .add_edge("draft_timeline", END)
        .set_entry("draft_timeline")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(CheckpointRecordInvalid, match="does not validate as Same"):
        g.invoke(resume_invocation=inv)


def test_pickle_records_cannot_migrate(tmp_path: Path) -> None:
    # guarantee 105: only JSON can migrate
    key = b"k" * 32
    cp = SQLiteCheckpointer(tmp_path / "p.sqlite", serialization="pickle", pickle_key=key)
    calls, inv = _completed_v1(cp)
    with pytest.raises(GraphCompileError, match="pickle"):
        mission_v2(cp, calls)
    g = (
        GraphBuilder(MissionV2)
        .add_node("draft_timeline", lambda s: None)
        .add_edge("draft_timeline", END)
        .set_entry("draft_timeline")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(CheckpointStateMigrationFailed, match="pickle records cannot be migrated"):
        g.invoke(resume_invocation=inv)


class SubV1(State):
    schema_version: ClassVar[str] = "s1"
    items: Annotated[list[str], append] = Field(default_factory=list)


class SubV2(State):
    schema_version: ClassVar[str] = "s2"
    items: Annotated[list[str], append] = Field(default_factory=list)
    score: int


class Top(State):
    items: Annotated[list[str], append] = Field(default_factory=list)


def test_subgraph_state_migrates_by_its_own_versions(tmp_path: Path) -> None:
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    fail = [True]

    def s2(state: Any) -> dict[str, Any]:
        if fail:
            fail.clear()
            raise RuntimeError("crash inside the subgraph")
        return {"items": ["s2"]}

    def sub(cls: type[State], migrate: bool) -> Any:
        b = (
            GraphBuilder(cls)
            .add_node("s1", lambda s: {"items": ["s1"]})
            .add_node("s2", s2)
            .add_edge("s1", "s2")
            .add_edge("s2", END)
            .set_entry("s1")
        )
        if migrate:
            b = b.with_state_migration("s1", "s2", lambda d: {**d, "score": 7})
        return b.compile()

    def top(subgraph: Any) -> Any:
        return (
            GraphBuilder(Top)
            .add_subgraph_node(
                "inner",
                subgraph,
                inputs=lambda s: {} if subgraph.state_cls is SubV1 else {"score": 0},
                outputs=lambda s: {"items": [f"score={getattr(s, 'score', None)}"]},
            )
            .add_edge("inner", END)
            .set_entry("inner")
            .with_checkpointer(cp)
            .compile()
        )

    with pytest.raises(Exception) as info:
        top(sub(SubV1, False)).invoke(Top())
    inv = info.value.invocation_id  # type: ignore[attr-defined]
    assert cp.load(inv).schema_version == "s1"
    with pytest.raises(CheckpointStateMigrationMissing, match="SubV2"):
        top(sub(SubV2, False)).invoke(resume_invocation=inv)
    final = top(sub(SubV2, True)).invoke(resume_invocation=inv)
    assert final.items == ["score=7"]
