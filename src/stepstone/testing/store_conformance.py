"""The store conformance suite: every backend must pass these tests unchanged.

Use it from a test module of your own with a ``store_spec`` fixture::

    import pytest
    from stepstone.testing.store_conformance import *  # noqa: F403
    from stepstone.testing.store_conformance import StoreSpec

    @pytest.fixture
    def store_spec(tmp_path):
        return StoreSpec(name="sqlite", args={"db": str(tmp_path / "s.sqlite")})

``StoreSpec.args`` are the keyword arguments of ``Store(...)``; ``multiprocess`` says whether
several OS processes can share the store (not for the in-memory backend).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from stepstone.durable import claim_run
from stepstone.exceptions import (
    ConcurrentPlanRunError,
    StoreError,
    StoreKeyConflictError,
    UnserializableValueWarning,
)
from stepstone.store import Store

__all__ = [
    "StoreSpec",
    "test_async_twins",
    "test_cas_absent_and_json_equality",
    "test_cas_matches_a_dict_model",
    "test_cas_race_across_processes",
    "test_claim_live_run_refused_across_store_objects",
    "test_commit_is_atomic_and_versioned",
    "test_commit_writes_same_key_twice_last_wins",
    "test_context_manager_closes",
    "test_delete_removes_run_and_journal",
    "test_items_are_pairs_with_checkpoints",
    "test_keys_items_prefix_is_exact",
    "test_read_only_open_reads_and_refuses_writes",
    "test_lease_renew_and_expiry_takeover",
    "test_pydantic_values_persist_as_model_dump",
    "test_read_write_delete_roundtrip",
    "test_run_key_refuses_plain_value_ops",
    "test_unserializable_value_is_stringified_with_warning",
]


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """How to open the store under test: ``Store(**args)``; ``multiprocess`` if shareable."""

    name: str
    args: dict[str, Any]
    multiprocess: bool = True
    shared: Store | None = None

    def open(self) -> Store:
        """A Store on the backend under test (the same data each time, when shareable)."""
        if self.shared is not None:
            return self.shared
        return Store(**self.args)


class _Point(BaseModel):
    x: int
    y: int


def test_read_write_delete_roundtrip(store_spec: StoreSpec) -> None:
    """spec 45: read/write/delete exist and round-trip JSON values."""
    store = store_spec.open()
    values: list[Any] = [1, 2.5, "text ünïcode", None, True, [1, "a", None], {"a": {"b": [1, 2]}}]
    for i, value in enumerate(values):
        store.write(f"k{i}", value)
    for i, value in enumerate(values):
        assert store.read(f"k{i}") == value
    assert store.read("missing") is None
    assert store.read("missing", default="d") == "d"
    assert store.delete("k0") is True
    assert store.delete("k0") is False
    assert store.read("k0") is None
    entry = store.read_entry("k1")
    assert entry is not None and entry.kind == "value" and entry.value == 2.5


def test_keys_items_prefix_is_exact(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    for key in ("a_1", "a%2", "ab", "A_3", "b"):
        store.write(key, key)
    assert store.keys() == sorted(["a_1", "a%2", "ab", "A_3", "b"])
    assert store.keys(prefix="a_") == ["a_1"]  # '_' is not a wildcard
    assert store.keys(prefix="a%") == ["a%2"]
    assert store.keys(prefix="A") == ["A_3"]  # case-sensitive
    assert store.items(prefix="a") == [("a%2", "a%2"), ("a_1", "a_1"), ("ab", "ab")]
    top = "\U0010ffff"
    for key in (f"z{top}", f"z{top}x", f"z{top}{top}", "zz"):
        store.write(key, key)
    assert store.keys(prefix=f"z{top}") == [f"z{top}", f"z{top}x", f"z{top}{top}"]
    assert store.keys(prefix="z") == ["zz", f"z{top}", f"z{top}x", f"z{top}{top}"]


def test_cas_absent_and_json_equality(store_spec: StoreSpec) -> None:
    """Seed semantics: expected=None means absent; comparison is JSON equality."""
    store = store_spec.open()
    assert store.compare_and_swap("c", None, {"n": 1}) is True
    assert store.compare_and_swap("c", None, {"n": 2}) is False
    assert store.compare_and_swap("c", {"n": 2}, {"n": 3}) is False
    assert store.compare_and_swap("c", {"n": 1.0}, {"n": 2}) is True  # 1 == 1.0 in JSON
    assert store.read("c") == {"n": 2}
    store.write("d", {"a": 1, "b": 2})
    assert store.compare_and_swap("d", {"b": 2, "a": 1}, "swapped") is True  # key order
    assert store.read("d") == "swapped"


_VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from(["a", "b"]),
    st.lists(st.integers(0, 2), max_size=2),
)
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "cas", "delete"]), st.sampled_from(["k1", "k2"]), _VALUES, _VALUES
    ),
    max_size=12,
)


def test_cas_matches_a_dict_model(store_spec: StoreSpec) -> None:
    """Hypothesis: any sequence of write / compare_and_swap / delete agrees with a dict."""
    store = store_spec.open()

    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(_OPS)
    def check(ops: list[tuple[str, str, Any, Any]]) -> None:
        prefix = f"cas-model-{uuid.uuid4().hex}:"
        model: dict[str, Any] = {}
        for op, key, a, b in ops:
            k = prefix + key
            if op == "write":
                if a is None:
                    continue  # None is "absent" for CAS; a stored null is tested elsewhere
                store.write(k, a)
                model[k] = a
            elif op == "delete":
                assert store.delete(k) == (k in model)
                model.pop(k, None)
            else:
                if b is None:
                    continue
                expected_ok = (k not in model) if a is None else model.get(k) == a
                assert store.compare_and_swap(k, a, b) == expected_ok
                if expected_ok:
                    model[k] = b
        assert store.items(prefix=prefix) == sorted(model.items())

    check()


def test_pydantic_values_persist_as_model_dump(store_spec: StoreSpec) -> None:
    """spec 37: pydantic payloads persist via model_dump."""
    store = store_spec.open()
    store.write("p", _Point(x=1, y=2))
    assert store.read("p") == {"x": 1, "y": 2}
    assert store.compare_and_swap("p", _Point(x=1, y=2), _Point(x=3, y=4))
    assert store.read("p") == {"x": 3, "y": 4}


def test_unserializable_value_is_stringified_with_warning(store_spec: StoreSpec) -> None:
    """spec 36: values JSON cannot hold become str() with a warning naming the key path."""
    store = store_spec.open()
    obj = object()
    with pytest.warns(UnserializableValueWarning, match=r"store\['u'\]\['handle'\]"):
        store.write("u", {"handle": obj})
    assert store.read("u") == {"handle": str(obj)}


def test_items_are_pairs_with_checkpoints(store_spec: StoreSpec) -> None:
    """items() yields (key, value) pairs of everything read() reads, checkpoints included."""
    # guarantee 152
    store = store_spec.open()
    store.write("fan:1", {"n": 1})
    store.write("fan:3", {"n": 3})
    store.write("other", 0)
    claimed = claim_run(store, "fan:2", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    try:
        pairs = store.items(prefix="fan:")
        assert [k for k, _ in pairs] == ["fan:1", "fan:2", "fan:3"]
        by_key = dict(pairs)
        assert by_key["fan:2"] == store.read("fan:2")
        assert by_key["fan:2"]["next_step"] == "a"
        assert store.items(prefix="fan:", kind="value") == [
            ("fan:1", {"n": 1}),
            ("fan:3", {"n": 3}),
        ]
        assert [k for k, _ in store.items(prefix="fan:", kind="checkpoint")] == ["fan:2"]
        assert [k for k, _ in store.items()] == store.keys()
        with pytest.raises(ValueError, match="kind must be"):
            store.items(kind="values")  # type: ignore[arg-type]
    finally:
        claimed.run.release()


def test_read_only_open_reads_and_refuses_writes(store_spec: StoreSpec) -> None:
    """A read-only Store reads everything and never writes."""
    # guarantee 142
    if not store_spec.multiprocess:
        pytest.skip("an in-memory store has nothing to open read-only")
    store = store_spec.open()
    store.write("ro", {"v": 1})
    with Store(**store_spec.args, read_only=True) as ro:
        assert ro.read("ro") == {"v": 1}
        assert ro.keys() == store.keys()
        with pytest.raises(StoreError, match="read-only"):
            ro.write("ro", 2)
        with pytest.raises(StoreError, match="read-only"):
            ro.delete("ro")
    assert store.read("ro") == {"v": 1}


def test_async_twins(store_spec: StoreSpec) -> None:
    store = store_spec.open()

    async def go() -> None:
        await store.awrite("x", [1, 2])
        assert await store.aread("x") == [1, 2]
        assert await store.acompare_and_swap("x", [1, 2], [3])
        assert await store.akeys(prefix="x") == ["x"]
        assert await store.aitems(prefix="x") == [("x", [3])]
        assert await store.aitems(prefix="x", kind="checkpoint") == []
        entry = await store.aread_entry("x")
        assert entry is not None and entry.value == [3]
        assert await store.adelete("x") is True

    asyncio.run(go())


def test_context_manager_closes(store_spec: StoreSpec) -> None:
    if store_spec.shared is not None:
        pytest.skip("shared in-memory store stays open")
    with store_spec.open() as store:
        store.write("cm", 1)
    with store_spec.open() as again:
        assert again.read("cm") == 1


def test_run_key_refuses_plain_value_ops(store_spec: StoreSpec) -> None:
    """A key holding a checkpoint is never overwritten by a plain write or CAS."""
    store = store_spec.open()
    claimed = claim_run(store, "run-k", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    try:
        with pytest.raises(StoreKeyConflictError, match="run-k"):
            store.write("run-k", 1)
        with pytest.raises(StoreKeyConflictError, match="run-k"):
            store.compare_and_swap("run-k", None, 1)
        entry = store.read_entry("run-k")
        assert entry is not None and entry.kind == "checkpoint"
        # And a plain value is never claimed as a run.
        store.write("plain", {"not": "a checkpoint"})
        with pytest.raises(StoreKeyConflictError, match="plain"):
            claim_run(store, "plain", kind="test", resume=True, first_step="a")
        assert store.read("plain") == {"not": "a checkpoint"}
    finally:
        claimed.run.release()


def test_commit_is_atomic_and_versioned(store_spec: StoreSpec) -> None:
    """spec 39/40: head, journal and writes commit together; a stale version writes nothing."""
    store = store_spec.open()
    claimed = claim_run(store, "run-c", kind="test", resume=False, first_step="a")
    run = claimed.run
    assert run is not None
    try:
        run.commit_sync(
            status="running", next_step="b", rows=[("step", "a", {"i": 1})], writes=[("w1", [1])]
        )
        assert store.read("w1") == [1]
        head = store.backend.run_get("run-c")
        assert head is not None and head.version == 2 and head.next_step == "b"
        stale = head.replace(version=5, next_step="zzz")
        assert store.backend.run_commit(stale, 1, [], [("w2", "2")]) is False
        assert store.read("w2") is None
        # A write that collides with a run key rolls the whole commit back.
        other = claim_run(store, "run-other", kind="test", resume=False, first_step="a")
        assert other.run is not None
        other.run.release()
        with pytest.raises(StoreKeyConflictError):
            run.commit_sync(
                status="running",
                next_step="c",
                rows=[("step", "b", {"i": 2})],
                writes=[("w3", 3), ("run-other", 4)],
            )
        assert store.read("w3") is None
        after = store.backend.run_get("run-c")
        assert after is not None and after.version == 2 and after.next_step == "b"
        rows = store.backend.run_journal("run-c")
        assert [(r.seq, r.kind, r.name) for r in rows] == [(0, "step", "a")]
    finally:
        run.release()


def test_commit_writes_same_key_twice_last_wins(store_spec: StoreSpec) -> None:
    """A commit that writes one key twice stores the last value (as sequential writes
    would); a backend that upserts all writes in one statement must not choke on it."""
    store = store_spec.open()
    claimed = claim_run(store, "run-w", kind="test", resume=False, first_step="a")
    run = claimed.run
    assert run is not None
    try:
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("step", "a", {})],
            writes=[("dup", 1), ("other", "o"), ("dup", 2)],
        )
    finally:
        run.release()
    assert store.read("dup") == 2
    assert store.read("other") == "o"


def test_delete_removes_run_and_journal(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    claimed = claim_run(store, "run-d", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    claimed.run.commit_sync(status="done", next_step=None, rows=[("step", "a", {})])
    claimed.run.release()
    assert "run-d" in store.keys()
    assert store.delete("run-d") is True
    assert store.read("run-d") is None
    assert store.backend.run_journal("run-d") == []
    assert "run-d" not in store.keys()


def test_claim_live_run_refused_across_store_objects(store_spec: StoreSpec) -> None:
    """spec 27/30: a live owner is never displaced, even by another Store object."""
    first = store_spec.open()
    second = store_spec.open() if store_spec.multiprocess else first
    claimed = claim_run(first, "run-l", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    try:
        for resume in (False, True):
            with pytest.raises(ConcurrentPlanRunError, match="run-l"):
                claim_run(second, "run-l", kind="test", resume=resume, first_step="a")
    finally:
        claimed.run.release()
    # Released and still "claimed": its owner is this process but no longer runs it.
    again = claim_run(second, "run-l", kind="test", resume=True, first_step="a")
    assert again.outcome == "resumed" and again.run is not None
    again.run.release()


def test_lease_renew_and_expiry_takeover(store_spec: StoreSpec) -> None:
    """Another host may take a run over once its lease expired, never before."""
    store = store_spec.open()
    claimed = claim_run(store, "run-e", kind="test", resume=False, first_step="a")
    run = claimed.run
    assert run is not None
    run.release()  # stop the keeper, then pretend the owner is on another host
    head = run.head
    far = head.replace(host="elsewhere", lease_until=time.time() + 60)
    assert store.backend.run_transact("run-e", lambda h, kv: _reclaim(far)) is not None
    with pytest.raises(ConcurrentPlanRunError):
        claim_run(store, "run-e", kind="test", resume=True, first_step="a")
    assert store.backend.run_renew("run-e", head.run_uid, time.time() - 1)
    assert not store.backend.run_renew("run-e", "not-the-owner", time.time() + 60)
    taken = claim_run(store, "run-e", kind="test", resume=True, first_step="a")
    assert taken.outcome == "resumed" and taken.run is not None
    assert taken.head.run_uid != head.run_uid
    taken.run.release()


def _reclaim(head: Any) -> Any:
    from stepstone.store import Claim

    return Claim(head=head)


_CAS_WORKER = textwrap.dedent(
    """
    import json, sys
    from stepstone.store import Store
    args, n = json.loads(sys.argv[1]), int(sys.argv[2])
    store = Store(**args)
    done = 0
    while done < n:
        current = store.read("counter")
        if store.compare_and_swap("counter", current, current + 1):
            done += 1
    store.close()
    """
)


def test_cas_race_across_processes(store_spec: StoreSpec) -> None:
    """Several OS processes increment one counter by CAS: no update is lost."""
    if not store_spec.multiprocess:
        pytest.skip(f"{store_spec.name} store is process-local")
    store = store_spec.open()
    store.write("counter", 0)
    procs, per = 4, 25
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _CAS_WORKER, json.dumps(store_spec.args), str(per)],
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        for _ in range(procs)
    ]
    for w in workers:
        assert w.wait(timeout=120) == 0
    assert store.read("counter") == procs * per
