"""Run records: kept apart from plain values, one atomic versioned commit per step,
deleted with their journal."""

from __future__ import annotations

import asyncio

import pytest

from stepstone.durable import ClaimResult, aclaim_empty, aclaim_run, claim_empty, claim_run
from stepstone.exceptions import StoreKeyConflictError
from stepstone.store._base import JournalRow, read_salvaged
from stepstone.testing.store_conformance._spec import StoreSpec


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


def test_claim_empty_claims_only_a_key_holding_nothing(store_spec: StoreSpec) -> None:
    """guarantee 360: ``claim_empty`` starts a fresh run under a key that holds nothing;
    under a key holding a run (live, released or done) or a plain value it writes nothing
    and returns None."""
    store = store_spec.open()
    fresh = claim_empty(store, "empty-1", kind="test", resume=True, first_step="a")
    assert fresh is not None and fresh.outcome == "fresh" and fresh.run is not None
    assert fresh.previous is None
    head = store.backend.run_get("empty-1")
    assert head is not None and head.run_uid == fresh.head.run_uid and head.next_step == "a"
    assert claim_empty(store, "empty-1", kind="test", resume=True, first_step="a") is None
    fresh.run.commit_sync(status="done", next_step=None, rows=[("step", "a", 1)])
    fresh.run.release()
    done = store.backend.run_get("empty-1")
    assert claim_empty(store, "empty-1", kind="test", resume=True, first_step="a") is None
    assert store.backend.run_get("empty-1") == done
    store.write("plain-1", {"v": 1})
    assert claim_empty(store, "plain-1", kind="test", resume=True, first_step="a") is None
    assert store.read("plain-1") == {"v": 1} and store.backend.run_get("plain-1") is None

    async def both() -> list[ClaimResult | None]:
        # concurrent tasks: on SQLite the claims join the loop's group commit
        return list(
            await asyncio.gather(
                aclaim_empty(store, "empty-2", kind="test", resume=True, first_step="a"),
                aclaim_empty(store, "empty-1", kind="test", resume=True, first_step="a"),
            )
        )

    empty, taken = asyncio.run(both())
    assert taken is None and store.backend.run_get("empty-1") == done
    assert empty is not None and empty.run is not None
    empty.run.release()


def test_claim_writes_a_fresh_runs_first_rows_with_it(store_spec: StoreSpec) -> None:
    """``claim_run(first_rows=...)`` journals a fresh run's first rows in the claim's own
    transaction (the head counts them, later commits follow them), also through the
    loop's group commit; a run started over gets the new ones only, and a run taken over
    gets none."""
    store = store_spec.open()
    start = [("start", None, {"frames": [1]}), ("note", "n", "x")]
    claimed = claim_run(
        store, "first-1", kind="test", resume=False, first_step="a", first_rows=start
    )
    assert claimed.outcome == "fresh" and claimed.run is not None
    head = store.backend.run_get("first-1")
    assert head is not None and head.journal_len == 2 and head.status == "claimed"
    rows = store.backend.run_journal("first-1")
    assert [(r.seq, r.kind, r.name, r.data) for r in rows] == [
        (0, "start", None, '{"frames":[1]}'),
        (1, "note", "n", '"x"'),
    ]
    claimed.run.commit_sync(status="failed", next_step="a", rows=[("step", "a", 1)])
    claimed.run.release()
    assert [r.seq for r in store.backend.run_journal("first-1")] == [0, 1, 2]
    taken = claim_run(store, "first-1", kind="test", resume=True, first_step="a", first_rows=start)
    assert taken.outcome == "resumed" and taken.run is not None
    assert [r.seq for r in store.backend.run_journal("first-1")] == [0, 1, 2]
    taken.run.release()

    async def concurrently() -> list[ClaimResult]:
        # concurrent tasks: on SQLite the claims join the loop's group commit
        return list(
            await asyncio.gather(
                *(
                    aclaim_run(
                        store,
                        key,
                        kind="test",
                        resume=False,
                        first_step="a",
                        first_rows=[("start", None, key)],
                    )
                    for key in ("first-1", "first-2")
                )
            )
        )

    for claim in asyncio.run(concurrently()):
        assert claim.outcome == "fresh" and claim.run is not None
        claim.run.release()
        head = store.backend.run_get(claim.head.key)
        assert head is not None and head.journal_len == 1
        rows = store.backend.run_journal(claim.head.key)
        assert [(r.seq, r.kind, r.data) for r in rows] == [(0, "start", f'"{claim.head.key}"')]


def test_commit_is_atomic_and_versioned(store_spec: StoreSpec) -> None:
    """guarantee 39/40: head, journal and writes commit together; a stale version writes nothing."""
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


def test_journal_rows_read_one_by_one(store_spec: StoreSpec) -> None:
    """guarantee 354: a journal row reads alone, as the whole journal reads it (an
    operator's read of a damaged run goes row by row); a sound run salvages whole."""
    store = store_spec.open()
    claimed = claim_run(store, "run-j", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    for i in range(3):
        claimed.run.commit_sync(status="running", next_step="n", rows=[("step", f"s{i}", [i])])
    claimed.run.release()
    rows = store.backend.run_journal("run-j")
    assert [store.backend.run_journal_row("run-j", i) for i in range(3)] == rows
    assert store.backend.run_journal_row("run-j", 3) is None
    assert store.backend.run_journal_row("no-such-run", 0) is None
    found = read_salvaged(store.backend, "run-j")
    assert found is not None and found.rows == rows and found.damaged == {}
    assert read_salvaged(store.backend, "no-such-run") is None


def test_journal_rows_carry_when_their_work_started_and_committed(
    store_spec: StoreSpec,
) -> None:
    """guarantee 420: every journal row reads back with when its work started and when its
    commit was made, on the database's clock: a step commit's rows start when the run last
    committed (or was claimed) unless the engine says when, and commit at the new head's
    time, through the group commit too; a claim's first rows carry the claim's time; a
    row committed with no start keeps None."""
    store = store_spec.open()
    before = store.backend.clock()
    claimed = claim_run(
        store, "run-t", kind="test", resume=False, first_step="a", first_rows=[("start", None, 1)]
    )
    run = claimed.run
    assert run is not None
    try:
        (start,) = store.backend.run_journal("run-t")
        assert start.committed_at == run.head.updated_at and start.started_at is not None
        assert before <= start.started_at <= start.committed_at
        claimed_at = run.head.updated_at
        run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)])
        first = run.head.updated_at
        began = run.clock()
        run.commit_sync(
            status="running", next_step="c", rows=[("step", "b", 2), ("x", "b", 3)], started=began
        )

        async def grouped() -> None:  # on SQLite, the loop's group commit
            await asyncio.gather(
                run.commit(status="running", next_step="d", rows=[("step", "c", 4)])
            )

        asyncio.run(grouped())
        rows = store.backend.run_journal("run-t")
        assert [(r.seq, r.started_at, r.committed_at) for r in rows[1:3]] == [
            (1, claimed_at, first),
            (2, began, rows[2].committed_at),
        ]
        assert rows[3].started_at == began and rows[3].committed_at == rows[2].committed_at
        assert rows[4].started_at == rows[3].committed_at
        assert rows[4].committed_at == run.head.updated_at >= (rows[4].started_at or 0.0)
        assert [store.backend.run_journal_row("run-t", i) for i in range(5)] == rows
        head = run.head.replace(version=run.head.version + 1, journal_len=6)
        bare = JournalRow(5, "step", "raw", "5")  # a backend's caller may give no times
        assert store.backend.run_commit(head, run.head.version, [bare], [])
        row = store.backend.run_journal_row("run-t", 5)
        assert row is not None and row.started_at is None and row.committed_at == head.updated_at
    finally:
        run.release()


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
