"""Key/value entries: read, write, delete, keys and items, compare-and-swap, value
encoding, async twins."""

from __future__ import annotations

import asyncio
import re
import uuid
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisDeprecationWarning
from pydantic import BaseModel

from stepstone import Store
from stepstone.durable import claim_run
from stepstone.exceptions import StoreError, UnserializableValueWarning
from stepstone.testing.store_conformance._spec import StoreSpec


class _Point(BaseModel):
    x: int
    y: int


def test_read_write_delete_roundtrip(store_spec: StoreSpec) -> None:
    """guarantee 45: read/write/delete exist and round-trip JSON values."""
    store = store_spec.open()
    values: list[Any] = [1, 2.5, "text ünïcode", None, True, [1, "a", None], {"a": {"b": [1, 2]}}]
    # a lone surrogate (os.fsdecode of bytes that are not UTF-8), alone and beside other text
    values += ["b\udcffad", {"path": "ü/\udc80"}]
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


def test_a_key_with_a_nul_character_is_refused_before_anything_is_written(
    store_spec: StoreSpec,
) -> None:
    """guarantee 349: a key containing a NUL character or a lone surrogate is refused by
    every store with a ValueError naming it and what is wrong, for values, runs and
    ``writes=`` keys alike, and nothing is written."""
    from stepstone.durable import claim_run

    store = store_spec.open()
    cases = [
        ("k\0x", r"'k\\x00x' contains a NUL character"),
        ("k\udcffx", r"'k\\udcffx' contains a lone surrogate \('\\udcff' at index 1\)"),
    ]
    for n, (bad, refused) in enumerate(cases):
        for attempt in (
            lambda key: store.write(key, 1),
            store.read,
            store.delete,
            lambda key: store.compare_and_swap(key, None, 1),
            lambda key: claim_run(store, key, kind="test", resume=False, first_step="s0"),
        ):
            with pytest.raises(ValueError, match=refused):
                attempt(bad)
        run = claim_run(store, f"bad-key-run{n}", kind="test", resume=False, first_step="s0").run
        assert run is not None
        version = run.head.version
        with pytest.raises(ValueError, match="writes= key " + refused):
            run.commit_sync(status="running", next_step="s1", writes=[("ok", 1), (bad, 2)])
        head = store.backend.run_get(f"bad-key-run{n}")
        assert head is not None and head.version == version
        assert store.read("ok") is None
        run.release()
    assert store.keys() == ["bad-key-run0", "bad-key-run1"]


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
    """expected=None means absent; the comparison is JSON equality (1 == 1.0, key order
    does not matter)."""
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

    with warnings.catch_warnings():
        # Hypothesis warns when the global `random` state moves while it draws an example.
        # These strategies never touch it, but a backend's own threads may (psycopg_pool
        # draws a jitter from it for each connection it opens in the background).
        warnings.filterwarnings(
            "ignore", "Do not use the `random` module inside strategies",
            HypothesisDeprecationWarning,
        )  # fmt: skip
        check()


def test_pydantic_values_persist_as_model_dump(store_spec: StoreSpec) -> None:
    """guarantee 37: pydantic payloads persist via model_dump."""
    store = store_spec.open()
    store.write("p", _Point(x=1, y=2))
    assert store.read("p") == {"x": 1, "y": 2}
    assert store.compare_and_swap("p", _Point(x=1, y=2), _Point(x=3, y=4))
    assert store.read("p") == {"x": 3, "y": 4}


def test_unserializable_value_is_stringified_with_warning(store_spec: StoreSpec) -> None:
    """guarantee 36: values JSON cannot hold become str() with a warning naming the key path."""
    store = store_spec.open()
    obj = object()
    with pytest.warns(UnserializableValueWarning, match=r"store\['u'\]\['handle'\]"):
        store.write("u", {"handle": obj})
    assert store.read("u") == {"handle": str(obj)}


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


def test_a_closed_store_refuses_every_read_and_write(store_spec: StoreSpec) -> None:
    """guarantee 367: after close(), a store of any backend (memory too) refuses to be used,
    with a StoreError saying it is closed, instead of going on as if it were open."""
    store = store_spec.open()
    store.write("kept", {"v": 1})
    claimed = claim_run(store, "run-closed", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    claimed.run.release()
    store.close()
    assert store.closed
    store.close()  # idempotent
    closed = rf"store {re.escape(store.describe())} is closed"
    for use in (
        lambda: store.read("kept"),
        lambda: store.read_entry("kept"),
        lambda: store.write("kept", 2),
        lambda: store.write("new", 2),
        lambda: store.delete("kept"),
        lambda: store.keys(),
        lambda: store.items(),
        lambda: store.compare_and_swap("kept", {"v": 1}, 3),
        lambda: store.backend.run_get("run-closed"),
        lambda: store.backend.run_journal("run-closed"),
        lambda: store.backend.run_list(None),
        lambda: claim_run(store, "run-2", kind="test", resume=False, first_step="a"),
    ):
        with pytest.raises(StoreError, match=closed):
            use()
    with pytest.raises(StoreError, match=closed):
        asyncio.run(store.aread("kept"))


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


def test_in_and_iteration_see_values_and_checkpoints(store_spec: StoreSpec) -> None:
    """guarantee 594: ``key in store`` says whether a key holds a value or a checkpoint,
    ``for key in store`` walks the sorted keys as ``keys()`` lists them when it starts."""
    store = store_spec.open()
    store.write("b", 1)
    store.write("a", {"x": 1})
    run = claim_run(store, "run:1", kind="test", resume=False, first_step="s0").run
    assert run is not None
    assert "a" in store and "b" in store and "run:1" in store
    assert "c" not in store
    for not_a_key in ("", "k\0x", 5, None, ("a",)):
        assert not_a_key not in store  # never an error: no store can hold it
    assert list(store) == ["a", "b", "run:1"] == store.keys()
    for key in store:  # deleting while walking: the walk is over a snapshot
        if key != "run:1":
            store.delete(key)
    assert list(store) == ["run:1"]
    assert asyncio.run(store.acontains("run:1")) is True
    assert asyncio.run(store.acontains("a")) is False
    run.release()
