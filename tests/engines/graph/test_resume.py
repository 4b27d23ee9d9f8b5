"""NodeException, resume by position (loops and subgraphs), fresh invocation ids."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from stepstone.graph import (
    END,
    CheckpointFilter,
    ConcurrentGraphResumeError,
    GraphBuilder,
    InMemoryCheckpointer,
    NodeException,
    NodePosition,
    Reducer,
    SQLiteCheckpointer,
    State,
    append,
)
from tests.engines.graph._graphs import Calls, Counter, Mission, loop_graph, mission_v1


def _fail_first(cp: InMemoryCheckpointer | SQLiteCheckpointer) -> tuple[Calls, str]:
    calls = Calls(fail_once={"size_crew"})
    with pytest.raises(NodeException) as info:
        mission_v1(cp, calls).invoke(Mission(destination="Moon"), correlation_id="job-1")
    assert info.value.invocation_id is not None
    return calls, info.value.invocation_id


def test_node_exception_carries_cause_name_and_state(tmp_path: Path) -> None:
    # guarantee 108
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls = Calls(fail_once={"size_crew"})
    with pytest.raises(NodeException) as info:
        mission_v1(cp, calls).invoke(Mission(destination="Moon"))
    exc = info.value
    assert exc.node_name == "size_crew"
    assert isinstance(exc.__cause__, RuntimeError)
    assert str(exc.__cause__) == "simulated transient failure in size_crew"
    # the state just before the failing node ran
    assert exc.recoverable_state == Mission(
        destination="Moon", objective="land", trace=["define_objective"]
    )
    assert exc.namespace == ()
    again = pickle.loads(pickle.dumps(exc))
    assert again.node_name == "size_crew" and again.invocation_id == exc.invocation_id


def test_completed_nodes_are_durable_when_the_exception_arrives(tmp_path: Path) -> None:
    # guarantee 109: a new checkpointer (new connections) sees the completed node at once
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    _, inv = _fail_first(cp)
    rec = SQLiteCheckpointer(tmp_path / "c.sqlite").load(inv)
    assert [p.node_name for p in rec.completed_positions] == ["define_objective"]
    assert rec.status == "failed"
    assert rec.state["objective"] == "land"


def test_resume_skips_completed_and_continues_at_the_failed_node(tmp_path: Path) -> None:
    # guarantee 110, 111
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls, inv = _fail_first(cp)
    final = mission_v1(cp, calls).invoke(Mission(destination="ignored"), resume_invocation=inv)
    # define_objective ran once; size_crew ran twice (the failed call, then a clean retry)
    assert calls.calls == ["define_objective", "size_crew", "size_crew", "draft_timeline"]
    assert final.destination == "Moon"  # the loaded state, not the argument
    assert final.crew_size == 4 and final.timeline == "T+3d"


def test_retried_node_runs_against_the_loaded_state(tmp_path: Path) -> None:
    # guarantee 111: the retry sees the saved state, with nothing of the failed attempt
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    seen: list[Mission] = []
    attempts: list[int] = []

    def flaky(state: Mission) -> dict[str, Any]:
        seen.append(state)
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("network drop")
        return {"crew_size": 3, "trace": ["flaky"]}

    def first(state: Mission) -> dict[str, Any]:
        return {"objective": "o", "trace": ["first"]}

    g = (
        GraphBuilder(Mission)
        .add_node("first", first)
        .add_node("flaky", flaky)
        .add_edge("first", "flaky")
        .add_edge("flaky", END)
        .set_entry("first")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(NodeException) as info:
        g.invoke(Mission(destination="d"))
    g.invoke(resume_invocation=info.value.invocation_id)
    assert seen[0] == seen[1] == Mission(destination="d", objective="o", trace=["first"])


def test_every_invoke_mints_a_new_invocation_id(tmp_path: Path) -> None:
    # guarantee 112, 113
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls, first_id = _fail_first(cp)
    mission_v1(cp, calls).invoke(resume_invocation=first_id)
    attempts = cp.list(CheckpointFilter(correlation_id="job-1"))
    assert len(attempts) == 2
    old, new = attempts
    assert old.invocation_id == first_id != new.invocation_id
    # the old record stays as it was under its id
    assert [p.node_name for p in old.completed_positions] == ["define_objective"]
    assert old.status == "failed"
    assert new.correlation_id == old.correlation_id == "job-1"
    assert new.resumed_from == first_id
    assert new.attempt_index == 1
    assert [tuple(p) for p in new.completed_positions] == [
        ((), "define_objective", 0, 0),
        ((), "size_crew", 1, 1),
        ((), "draft_timeline", 2, 1),
    ]
    # resuming a completed record runs nothing, and still mints a new id
    mission_v1(cp, calls).invoke(resume_invocation=new.invocation_id)
    assert len(cp.list(CheckpointFilter(correlation_id="job-1"))) == 3
    assert calls.calls.count("draft_timeline") == 1


def test_reducer_state_carries_across_attempts(tmp_path: Path) -> None:
    # guarantee 115: each node appears once in the append-reduced trace
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    calls, inv = _fail_first(cp)
    final = mission_v1(cp, calls).invoke(resume_invocation=inv)
    assert final.trace == ["define_objective", "size_crew", "draft_timeline"]


def test_resume_keeps_or_checks_the_correlation_id() -> None:
    # guarantee 113
    cp = InMemoryCheckpointer()
    calls, inv = _fail_first(cp)
    from stepstone.exceptions import UserError

    with pytest.raises(UserError, match="job-1"):
        mission_v1(cp, calls).invoke(resume_invocation=inv, correlation_id="other")
    mission_v1(cp, calls).invoke(resume_invocation=inv, correlation_id="job-1")


def test_loop_resumes_mid_loop_and_finishes(tmp_path: Path) -> None:
    # guarantee 110 with a cycle (skip-by-name would hang or skip the rest of the loop)
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    log = tmp_path / "ticks.log"
    with pytest.raises(NodeException) as info:
        loop_graph(cp, log=log, fail_at=3).invoke(Counter(limit=5))
    assert [p.node_name for p in cp.load(info.value.invocation_id).completed_positions] == [
        "start",
        "tick",
        "tick",
    ]
    final = loop_graph(cp, log=log).invoke(resume_invocation=info.value.invocation_id)
    assert final.n == 5
    assert final.trace == ["start", "tick1", "tick2", "tick3", "tick4", "tick5", "finish"]
    ticks = [line.split()[1] for line in log.read_text().splitlines()]
    assert ticks == ["1", "2", "3", "4", "5"]  # each completed tick exactly once
    (_, rec) = cp.list()
    assert [p.step for p in rec.completed_positions] == list(range(7))


class Inner(State):
    items: Annotated[list[str], append] = Field(default_factory=list)


class Outer(State):
    items: Annotated[list[str], append] = Field(default_factory=list)
    done: bool = False


def test_resume_inside_a_subgraph(tmp_path: Path) -> None:
    # guarantee 107, 110: a failure inside a subgraph resumes inside it, not at its start
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    runs: list[str] = []
    fail = [True]

    def step(name: str) -> Any:
        def fn(state: Any) -> dict[str, Any]:
            if name == "s2" and fail:
                fail.clear()
                raise RuntimeError("inner crash")
            runs.append(name)
            return {"items": [name]}

        return fn

    sub = (
        GraphBuilder(Inner)
        .add_node("s1", step("s1"))
        .add_node("s2", step("s2"))
        .add_node("s3", step("s3"))
        .add_edge("s1", "s2")
        .add_edge("s2", "s3")
        .add_edge("s3", END)
        .set_entry("s1")
        .compile()
    )

    def build() -> Any:
        return (
            GraphBuilder(Outer)
            .add_node("before", step("before"))
            .add_subgraph_node("sub", sub)
            .add_node("after", lambda s: {"done": True, "items": ["after"]})
            .add_edge("before", "sub")
            .add_edge("sub", "after")
            .add_edge("after", END)
            .set_entry("before")
            .with_checkpointer(cp)
            .compile()
        )

    with pytest.raises(NodeException) as info:
        build().invoke(Outer())
    exc = info.value
    assert exc.node_name == "s2" and exc.namespace == ("sub",)
    assert exc.recoverable_state == Inner(items=["before", "s1"])
    rec = cp.load(exc.invocation_id or "")
    assert rec.state == {"items": ["before", "s1"]}  # the subgraph's state
    assert rec.parent_states == ({"items": ["before"], "done": False},)
    assert rec.completed_positions[-1] == NodePosition(("sub",), "s1", 0, 0)

    final = build().invoke(resume_invocation=exc.invocation_id)
    assert runs == ["before", "s1", "s2", "s3"]
    assert final == Outer(items=["before", "s1", "s2", "s3", "after"], done=True)


def test_subgraph_visited_twice_in_a_loop(tmp_path: Path) -> None:
    cp = InMemoryCheckpointer()

    class Loop(State):
        rounds: int = 0
        items: Annotated[list[str], append] = Field(default_factory=list)

    sub = (
        GraphBuilder(Inner)
        .add_node("work", lambda s: {"items": [f"w{len(s.items)}"]})
        .add_edge("work", END)
        .set_entry("work")
        .compile()
    )
    g = (
        GraphBuilder(Loop)
        .add_subgraph_node("sub", sub)
        .add_node("count", lambda s: {"rounds": s.rounds + 1})
        .add_edge("sub", "count")
        .add_conditional_edge("count", lambda s: "sub" if s.rounds < 2 else END)
        .set_entry("sub")
        .with_checkpointer(cp)
        .compile()
    )
    final = g.invoke(Loop())
    assert final.items == ["w0", "w1"]
    (rec,) = cp.list()
    inner = [p for p in rec.completed_positions if p.namespace == ("sub",)]
    assert [p.step for p in inner] == [0, 1]  # positions stay unique across visits


add = Reducer(lambda old, new: old + new, name="add")


class Tally(State):
    total: Annotated[int, add] = 0
    items: Annotated[list[str], append] = Field(default_factory=list)


class SubTally(State):
    total: Annotated[int, add] = 0
    items: Annotated[list[str], append] = Field(default_factory=list)


@pytest.mark.parametrize("crash", [None, "plus2", "after"])
@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_a_subgraph_hands_back_reduced_fields_once(
    tmp_path: Path, crash: str | None, serialization: Any
) -> None:
    # guarantee 361: the subgraph starts from the parent's total (10) and ends at 13, which
    # the parent takes as it is (not 10 + 13); an append field gets only the added items;
    # the same after a crash inside the subgraph or after it, resumed from the record
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite", serialization, pickle_key=b"k" * 32)
    runs: list[str] = []
    fail = {crash}

    def node(name: str, total: int) -> Any:
        def fn(state: Any) -> dict[str, Any]:
            if name in fail:
                fail.clear()
                raise RuntimeError(f"crash in {name}")
            runs.append(name)
            return {"total": total, "items": [name]}

        return fn

    sub = (
        GraphBuilder(SubTally)
        .add_node("plus1", node("plus1", 1))
        .add_node("plus2", node("plus2", 2))
        .add_edge("plus1", "plus2")
        .add_edge("plus2", END)
        .set_entry("plus1")
        .compile()
    )

    def build(**outputs: Any) -> Any:
        return (
            GraphBuilder(Tally)
            .add_node("start", node("start", 10))
            .add_subgraph_node("sub", sub, **outputs)
            .add_node("after", node("after", 100))
            .add_edge("start", "sub")
            .add_edge("sub", "after")
            .add_edge("after", END)
            .set_entry("start")
            .with_checkpointer(cp)
            .compile()
        )

    if crash is None:
        final = build().invoke(Tally())
    else:
        with pytest.raises(NodeException) as info:
            build().invoke(Tally())
        final = build().invoke(resume_invocation=info.value.invocation_id)
    assert final == Tally(total=113, items=["start", "plus1", "plus2", "after"])
    assert runs == ["start", "plus1", "plus2", "after"]  # each node ran once
    saved = cp.list()[-1].state
    assert (saved.total if serialization == "pickle" else saved["total"]) == 113

    # with outputs=, the update it returns goes through the parent's reducers: 10 + 13
    summed = build(outputs=lambda s: {"total": s.total}).invoke(Tally())
    assert summed.total == 10 + 13 + 100


def test_second_resume_of_a_record_being_resumed_is_refused(tmp_path: Path) -> None:
    # in-process variant of the two-process test in test_processes.py: while one resume of
    # a record runs, a second resume of it is refused, and nothing runs twice
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    inner_errors: list[BaseException] = []
    runs: list[str] = []
    box: dict[str, str] = {}

    def a(state: Mission) -> dict[str, Any]:
        runs.append("a")
        return {"trace": ["a"]}

    def b(state: Mission) -> dict[str, Any]:
        runs.append("b")
        if "inv" not in box:
            raise RuntimeError("first attempt fails")
        if not inner_errors:
            try:
                graph.invoke(resume_invocation=box["inv"])  # a second, nested resume
            except ConcurrentGraphResumeError as exc:
                inner_errors.append(exc)
        return {"trace": ["b"]}

    graph = (
        GraphBuilder(Mission)
        .add_node("a", a)
        .add_node("b", b)
        .add_edge("a", "b")
        .add_edge("b", END)
        .set_entry("a")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(NodeException) as info:
        graph.invoke(Mission(destination="x"))
    box["inv"] = info.value.invocation_id or ""
    final = graph.invoke(resume_invocation=box["inv"])
    assert final.trace == ["a", "b"]
    assert runs == ["a", "b", "b"]  # the nested resume executed nothing
    (err,) = inner_errors
    assert box["inv"] in str(err)
    assert "being resumed" in str(err)
    # once the first resume ended, the record can be resumed again
    graph.invoke(resume_invocation=box["inv"])
    assert runs == ["a", "b", "b", "b"]


def test_without_checkpointer_runs_in_memory() -> None:
    calls = Calls(fail_once={"size_crew"})
    g = mission_v1(None, calls)
    with pytest.raises(NodeException) as info:
        g.invoke(Mission(destination="x"))
    assert info.value.invocation_id is None
    assert g.invoke(Mission(destination="x")).crew_size == 4
    from stepstone.exceptions import UserError

    with pytest.raises(UserError, match="with_checkpointer"):
        g.invoke(resume_invocation="abc")


def test_resuming_a_running_invocation_is_refused(tmp_path: Path) -> None:
    # a live owner is never displaced: resuming the invocation that is still running fails
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    errors: list[ConcurrentGraphResumeError] = []

    def probe(state: Mission) -> dict[str, Any]:
        (running,) = cp.list()
        assert running.status == "running"
        try:
            graph.invoke(resume_invocation=running.invocation_id)
        except ConcurrentGraphResumeError as exc:
            errors.append(exc)
        return {"trace": ["probe"]}

    graph = (
        GraphBuilder(Mission)
        .add_node("probe", probe)
        .add_edge("probe", END)
        .set_entry("probe")
        .with_checkpointer(cp)
        .compile()
    )
    assert graph.invoke(Mission(destination="x")).trace == ["probe"]
    (err,) = errors
    assert "still running" in str(err)
    assert len(cp.list()) == 1  # the refused resume created no record
