"""Graph checkpointers: saves through the kernel, record shape, JSON/pickle, list/delete."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from stepstone import Store
from stepstone.exceptions import NodeException
from stepstone.graph import (
    END,
    CheckpointFilter,
    CheckpointNotFound,
    CheckpointRecord,
    CheckpointRecordInvalid,
    GraphBuilder,
    InMemoryCheckpointer,
    NodePosition,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
    append,
)
from tests.engines.graph._graphs import Calls, Mission, loop_graph, mission_v1
from tests.engines.graph._graphs import Counter as Counter_
from tests.store.damage import stored_rows

KEY = b"k" * 32


def test_sqlite_checkpointer_defaults_to_json(tmp_path: Path) -> None:
    # guarantee 105
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    assert cp.serialization == "json"
    mission_v1(cp, Calls()).invoke(Mission(destination="Moon"), correlation_id="j")
    (rec,) = cp.list()
    assert isinstance(rec.state, dict)
    assert rec.serialization == "json"
    # the saved rows are readable JSON text in the SQLite file
    con = sqlite3.connect(tmp_path / "c.sqlite")
    rows = [json.loads(d) for (d,) in con.execute("SELECT data FROM stepstone_journal")]
    con.close()
    assert rows[0]["body"]["frames"][0]["state"]["destination"] == "Moon"


def test_pickle_needs_a_key(tmp_path: Path) -> None:
    # guarantee 105: pickle only signed with a user key
    from stepstone.exceptions import UserError

    with pytest.raises(UserError, match="pickle_key"):
        SQLiteCheckpointer(tmp_path / "c.sqlite", serialization="pickle")
    assert not (tmp_path / "c.sqlite").exists()
    with pytest.raises(UserError, match="'json'"):
        SQLiteCheckpointer(tmp_path / "c.sqlite", serialization="yaml")  # type: ignore[arg-type]


def test_pickle_round_trip_and_tamper_refused(tmp_path: Path) -> None:
    # guarantee 105: signed pickle works; tampered, unsigned or wrongly keyed data is refused
    db = tmp_path / "p.sqlite"
    cp = SQLiteCheckpointer(db, serialization="pickle", pickle_key=KEY)
    final = mission_v1(cp, Calls()).invoke(Mission(destination="Moon"))
    (rec,) = cp.list()
    assert rec.serialization == "pickle"
    assert rec.state == final  # the State instance itself
    assert isinstance(rec.state, Mission)
    assert Store(db=db).read(cp.key(rec.invocation_id))["state"] == "<signed pickle>"

    with pytest.raises(CheckpointRecordInvalid, match="serialization='pickle'"):
        SQLiteCheckpointer(db).load(rec.invocation_id)  # a JSON checkpointer has no key
    with pytest.raises(CheckpointRecordInvalid, match="signature"):
        SQLiteCheckpointer(db, serialization="pickle", pickle_key=b"x" * 32).load(rec.invocation_id)

    con = sqlite3.connect(db)
    seq, data = con.execute(
        "SELECT seq, data FROM stepstone_journal ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    row = json.loads(data)
    blob = bytearray(base64.b64decode(row["body_pickle"]))
    blob[-3] ^= 0x01  # flip one bit of the pickled payload
    row["body_pickle"] = base64.b64encode(bytes(blob)).decode()
    con.execute("UPDATE stepstone_journal SET data = ? WHERE seq = ?", (json.dumps(row), seq))
    con.commit()
    with pytest.raises(CheckpointRecordInvalid, match="signature does not match"):
        cp.load(rec.invocation_id)
    import pickle

    row["body_pickle"] = base64.b64encode(pickle.dumps({"patch": {}, "push": []})).decode()
    con.execute("UPDATE stepstone_journal SET data = ? WHERE seq = ?", (json.dumps(row), seq))
    con.commit()
    con.close()
    with pytest.raises(CheckpointRecordInvalid, match="unsigned pickle"):
        cp.load(rec.invocation_id)


def test_a_journal_row_of_a_kind_a_graph_never_writes_is_refused(tmp_path: Path) -> None:
    """guarantee 131: a node row whose kind a flipped byte changed is not skipped (the
    record would lose that node); loading it names the record."""
    db = tmp_path / "c.sqlite"
    cp = SQLiteCheckpointer(db)
    mission_v1(cp, Calls()).invoke(Mission(destination="Moon"), correlation_id="j")
    (rec,) = cp.list()
    con = sqlite3.connect(db)
    con.execute("UPDATE stepstone_journal SET kind = 'nXde' WHERE kind = 'node'")
    con.commit()
    con.close()
    with pytest.raises(CheckpointRecordInvalid, match="'nXde' row, which a graph record never"):
        cp.load(rec.invocation_id)


GRAPH_CORRUPTIONS = {
    "a lost node row": ("DELETE FROM stepstone_journal WHERE seq = 1", "rows [1] are missing"),
    "a node row past the head's count": (
        "UPDATE stepstone_runs SET journal_len = journal_len - 1 WHERE kind = 'graph'",
        "past them",
    ),
    "a node row that is not an object": (
        "UPDATE stepstone_journal SET data = '[1]' WHERE seq = 1",
        "cannot be decoded",
    ),
    "a patch whose field name is damaged": (
        "UPDATE stepstone_journal SET data = replace(data, '\"extend\"', '\"extejd\"') "
        "WHERE seq = 1",
        "['extejd'], which a graph never writes",
    ),
    "a node row whose field name is damaged": (
        "UPDATE stepstone_journal SET data = replace(data, '\"pop\"', '\"pXp\"') WHERE seq = 2",
        "['pXp'], which a graph never writes",
    ),
    "a state that no longer validates": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.body.patch.extend.trace[0]', 7) "
        "WHERE seq = 1",
        "does not validate",
    ),
}


@pytest.mark.parametrize("case", sorted(GRAPH_CORRUPTIONS))
def test_a_corrupt_record_is_refused_before_the_resume_writes(tmp_path: Path, case: str) -> None:
    """guarantee 131, 132: a lost or extra row, a row that is not an object, or a saved
    state the graph's state class refuses stops the resume before anything (its resume
    lock included) is written, and before any node runs."""
    sql, what = GRAPH_CORRUPTIONS[case]
    db = tmp_path / "c.sqlite"
    cp = SQLiteCheckpointer(db)
    with pytest.raises(NodeException):
        loop_graph(cp, fail_at=3).invoke(Counter_(), correlation_id="g")
    (rec,) = cp.list()
    con = sqlite3.connect(db)
    con.execute(sql)
    con.commit()
    con.close()
    before = stored_rows(db)
    log = tmp_path / "ticks.log"
    for _ in range(2):
        with pytest.raises(CheckpointRecordInvalid, match=rec.invocation_id) as info:
            loop_graph(cp, log=log).invoke(resume_invocation=rec.invocation_id)
        assert what in str(info.value)
    assert stored_rows(db) == before
    assert not log.exists()
    cp.close()


def test_save_after_every_node_before_the_next_starts(tmp_path: Path) -> None:
    # guarantee 106: each node sees, from another connection, the records of all nodes before it
    db = tmp_path / "c.sqlite"
    seen: dict[str, list[str]] = {}

    def observe(name: str) -> Any:
        def fn(state: Mission) -> dict[str, Any]:
            reader = SQLiteCheckpointer(db)
            (rec,) = reader.list()
            seen[name] = [p.node_name for p in rec.completed_positions]
            assert rec.state["trace"] == list(state.trace)
            reader.close()
            return {"trace": [name]}

        return fn

    graph = (
        GraphBuilder(Mission)
        .add_node("a", observe("a"))
        .add_node("b", observe("b"))
        .add_node("c", observe("c"))
        .add_edge("a", "b")
        .add_edge("b", "c")
        .add_edge("c", END)
        .set_entry("a")
        .with_checkpointer(SQLiteCheckpointer(db))
        .compile()
    )
    graph.invoke(Mission(destination="x"))
    assert seen == {"a": [], "b": ["a"], "c": ["a", "b"]}


class Inner(State):
    topic: str
    notes: Annotated[list[str], append] = Field(default_factory=list)
    trace: Annotated[list[str], append] = Field(default_factory=list)


class Outer(State):
    topic: str
    notes: list[str] = Field(default_factory=list)
    trace: Annotated[list[str], append] = Field(default_factory=list)


def test_subgraph_internal_nodes_are_saved(tmp_path: Path) -> None:
    # guarantee 107: saves fire for subgraph-internal nodes too, via the parent's with_checkpointer
    db = tmp_path / "c.sqlite"
    seen: list[tuple[list[tuple[tuple[str, ...], str]], Any, tuple[Any, ...]]] = []

    def peek(state: Any) -> None:
        (rec,) = SQLiteCheckpointer(db).list()
        seen.append(
            (
                [(p.namespace, p.node_name) for p in rec.completed_positions],
                rec.state,
                rec.parent_states,
            )
        )

    def research(state: Inner) -> dict[str, Any]:
        return {"notes": [f"facts about {state.topic}"], "trace": ["research"]}

    def summarise(state: Inner) -> dict[str, Any]:
        peek(state)
        return {"notes": ["summary"], "trace": ["summarise"]}

    sub = (
        GraphBuilder(Inner)
        .add_node("research", research)
        .add_node("summarise", summarise)
        .add_edge("research", "summarise")
        .add_edge("summarise", END)
        .set_entry("research")
        .compile()
    )

    def publish(state: Outer) -> dict[str, Any]:
        peek(state)
        return {"trace": ["publish"]}

    graph = (
        GraphBuilder(Outer)
        .add_subgraph_node("study", sub)
        .add_node("publish", publish)
        .add_edge("study", "publish")
        .add_edge("publish", END)
        .set_entry("study")
        .with_checkpointer(SQLiteCheckpointer(db))
        .compile()
    )
    final = graph.invoke(Outer(topic="regolith"))
    assert final.trace == ["research", "summarise", "publish"]
    assert final.notes == ["facts about regolith", "summary"]
    inside, after = seen
    assert inside[0] == [(("study",), "research")]
    assert inside[1]["notes"] == ["facts about regolith"]  # the subgraph's own state
    assert inside[2][0]["topic"] == "regolith"  # the parent's state, outermost first
    assert after[0] == [(("study",), "research"), (("study",), "summarise"), ((), "study")]
    assert after[2] == ()


def test_record_fields_and_positions(tmp_path: Path) -> None:
    # guarantee 114: completed_positions is a tuple of NodePosition(namespace, node_name, step,
    # attempt_index); guarantee 113: correlation_id is the caller's
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    loop_graph(cp).invoke(Counter_(limit=3), correlation_id="loop-1", metadata={"who": "t"})
    (rec,) = cp.list(CheckpointFilter(correlation_id="loop-1"))
    assert isinstance(rec, CheckpointRecord)
    assert isinstance(rec.completed_positions, tuple)
    assert rec.completed_positions == (
        NodePosition((), "start", 0, 0),
        NodePosition((), "tick", 1, 0),
        NodePosition((), "tick", 2, 0),
        NodePosition((), "tick", 3, 0),
        NodePosition((), "finish", 4, 0),
    )
    assert rec.correlation_id == "loop-1"
    assert rec.metadata == {"who": "t"}
    assert rec.status == "done"
    assert rec.schema_version == ""
    assert rec.parent_states == ()
    assert rec.last_saved_at > 0
    assert cp.load(rec.invocation_id) == rec


def test_correlation_id_defaults_to_the_invocation_id() -> None:
    # guarantee 113
    cp = InMemoryCheckpointer()
    mission_v1(cp, Calls()).invoke(Mission(destination="x"))
    (rec,) = cp.list()
    assert rec.correlation_id == rec.invocation_id


def test_list_filters_and_delete() -> None:
    cp = InMemoryCheckpointer()
    g = mission_v1(cp, Calls())
    g.invoke(Mission(destination="a"), correlation_id="one")
    g.invoke(Mission(destination="b"), correlation_id="two")
    g.invoke(Mission(destination="c"), correlation_id="two")
    assert [r.state["destination"] for r in cp.list(CheckpointFilter(correlation_id="two"))] == [
        "b",
        "c",
    ]
    assert len(cp.list()) == 3
    assert len(cp.list(CheckpointFilter(status="done"))) == 3
    assert cp.list(CheckpointFilter(status="failed")) == []
    first = cp.list(CheckpointFilter(correlation_id="one"))[0].invocation_id
    assert cp.delete(first)
    assert not cp.delete(first)
    with pytest.raises(CheckpointNotFound, match=first):
        cp.load(first)


async def test_async_twins() -> None:
    cp = InMemoryCheckpointer()
    g = mission_v1(cp, Calls())
    await g.ainvoke(Mission(destination="a"), correlation_id="c")
    (rec,) = await cp.alist(CheckpointFilter(correlation_id="c"))
    assert (await cp.aload(rec.invocation_id)).state["crew_size"] == 4
    assert await cp.adelete(rec.invocation_id)


def test_store_checkpointer_over_any_store(tmp_path: Path) -> None:
    # the same records over a shared Store, next to plain values; store.read shows the record
    store = Store(db=tmp_path / "shared.sqlite")
    store.write("unrelated", {"x": 1})
    cp = StoreCheckpointer(store, prefix="missions/")
    mission_v1(cp, Calls()).invoke(Mission(destination="Moon"), correlation_id="m")
    (rec,) = cp.list()
    view = store.read(f"missions/{rec.invocation_id}")
    assert view["kind"] == "graph"
    assert view["status"] == "done"
    assert view["state"]["crew_size"] == 4
    assert view["completed_positions"][0] == [[], "define_objective", 0, 0]
    entry = store.read_entry(f"missions/{rec.invocation_id}")
    assert entry is not None and entry.run_kind == "graph"
    assert store.read("unrelated") == {"x": 1}


def test_bytes_per_node_do_not_grow_with_run_length(tmp_path: Path) -> None:
    # ARCHITECTURE.md "append, don't rewrite": node k's journal row does not carry the state so far
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")

    class Big(State):
        n: int = 0
        limit: int
        payload: str = "x" * 2000
        trace: Annotated[list[str], append] = Field(default_factory=list)

    def tick(state: Big) -> dict[str, Any]:
        return {"n": state.n + 1, "trace": [f"tick-{state.n:04d}"]}

    g = (
        GraphBuilder(Big)
        .add_node("tick", tick)
        .add_conditional_edge("tick", lambda s: "tick" if s.n < s.limit else END)
        .set_entry("tick")
        .with_checkpointer(cp)
        .compile()
    )
    g.invoke(Big(limit=300))
    con = sqlite3.connect(tmp_path / "c.sqlite")
    sizes = [n for (n,) in con.execute("SELECT length(data) FROM stepstone_journal ORDER BY seq")]
    con.close()
    node_rows = sizes[1:]
    assert len(node_rows) == 300
    assert max(node_rows) - min(node_rows) <= 4  # only the digits of the step number grow
    assert max(node_rows) < 200  # far smaller than the 2 kB state
    assert sum(sizes) < sizes[0] + 300 * 200  # linear in the run length


def test_unknown_invocation() -> None:
    cp = InMemoryCheckpointer()
    with pytest.raises(CheckpointNotFound, match="nope"):
        cp.load("nope")


def test_frozen_format_1_record_keeps_loading() -> None:
    # a format version: a record written by the first release of the format loads and resumes
    from stepstone.core._serialization import dumps
    from stepstone.store import Claim, JournalRow, RunHead
    from tests.engines.graph._graphs import mission_v2

    fixture = json.loads((Path(__file__).parent / "fixtures" / "record_format1.json").read_text())
    cp = InMemoryCheckpointer()
    head = RunHead(
        key=fixture["key"],
        kind="graph",
        status=fixture["status"],
        next_step=None,
        run_uid="0" * 32,
        version=5,
        iteration=3,
        journal_len=len(fixture["rows"]),
        host="gone",
        pid=1,
        pid_start=None,
        lease_until=0.0,
        meta=fixture["meta"],
        created_at=0.0,
        updated_at=1.0,
    )
    rows = [JournalRow(r["seq"], r["kind"], r["name"], dumps(r["data"])) for r in fixture["rows"]]
    cp.store.backend.run_transact(head.key, lambda h, kv: Claim(head=head, rows=rows))
    (rec,) = cp.list(CheckpointFilter(correlation_id="fixture"))
    assert rec.state["crew_size"] == 4 and rec.schema_version == "v1"
    calls = Calls()
    final = mission_v2(cp, calls).invoke(resume_invocation=rec.invocation_id)
    assert calls.calls == ["assess_risks"]
    assert final.trace == ["define_objective", "size_crew", "draft_timeline", "assess_risks"]
