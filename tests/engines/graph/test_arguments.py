"""Arguments of the wrong type or value are refused with an error naming them and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.exceptions import (
    ConfigurationError,
    ConfigurationTypeError,
    SerializationError,
    UserError,
)
from stepstone.graph import (
    END,
    CheckpointFilter,
    CompiledGraph,
    GraphBuilder,
    GraphCompileError,
    InMemoryCheckpointer,
    NodeException,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
)


class S(State):
    n: int = 0


def _routed(router: Any, targets: Any) -> GraphBuilder[S]:
    return (
        GraphBuilder(S)
        .add_node("a", lambda s: None)
        .add_node("b", lambda s: None)
        .add_conditional_edge("a", router, targets)
        .add_edge("b", END)
        .set_entry("a")
    )


def _graph(cp: StoreCheckpointer | None = None) -> CompiledGraph[S]:
    b = GraphBuilder(S).add_node("a", lambda s: {"n": 1}).add_edge("a", END).set_entry("a")
    return (b.with_checkpointer(cp) if cp is not None else b).compile()


@pytest.mark.parametrize("targets", [5, "ab", b"ab", {}, []])
def test_conditional_edge_targets_are_a_list_or_a_mapping(targets: Any) -> None:
    # guarantee 362: a str is not read as a list of one-letter node names
    with pytest.raises(GraphCompileError, match=r"add_conditional_edge\('a', \.\.\.\): targets"):
        _routed(lambda s: "b", targets)


@pytest.mark.parametrize(
    ("returned", "targets", "listed"),
    [
        (END, ["b"], "its targets ['b']"),
        ("x", ["b", END], "its targets ['b', END]"),
        ("x", {"go": "b", "stop": END}, "its targets ['go', 'stop']"),
        ("x", None, "its targets ['a', 'b', END]"),
    ],
)
def test_a_router_refused_at_run_time_lists_what_it_may_return(
    returned: Any, targets: Any, listed: str
) -> None:
    # guarantee 362: END is listed only where it is allowed
    with pytest.raises(NodeException) as info:
        _routed(lambda s: returned, targets).compile().invoke(S())
    assert str(info.value).endswith(f"returned {returned!r}, which is not one of {listed}")


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"correlation_id": 5}, ConfigurationTypeError, "correlation_id must be a str or None"),
        ({"correlation_id": {"a": 1}}, ConfigurationTypeError, "correlation_id must be a str"),
        ({"correlation_id": ""}, ConfigurationError, "correlation_id must not be empty"),
        ({"metadata": 5}, ConfigurationTypeError, "metadata must be a dict"),
        ({"metadata": [1]}, ConfigurationTypeError, r"metadata must be a dict .* got \[1\]"),
    ],
)
def test_invoke_refuses_options_of_the_wrong_type(
    checkpointed: bool, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    # guarantee 362: refused before anything runs or is saved
    cp = InMemoryCheckpointer()
    with pytest.raises(error, match=message):
        _graph(cp if checkpointed else None).invoke(S(), **options)
    assert cp.list() == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SQLiteCheckpointer(None), "the path of a SQLite file, got None"),
        (lambda: StoreCheckpointer(5), "takes a stepstone Store, got 5"),
        (lambda: StoreCheckpointer("x.db"), r"got 'x.db'.*SQLiteCheckpointer\(path\)"),
    ],
)
def test_checkpointers_refuse_what_is_not_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, message: str
) -> None:
    # guarantee 362: at construction, not at the first save
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationTypeError, match=message) as info:
        make()
    assert isinstance(info.value, UserError) and isinstance(info.value, TypeError)
    assert list(tmp_path.iterdir()) == []  # no file was created


@pytest.mark.parametrize("flt", [{"correlation_id": "c"}, "c", 5])
async def test_list_takes_a_checkpoint_filter(flt: Any) -> None:
    # guarantee 362
    cp = StoreCheckpointer(Store())
    await _graph(cp).ainvoke(S(), correlation_id="c")
    with pytest.raises(ConfigurationTypeError, match=r"takes a CheckpointFilter or None, got"):
        cp.list(flt)
    with pytest.raises(ConfigurationTypeError, match="CheckpointFilter"):
        await cp.alist(flt)
    assert [r.correlation_id for r in cp.list(CheckpointFilter(correlation_id="c"))] == ["c"]


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (
            {"status": "bogus"},
            ConfigurationError,
            r"status 'bogus' is not a status a record can have; pass one of 'running', "
            r"'paused', 'failed', 'done', or None",
        ),
        ({"status": "claimed"}, ConfigurationError, r"a claimed run's record shows 'running'"),
        ({"status": "DONE"}, ConfigurationError, r"status 'DONE' is not a status"),
        ({"status": 5}, ConfigurationTypeError, r"status must be a str or None, got 5"),
        ({"correlation_id": 5}, ConfigurationTypeError, r"correlation_id must be a str or None"),
        ({"correlation_id": ""}, ConfigurationError, r"correlation_id must not be empty"),
    ],
)
def test_a_checkpoint_filter_no_record_can_match_is_refused(
    fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    # guarantee 364: refused when the filter is made, instead of listing nothing
    with pytest.raises(error, match=message):
        CheckpointFilter(**fields)


def test_a_checkpoint_filter_by_status_lists_the_records_in_it(tmp_path: Path) -> None:
    # guarantee 364: every status a record can show is accepted and matched
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    try:
        _graph(cp).invoke(S(), correlation_id="c")
        assert [r.status for r in cp.list(CheckpointFilter(status="done"))] == ["done"]
        for status in ("running", "paused", "failed"):
            assert cp.list(CheckpointFilter(status=status, correlation_id="c")) == []
    finally:
        cp.close()


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize(
    ("metadata", "place"),
    [
        ({"job": "j", "when": object()}, r"metadata\['when'\] is <object object at"),
        ({"batch": {"ids": [1, {2, 3}]}}, r"metadata\['batch'\]\['ids'\]\[1\] is \{2, 3\}"),
        ({"ratio": float("nan")}, r"metadata\['ratio'\] is nan \(type float\)"),
        ({"raw": b"\x00"}, r"metadata\['raw'\] is b'\\x00' \(type bytes\)"),
        ({(1, 2): "pair"}, r"metadata key \(1, 2\) is a key of type tuple"),
    ],
)
def test_metadata_json_cannot_hold_is_refused_naming_its_key(
    tmp_path: Path, checkpointed: bool, metadata: dict[Any, Any], place: str
) -> None:
    # guarantee 365: the error names metadata and the key, before any node runs
    ran: list[str] = []
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite") if checkpointed else None
    b = GraphBuilder(S).add_node("a", lambda s: ran.append("a")).add_edge("a", END).set_entry("a")
    graph = (b.with_checkpointer(cp) if cp is not None else b).compile()
    with pytest.raises(SerializationError, match=place) as info:
        graph.invoke(S(), metadata=metadata)
    assert "which JSON cannot hold" in str(info.value)
    assert "nothing was run or saved" in str(info.value)
    assert ran == []
    if cp is not None:
        assert cp.list() == [] and cp.store.keys() == []
        cp.close()


class Sub(State):
    n: int = 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inputs": 5}, r"inputs= is a function parent_state -> the initial Sub .* got 5"),
        ({"inputs": {"n": 1}}, r"inputs= is a function .* got \{'n': 1\}"),
        ({"inputs": "n"}, r"inputs= is a function .* got 'n'"),
        ({"outputs": 5}, r"outputs= is a function final Sub -> the parent's update .* got 5"),
        ({"outputs": ["n"]}, r"outputs= is a function .* got \['n'\]"),
    ],
)
def test_subgraph_inputs_and_outputs_that_are_not_functions_are_refused_when_added(
    options: dict[str, Any], message: str
) -> None:
    # guarantee 366: at add_subgraph_node, not when the graph first runs the node
    sub = GraphBuilder(Sub).add_node("s", lambda s: {"n": 2}).add_edge("s", END).set_entry("s")
    with pytest.raises(GraphCompileError, match=rf"subgraph node 'inner': {message}"):
        GraphBuilder(S).add_subgraph_node("inner", sub.compile(), **options)


def test_subgraph_inputs_and_outputs_functions_are_accepted() -> None:
    # guarantee 366: functions (or None, the defaults) still run as before
    sub = GraphBuilder(Sub).add_node("s", lambda s: {"n": s.n + 2}).add_edge("s", END)
    graph = (
        GraphBuilder(S)
        .add_subgraph_node(
            "inner",
            sub.set_entry("s").compile(),
            inputs=lambda s: {"n": s.n * 10},
            outputs=lambda sub_state: {"n": sub_state.n},
        )
        .add_edge("inner", END)
        .set_entry("inner")
        .compile()
    )
    assert graph.invoke(S(n=1)).n == 12
