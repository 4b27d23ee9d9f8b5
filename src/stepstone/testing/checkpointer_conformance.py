"""The graph checkpointer conformance suite: a checkpointer of your own passes these tests,
as the built-in ones do.

Use it from a test module of your own with a ``graph_checkpointer`` fixture that gives a
fresh, empty checkpointer::

    import pytest
    from stepstone.testing.checkpointer_conformance import *  # noqa: F403

    @pytest.fixture
    def graph_checkpointer(tmp_path):
        return MyCheckpointer(tmp_path / "records")

The tests check the protocol (:class:`stepstone.graph.Checkpointer`): ``save`` then
``load`` gives the record back (every field but ``last_saved_at``, which a checkpointer may
stamp with its own clock, and ``serialization``, which says how it stored it); a second
save replaces the first; ``load`` of a missing id raises ``CheckpointNotFound``; ``list``
filters by correlation id and status, oldest ``last_saved_at`` first; ``delete`` says
whether there was a record; the async forms agree; and graphs run, fail and resume on it
(inside subgraphs and fan-outs too).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any

import pytest
from pydantic import Field

from stepstone.graph import (
    END,
    CheckpointFilter,
    CheckpointNotFound,
    CheckpointRecord,
    FanOutProgress,
    GraphBuilder,
    NodeException,
    NodePosition,
    State,
    append,
)

__all__ = [
    "make_record",
    "test_a_fan_out_resumes_from_it_with_only_the_unfinished_branches",
    "test_a_graph_resumes_from_it_after_a_failure",
    "test_a_second_save_replaces_the_first",
    "test_async_forms_agree",
    "test_delete_says_whether_there_was_a_record",
    "test_list_filters_and_orders_oldest_first",
    "test_load_of_a_missing_record_raises_checkpoint_not_found",
    "test_save_then_load_gives_the_record_back",
]


def make_record(
    invocation_id: str,
    *,
    correlation_id: str = "job-1",
    status: str = "running",
    last_saved_at: float = 1.0,
    n: int = 1,
) -> CheckpointRecord:
    """A record that uses every field (a run stopped inside a subgraph, with a fan-out in
    progress), as JSON data."""
    return CheckpointRecord(
        invocation_id=invocation_id,
        correlation_id=correlation_id,
        state={"n": n, "trace": ["x"], "nested": {"k": [1, 2.5, None, True]}},
        completed_positions=(
            NodePosition((), "a", 0, 0),
            NodePosition(("sub",), "x", 0, 1),
        ),
        parent_states=({"n": 0, "trace": ["a"], "items": ["p", "q"]},),
        schema_version="v2",
        last_saved_at=last_saved_at,
        status=status,
        resumed_from="earlier-attempt",
        attempt_index=1,
        serialization="json",
        metadata={"tenant": "acme", "ids": [1, 2]},
        error={"type": "RuntimeError", "message": "boom", "node": "y"}
        if status == "failed"
        else None,
        fan_outs=(
            FanOutProgress(
                namespace=("sub",), node_name="fan", step=1, results=((0, {"trace": ["p"]}),)
            ),
        ),
        frames=(
            {
                "node": None,
                "step": None,
                "ns": [],
                "schema_version": "v1",
                "last": ["a", 0],
                "initial": None,
            },
            {
                "node": "sub",
                "step": 1,
                "ns": ["sub"],
                "schema_version": "v2",
                "last": ["x", 0],
                "initial": {"n": 0, "trace": [], "nested": {}},
            },
        ),
    )


def _same(loaded: CheckpointRecord, saved: CheckpointRecord) -> None:
    """``loaded`` is ``saved`` but for the fields a checkpointer decides itself."""
    got = dataclasses.replace(
        loaded, last_saved_at=saved.last_saved_at, serialization=saved.serialization
    )
    assert got == saved, f"loaded {got!r}\nsaved  {saved!r}"


def test_save_then_load_gives_the_record_back(graph_checkpointer: Any) -> None:
    """guarantee 598"""
    for status in ("running", "failed", "done"):
        rec = make_record(f"id-{status}", status=status)
        graph_checkpointer.save(rec)
        _same(graph_checkpointer.load(rec.invocation_id), rec)


def test_a_second_save_replaces_the_first(graph_checkpointer: Any) -> None:
    """guarantee 598"""
    graph_checkpointer.save(make_record("id-1", n=1))
    second = make_record("id-1", n=2, status="done", last_saved_at=2.0)
    graph_checkpointer.save(second)
    _same(graph_checkpointer.load("id-1"), second)
    assert [r.invocation_id for r in graph_checkpointer.list()] == ["id-1"]


def test_load_of_a_missing_record_raises_checkpoint_not_found(graph_checkpointer: Any) -> None:
    """guarantee 598: one rule, never None"""
    with pytest.raises(CheckpointNotFound):
        graph_checkpointer.load("no-such-invocation")


def test_list_filters_and_orders_oldest_first(graph_checkpointer: Any) -> None:
    """guarantee 598"""
    graph_checkpointer.save(make_record("c", correlation_id="job-2", last_saved_at=1.0))
    graph_checkpointer.save(make_record("a", status="done", last_saved_at=2.0))
    graph_checkpointer.save(make_record("b", status="failed", last_saved_at=3.0))
    assert [r.invocation_id for r in graph_checkpointer.list()] == ["c", "a", "b"]
    assert [r.invocation_id for r in graph_checkpointer.list(None)] == ["c", "a", "b"]
    by_job = graph_checkpointer.list(CheckpointFilter(correlation_id="job-1"))
    assert [r.invocation_id for r in by_job] == ["a", "b"]
    failed = graph_checkpointer.list(CheckpointFilter(status="failed"))
    assert [r.invocation_id for r in failed] == ["b"]
    both = CheckpointFilter(correlation_id="job-2", status="running")
    assert [r.invocation_id for r in graph_checkpointer.list(both)] == ["c"]
    _same(by_job[0], make_record("a", status="done", last_saved_at=2.0))


def test_delete_says_whether_there_was_a_record(graph_checkpointer: Any) -> None:
    """guarantee 598"""
    graph_checkpointer.save(make_record("gone"))
    assert graph_checkpointer.delete("gone") is True
    assert graph_checkpointer.delete("gone") is False
    with pytest.raises(CheckpointNotFound):
        graph_checkpointer.load("gone")
    assert graph_checkpointer.list() == []


def test_async_forms_agree(graph_checkpointer: Any) -> None:
    """guarantee 598"""

    async def main() -> None:
        rec = make_record("async-1")
        await graph_checkpointer.asave(rec)
        _same(await graph_checkpointer.aload("async-1"), rec)
        assert [r.invocation_id for r in await graph_checkpointer.alist()] == ["async-1"]
        assert await graph_checkpointer.adelete("async-1") is True
        with pytest.raises(CheckpointNotFound):
            await graph_checkpointer.aload("async-1")

    asyncio.run(main())


class _Trip(State):
    trace: Annotated[list[str], append] = Field(default_factory=list)
    stops: list[str] = Field(default_factory=list)


def test_a_graph_resumes_from_it_after_a_failure(graph_checkpointer: Any) -> None:
    """guarantee 599: completed nodes (inside a subgraph too) are not run again"""
    ran: list[str] = []
    broken = {"y"}

    def node(name: str) -> Any:
        def run(state: _Trip) -> dict[str, Any]:
            ran.append(name)
            if name in broken:
                broken.discard(name)
                raise RuntimeError(f"{name} failed once")
            return {"trace": [name]}

        return run

    sub = (
        GraphBuilder(_Trip)
        .add_node("x", node("x"))
        .add_node("y", node("y"))
        .add_edge("x", "y")
        .add_edge("y", END)
        .set_entry("x")
        .compile()
    )
    graph = (
        GraphBuilder(_Trip)
        .add_node("a", node("a"))
        .add_subgraph_node("sub", sub)
        .add_node("b", node("b"))
        .add_edge("a", "sub")
        .add_edge("sub", "b")
        .add_edge("b", END)
        .set_entry("a")
        .with_checkpointer(graph_checkpointer)
        .compile()
    )
    with pytest.raises(NodeException) as failed:
        graph.invoke(_Trip(), correlation_id="trip")
    first = failed.value.invocation_id
    assert first is not None
    saved = graph_checkpointer.load(first)
    assert saved.status == "failed"
    assert [p.node_name for p in saved.completed_positions] == ["a", "x"]
    final = graph.invoke(resume_invocation=first)
    assert final.trace == ["a", "x", "y", "b"]
    assert ran == ["a", "x", "y", "y", "b"]
    attempts = graph_checkpointer.list(CheckpointFilter(correlation_id="trip"))
    assert [r.status for r in attempts] == ["failed", "done"]
    assert attempts[1].resumed_from == first and attempts[1].attempt_index == 1


def test_a_fan_out_resumes_from_it_with_only_the_unfinished_branches(
    graph_checkpointer: Any,
) -> None:
    """guarantee 601: finished branches are saved with their results and not run again"""
    ran: list[str] = []
    broken = {"r"}

    def visit(stop: str) -> dict[str, Any]:
        ran.append(stop)
        if stop in broken:
            broken.discard(stop)
            raise RuntimeError(f"{stop} failed once")
        return {"trace": [stop]}

    graph = (
        GraphBuilder(_Trip)
        .add_fan_out_node("visit", visit, over="stops", concurrency=1)
        .add_edge("visit", END)
        .set_entry("visit")
        .with_checkpointer(graph_checkpointer)
        .compile()
    )
    with pytest.raises(NodeException) as failed:
        graph.invoke(_Trip(stops=["p", "q", "r", "s"]), correlation_id="fan")
    first = failed.value.invocation_id
    assert first is not None
    (progress,) = graph_checkpointer.load(first).fan_outs
    assert [i for i, _ in progress.results] == [0, 1]
    final = graph.invoke(resume_invocation=first)
    assert final.trace == ["p", "q", "r", "s"]
    assert ran == ["p", "q", "r", "r", "s"]
