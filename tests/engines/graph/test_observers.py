"""Graph observers: told of node starts and ends, saves and the run's end, in order, never
changing the outcome (guarantees 596-597)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Annotated, Any

import pytest
from pydantic import Field

from stepstone.exceptions import ConfigurationTypeError
from stepstone.graph import (
    END,
    GraphBuilder,
    GraphEvent,
    InMemoryCheckpointer,
    NodeException,
    State,
    append,
)


class Trip(State):
    trace: Annotated[list[str], append] = Field(default_factory=list)
    fail: bool = False


def _step(name: str) -> Any:
    def run(state: Trip) -> dict[str, Any]:
        if state.fail and name == "b":
            raise RuntimeError("b broke")
        return {"trace": [name]}

    return run


def _graph(*, checkpointer: Any = None, observers: tuple[Any, ...] = ()) -> Any:
    b = (
        GraphBuilder(Trip)
        .add_node("a", _step("a"))
        .add_node("b", _step("b"))
        .add_edge("a", "b")
        .add_edge("b", END)
        .set_entry("a")
    )
    for fn in observers:
        b = b.with_observer(fn)
    if checkpointer is not None:
        b = b.with_checkpointer(checkpointer)
    return b.compile()


def test_observers_are_told_every_node_save_and_the_end_in_order() -> None:
    # guarantee 596
    seen: list[GraphEvent] = []
    told_async: list[str] = []

    async def async_observer(event: GraphEvent) -> None:
        await asyncio.sleep(0)
        told_async.append(event.kind)

    graph = _graph(checkpointer=InMemoryCheckpointer(), observers=(seen.append,))
    final = graph.invoke(Trip(), correlation_id="trip-1", observers=[async_observer])
    kinds = [(e.kind, e.node_name) for e in seen]
    assert kinds == [
        ("node_start", "a"),
        ("node_end", "a"),
        ("checkpoint_saved", "a"),
        ("node_start", "b"),
        ("node_end", "b"),
        ("checkpoint_saved", "b"),
        ("run_end", None),
    ]
    assert told_async == [k for k, _ in kinds]  # the per-invoke one too, same order
    ids = {(e.invocation_id, e.correlation_id) for e in seen}
    invocation = graph.checkpointer.list()[0].invocation_id
    assert ids == {(invocation, "trip-1")}
    assert seen[0].state == Trip() and seen[1].state == Trip(trace=["a"])
    assert [e.step for e in seen[:6]] == [0, 0, 0, 1, 1, 1]
    assert seen[-1].status == "done" and seen[-1].state == final


def test_a_failed_node_and_run_are_reported_with_their_error() -> None:
    # guarantee 596
    seen: list[GraphEvent] = []
    graph = _graph(observers=(seen.append,))  # no checkpointer: no checkpoint_saved
    with pytest.raises(NodeException):
        graph.invoke(Trip(fail=True))
    assert [e.kind for e in seen] == ["node_start", "node_end", "node_start", "node_end", "run_end"]
    assert isinstance(seen[3].error, NodeException) and seen[3].state is None
    assert seen[4].status == "failed" and seen[4].error is seen[3].error


def test_an_observer_that_raises_changes_nothing_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # guarantee 596
    seen: list[str] = []

    def broken(event: GraphEvent) -> None:
        raise ValueError("observer bug")

    async def broken_async(event: GraphEvent) -> None:
        raise KeyError("async observer bug")

    graph = _graph(observers=(broken, broken_async, lambda e: seen.append(e.kind)))
    with caplog.at_level(logging.WARNING, logger="stepstone"):
        final = graph.invoke(Trip())
    assert final.trace == ["a", "b"]
    assert seen[-1] == "run_end" and len(seen) == 5  # later observers still told
    messages = [r.getMessage() for r in caplog.records]
    assert sum("graph observer" in m and "the run goes on" in m for m in messages) == 10


def test_drain_waits_for_observers_still_working() -> None:
    # guarantee 597
    release = threading.Event()
    told: list[str] = []

    async def slow(event: GraphEvent) -> None:
        while not release.is_set():
            await asyncio.sleep(0.005)
        told.append(event.kind)

    graph = _graph(observers=(slow,))

    async def main() -> None:
        final = await graph.ainvoke(Trip())
        assert final.trace == ["a", "b"] and told == []  # the run never waited
        assert await graph.drain_observers(timeout=0.05) is False
        release.set()
        assert await graph.drain_observers() is True
        assert told[-1] == "run_end" and len(told) == 5

    asyncio.run(main())


def test_subgraph_events_carry_their_namespace() -> None:
    # guarantee 596
    inner_seen: list[tuple[str, tuple[str, ...]]] = []
    inner = (
        GraphBuilder(Trip)
        .add_node("x", _step("x"))
        .add_edge("x", END)
        .set_entry("x")
        .with_observer(lambda e: inner_seen.append((e.kind, e.namespace)))
        .compile()
    )
    seen: list[GraphEvent] = []
    outer = (
        GraphBuilder(Trip)
        .add_subgraph_node("sub", inner)
        .add_edge("sub", END)
        .set_entry("sub")
        .compile()
    )
    outer.invoke(Trip(), observers=[seen.append])
    assert [(e.kind, e.node_name, e.namespace) for e in seen] == [
        ("node_start", "sub", ()),
        ("node_start", "x", ("sub",)),
        ("node_end", "x", ("sub",)),
        ("node_end", "sub", ()),
        ("run_end", None, ()),
    ]
    assert inner_seen == [("node_start", ("sub",)), ("node_end", ("sub",))]


@pytest.mark.parametrize("bad", [print, "print", [1]])
def test_observers_that_are_not_functions_are_refused(bad: Any) -> None:
    # guarantee 596
    with pytest.raises(ConfigurationTypeError, match="observer"):
        _graph().invoke(Trip(), observers=bad)
    with pytest.raises(ConfigurationTypeError, match="observer"):
        GraphBuilder(Trip).with_observer(3)  # type: ignore[arg-type]
