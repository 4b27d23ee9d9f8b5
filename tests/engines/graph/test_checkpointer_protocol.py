"""The public checkpointer protocol: the conformance suite over the built-in checkpointers
and one written as a user would (records as JSON files), and what with_checkpointer
accepts (guarantees 598-600)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.exceptions import (
    CheckpointNotFound,
    CheckpointSaveFailed,
    GraphCompileError,
    NodeException,
)
from stepstone.graph import (
    END,
    Checkpointer,
    CheckpointFilter,
    CheckpointRecord,
    GraphBuilder,
    InMemoryCheckpointer,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
)
from stepstone.testing.checkpointer_conformance import *  # noqa: F403


class JsonFileCheckpointer(Checkpointer):
    """Records as JSON files in a directory: what a user might write (the async forms are
    the base class's, the sync methods in a worker thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)

    def _path(self, invocation_id: str) -> Path:
        return self.root / f"{invocation_id}.json"

    def save(self, record: CheckpointRecord) -> None:
        tmp = self._path(record.invocation_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record.to_json()))
        os.replace(tmp, self._path(record.invocation_id))

    def load(self, invocation_id: str) -> CheckpointRecord:
        try:
            text = self._path(invocation_id).read_text()
        except FileNotFoundError:
            raise CheckpointNotFound(f"no record {invocation_id!r} in {self.root}") from None
        return CheckpointRecord.from_json(json.loads(text))

    def list(self, filter: CheckpointFilter | None = None) -> list[CheckpointRecord]:
        flt = filter or CheckpointFilter()
        out = [
            CheckpointRecord.from_json(json.loads(p.read_text())) for p in self.root.glob("*.json")
        ]
        out = [
            r
            for r in out
            if flt.correlation_id in (None, r.correlation_id) and flt.status in (None, r.status)
        ]
        return sorted(out, key=lambda r: r.last_saved_at)

    def delete(self, invocation_id: str) -> bool:
        try:
            self._path(invocation_id).unlink()
        except FileNotFoundError:
            return False
        return True


@pytest.fixture(
    params=[
        "files",
        "memory",
        "sqlite",
        "sqlite-pickle",
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def graph_checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "files":
        yield JsonFileCheckpointer(tmp_path / "records")
    elif request.param == "memory":
        yield InMemoryCheckpointer()
    elif request.param == "sqlite":
        cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
        yield cp
        cp.close()
    elif request.param == "sqlite-pickle":
        cp = SQLiteCheckpointer(tmp_path / "p.sqlite", "pickle", pickle_key=b"k" * 16)
        yield cp
        cp.close()
    else:
        url: str = request.getfixturevalue("pg_url")
        store = Store(url=url)
        for key in store.keys(prefix="graph:"):
            store.delete(key)
        yield StoreCheckpointer(store)
        store.close()


class Counter(State):
    n: int = 0


def _graph(cp: Any) -> Any:
    return (
        GraphBuilder(Counter)
        .add_node("inc", lambda s: {"n": s.n + 1})
        .add_edge("inc", END)
        .set_entry("inc")
        .with_checkpointer(cp)
        .compile()
    )


def test_a_duck_typed_checkpointer_is_accepted_and_a_partial_one_refused(tmp_path: Path) -> None:
    # guarantee 600
    files = JsonFileCheckpointer(tmp_path / "r")

    class Duck:  # not a subclass: every method of the protocol, by delegation
        def __getattr__(self, name: str) -> Any:
            return getattr(files, name)

    assert _graph(Duck()).invoke(Counter()).n == 1
    assert files.list()[0].status == "done"

    class Partial:
        def save(self, record: CheckpointRecord) -> None: ...

        def load(self, invocation_id: str) -> CheckpointRecord: ...

    with pytest.raises(GraphCompileError, match="has no list, delete, asave, aload"):
        GraphBuilder(Counter).with_checkpointer(Partial())  # type: ignore[arg-type]
    with pytest.raises(GraphCompileError, match="Checkpointer"):
        GraphBuilder(Counter).with_checkpointer("checkpoints.sqlite")  # type: ignore[arg-type]


def test_a_checkpointer_whose_load_returns_none_is_told_the_rule(tmp_path: Path) -> None:
    # guarantee 598
    class ReturnsNone(JsonFileCheckpointer):
        def load(self, invocation_id: str) -> CheckpointRecord:
            return None  # type: ignore[return-value]

    with pytest.raises(CheckpointNotFound, match="raises CheckpointNotFound for a missing"):
        _graph(ReturnsNone(tmp_path / "r")).invoke(resume_invocation="nope")


def test_a_save_that_raises_is_checkpoint_save_failed(tmp_path: Path) -> None:
    # guarantee 593, 599
    class FullDisk(JsonFileCheckpointer):
        saves = 0

        def save(self, record: CheckpointRecord) -> None:
            self.saves += 1
            if self.saves == 2:  # the first node's save (the start record went through)
                raise OSError(28, "No space left on device")
            super().save(record)

    cp = FullDisk(tmp_path / "r")
    with pytest.raises(CheckpointSaveFailed, match="after node 'inc' could not be saved") as info:
        _graph(cp).invoke(Counter())
    assert isinstance(info.value.__cause__, OSError)
    (rec,) = cp.list()
    assert rec.status == "failed" and rec.completed_positions == ()
    assert _graph(cp).invoke(resume_invocation=rec.invocation_id).n == 1


def test_a_user_checkpointer_gets_json_records_it_can_reload_typed(tmp_path: Path) -> None:
    # guarantee 599
    cp = JsonFileCheckpointer(tmp_path / "r")
    graph = _graph(cp)
    graph.invoke(Counter(n=4), correlation_id="typed", metadata={"who": "me"})
    (rec,) = cp.list(CheckpointFilter(correlation_id="typed"))
    assert rec.state == {"n": 5} and rec.metadata == {"who": "me"} and rec.status == "done"
    assert graph.load_record(rec.invocation_id).state == Counter(n=5)
    assert json.loads(json.dumps(rec.to_json())) == rec.to_json()
    assert CheckpointRecord.from_json(rec.to_json()) == rec


def test_a_record_moved_between_checkpointers_resumes_there(tmp_path: Path) -> None:
    # guarantee 598: load from one checkpointer, save to another, resume in the second
    calls: list[str] = []

    def b(state: Counter) -> dict[str, int]:
        calls.append("b")
        if len(calls) == 1:
            raise RuntimeError("b failed once")
        return {"n": state.n * 10}

    def build(cp: Any) -> Any:
        return (
            GraphBuilder(Counter)
            .add_node("a", lambda s: {"n": s.n + 1})
            .add_node("b", b)
            .add_edge("a", "b")
            .add_edge("b", END)
            .set_entry("a")
            .with_checkpointer(cp)
            .compile()
        )

    files = JsonFileCheckpointer(tmp_path / "r")
    with pytest.raises(NodeException) as failed:
        build(files).invoke(Counter(n=1), correlation_id="moved")
    invocation = failed.value.invocation_id
    assert invocation is not None
    store_cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    store_cp.save(files.load(invocation))
    assert store_cp.load(invocation).status == "failed"
    assert build(store_cp).invoke(resume_invocation=invocation).n == 20
    assert calls == ["b", "b"]  # a ran once, before the move
    store_cp.close()
