"""Reducers beside `append`, and the typed errors a failing node update raises
(guarantees 590-593)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import pytest
from pydantic import Field

from stepstone.graph import (
    END,
    CheckpointSaveFailed,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    EdgeException,
    GraphBuilder,
    InMemoryCheckpointer,
    NodeException,
    ReducerError,
    RoutingError,
    State,
    StateValidationError,
    StoreCheckpointer,
    append,
    concat_flatten,
    last_write_wins,
    merge,
    merge_all,
)
from stepstone.store import Store


def _one_node(cls: type[State], update: Any, cp: Any = None) -> Any:
    b = GraphBuilder(cls).add_node("n", lambda s: update).add_edge("n", END).set_entry("n")
    if cp is not None:
        b = b.with_checkpointer(cp)
    return b.compile()


def test_append_refuses_a_current_value_that_is_not_a_list() -> None:
    # guarantee 590 (issue 36 item 5): a string was taken apart into its characters
    with pytest.raises(TypeError, match="current value is str 'abc'"):
        append("abc", ["x"])
    with pytest.raises(TypeError, match="takes a list of new items, got str 'x'"):
        append([], "x")
    assert append(None, ["x"]) == ["x"]
    assert append(("a",), ("b",)) == ["a", "b"]

    class Tagged(State):
        tags: Annotated[Any, append] = "abc"

    graph = _one_node(Tagged, {"tags": ["x"]})
    with pytest.raises(ReducerError) as info:
        graph.invoke(Tagged())
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, NodeException)
    assert (err.field, err.reducer, err.node_name, err.category) == (
        "tags",
        "append",
        "n",
        "reducer_error",
    )
    assert "field 'tags'" in str(err) and "current value is str 'abc'" in str(err)
    assert isinstance(err.__cause__, TypeError)
    assert err.recoverable_state == Tagged()


class Board(State):
    notes: Annotated[dict[str, int], merge] = Field(default_factory=dict)
    counts: Annotated[dict[str, int], merge_all] = Field(default_factory=dict)
    hits: Annotated[list[str], concat_flatten] = Field(default_factory=list)
    owner: Annotated[str, last_write_wins] = ""


def test_the_built_in_reducers_merge_as_documented() -> None:
    # guarantee 591
    b = (
        GraphBuilder(Board)
        .add_node("a", lambda s: {"notes": {"x": 1, "y": 1}, "hits": [["a", "b"], []]})
        .add_node(
            "b",
            lambda s: {
                "notes": {"y": 2},
                "counts": [{"p": 1, "q": 1}, {"q": 2}],
                "hits": [["c"]],
                "owner": "b",
            },
        )
        .add_edge("a", "b")
        .add_edge("b", END)
        .set_entry("a")
    )
    final = b.compile().invoke(Board(owner="start"))
    assert final.notes == {"x": 1, "y": 2}
    assert final.counts == {"p": 1, "q": 2}
    assert final.hits == ["a", "b", "c"]
    assert final.owner == "b"
    assert merge({"a": 1}, {"a": 2, "b": 3}) == {"a": 2, "b": 3}
    assert merge_all(None, [{"a": 1}, {"a": 2}]) == {"a": 2}
    assert concat_flatten(["z"], [["a"], ("b",)]) == ["z", "a", "b"]
    assert last_write_wins(1, 2) == 2


@pytest.mark.parametrize(
    ("update", "field", "message"),
    [
        ({"notes": ["x"]}, "notes", "`merge` takes a dict of keys to set, got list"),
        ({"counts": {"a": 1}}, "counts", "`merge_all` takes a list of new items, got dict"),
        ({"counts": [{"a": 1}, 3]}, "counts", r"item \[1\] is int 3"),
        ({"hits": ["a"]}, "hits", r"`concat_flatten` takes a list of lists, but item \[0\]"),
        ({"hits": "ab"}, "hits", "`concat_flatten` takes a list of new items, got str"),
    ],
)
def test_each_reducer_refuses_what_it_cannot_merge(
    update: dict[str, Any], field: str, message: str
) -> None:
    # guarantee 591
    with pytest.raises(ReducerError, match=message) as info:
        _one_node(Board, update).invoke(Board())
    assert info.value.field == field


def test_merge_refuses_a_current_value_that_is_not_a_dict() -> None:
    # guarantee 591
    with pytest.raises(TypeError, match="keeps a dict, but the field's current value is list"):
        merge(["a"], {"b": 1})
    with pytest.raises(TypeError, match="keeps a list, but the field's current value is dict"):
        concat_flatten({"a": 1}, [["b"]])


def test_concat_flatten_is_checkpointed_as_the_items_it_adds() -> None:
    # guarantee 592: like append, a delta; a resume folds it back to the same state
    with Store() as store:
        cp = StoreCheckpointer(store)
        graph = _one_node(Board, {"hits": [["a", "b"], ["c"]], "notes": {"k": 1}}, cp)
        final = graph.invoke(Board(hits=["z"]), correlation_id="flat")
        rec = cp.list()[0]
        assert rec.state["hits"] == ["z", "a", "b", "c"] == final.hits
        node_row = store.backend.run_journal(cp.key(rec.invocation_id), 0)[1]
        assert '"extend":{"hits":["a","b","c"]}' in node_row.data.replace(" ", "")


def test_a_custom_reducer_that_raises_is_a_reducer_error() -> None:
    # guarantee 591
    from stepstone.graph import Reducer

    def positive(old: int, new: int) -> int:
        if new < 0:
            raise ValueError("only positive increments")
        return old + new

    class Total(State):
        total: Annotated[int, Reducer(positive)] = 0

    with pytest.raises(ReducerError, match="`positive` reducer of field 'total'") as info:
        _one_node(Total, {"total": -1}).invoke(Total())
    assert isinstance(info.value.__cause__, ValueError)


class Flow(State):
    n: int = 0
    go: str = "b"


def _routed(router: Any, targets: Any = None) -> Any:
    return (
        GraphBuilder(Flow)
        .add_node("a", lambda s: {"n": 1})
        .add_node("b", lambda s: None)
        .add_conditional_edge("a", router, targets)
        .add_edge("b", END)
        .set_entry("a")
        .with_checkpointer(InMemoryCheckpointer())
        .compile()
    )


def test_a_router_that_raises_is_an_edge_exception() -> None:
    # guarantee 593
    def broken(state: Flow) -> str:
        raise KeyError("lookup")

    with pytest.raises(EdgeException) as info:
        _routed(broken).invoke(Flow())
    err = info.value
    assert (err.category, err.node_name) == ("edge_exception", "a")
    assert isinstance(err.__cause__, KeyError) and isinstance(err, NodeException)
    assert err.invocation_id is not None  # a's completion was saved first


def test_a_router_that_returns_an_unknown_node_is_a_routing_error() -> None:
    # guarantee 593
    with pytest.raises(RoutingError, match="returned 'nowhere'") as info:
        _routed(lambda s: "nowhere", ["b", END]).invoke(Flow())
    assert info.value.category == "routing_error" and info.value.node_name == "a"


def test_an_update_that_does_not_fit_the_state_is_a_state_validation_error() -> None:
    # guarantee 593
    with pytest.raises(StateValidationError, match="unknown field") as info:
        _one_node(Flow, {"nope": 1}).invoke(Flow())
    assert isinstance(info.value, ValueError) and info.value.category == "state_validation_error"
    with pytest.raises(StateValidationError, match="does not validate") as info:
        _one_node(Flow, {"n": "many"}).invoke(Flow())
    assert info.value.__cause__ is not None


def test_a_checkpoint_that_cannot_be_saved_is_checkpoint_save_failed(tmp_path: Any) -> None:
    # guarantee 593: the store goes away while the node runs; its update cannot be saved
    store = Store(db=tmp_path / "c.sqlite")
    cp = StoreCheckpointer(store)

    def closes_the_store(state: Flow) -> dict[str, int]:
        store.close()
        return {"n": 1}

    graph = (
        GraphBuilder(Flow)
        .add_node("a", closes_the_store)
        .add_edge("a", END)
        .set_entry("a")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(CheckpointSaveFailed, match="after node 'a' could not be saved") as info:
        graph.invoke(Flow())
    err = info.value
    assert err.category == "checkpoint_save_failed" and err.node_name == "a"
    assert err.invocation_id is not None and "resume_invocation" in str(err)
    assert err.__cause__ is not None


class V1(State):
    schema_version: ClassVar[str] = "v1"
    x: int = 0


class V3(State):
    schema_version: ClassVar[str] = "v3"
    x: int = 0
    y: int


def test_migration_errors_carry_from_and_to_versions() -> None:
    # guarantee 593
    cp = InMemoryCheckpointer()
    first = _one_node(V1, {"x": 1}, cp)
    first.invoke(V1(), correlation_id="m")
    saved = cp.list()[0].invocation_id
    missing = _one_node(V3, None, cp)
    with pytest.raises(CheckpointStateMigrationMissing) as info:
        missing.invoke(resume_invocation=saved)
    assert (info.value.from_version, info.value.to_version) == ("v1", "v3")
    assert info.value.category == "checkpoint_state_migration_missing"
    failing = (
        GraphBuilder(V3)
        .add_node("n", lambda s: None)
        .add_edge("n", END)
        .set_entry("n")
        .with_checkpointer(cp)
        .with_state_migration("v1", "v3", lambda s: s)  # forgets the required y
        .compile()
    )
    with pytest.raises(CheckpointStateMigrationFailed) as failed:
        failing.invoke(resume_invocation=saved)
    assert (failed.value.from_version, failed.value.to_version) == ("v1", "v3")
