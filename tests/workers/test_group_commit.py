"""Group commit on SQLite and PostgreSQL: concurrent runs' step commits share a
transaction, and each run's compare-and-swap is still its own."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from stepstone import Plan, Step, Store
from stepstone.durable import claim_run
from stepstone.durable._group import commit_many
from stepstone.exceptions import StoreKeyConflictError
from stepstone.store import JournalRow


def _claim(store: Store, key: str):  # type: ignore[no-untyped-def]
    claimed = claim_run(store, key, kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    return claimed.run


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "g.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def test_a_failed_run_in_a_batch_never_loses_or_lands_another_runs_rows(store: Store) -> None:
    good, stale, clash = (_claim(store, k) for k in ("good", "stale", "clash"))
    try:
        _claim(store, "a-run-key").release()  # a key that holds a run
        items = []
        for run, writes in (
            (good, [("good-value", '"g"')]),
            (stale, [("stale-value", '"s"')]),
            (clash, [("a-run-key", '"x"')]),
        ):
            new, rows, encoded = run._prepare("running", "b", None, None, [("step", "a", 1)], [])
            items.append((new, run.head.version, rows, writes or encoded))
        # the stale run's expected version is behind what is stored
        new, _, rows, writes = items[1]
        items[1] = (new, stale.head.version - 1, rows, writes)
        outcomes = commit_many(store.backend, items)
        assert outcomes[0] is True and outcomes[1] is False  # guarantee 244
        assert isinstance(outcomes[2], StoreKeyConflictError)
        assert store.backend.run_get("good").version == good.head.version + 1  # type: ignore[union-attr]
        assert _rows(store, "good") == [(0, "step", "a", "1")]
        assert store.read("good-value") == "g"
        # nothing of the failed runs landed
        assert store.backend.run_journal("stale") == [] and store.read("stale-value") is None
        assert store.backend.run_journal("clash") == []
        assert store.backend.run_get("clash").version == clash.head.version  # type: ignore[union-attr]
    finally:
        for run in (good, stale, clash):
            run.release()


def _double(x: int) -> int:
    return x * 2


def test_concurrent_runs_share_commits_and_every_result_is_right(store: Store) -> None:
    plan = Plan(
        *[Step(_double, name=f"s{i}") for i in range(5)],
        store=store,
        checkpoint_key="fan",
        on_concurrent="fork",
    )
    from stepstone import Envelope

    envs = asyncio.run(
        plan.arun_many([Envelope(task="t", payload=i) for i in range(40)], concurrency=8)
    )
    assert [e.payload for e in envs] == [i * 32 for i in range(40)]  # guarantee 244
    heads = store.backend.run_list("fan:")
    assert len(heads) == 40 and {h.status for h in heads} == {"done"}
    for head in heads:
        steps = [r.name for r in store.backend.run_journal(head.key) if r.kind == "step"]
        assert steps == [f"s{i}" for i in range(5)]
    store.close()


@pytest.mark.parametrize("n", [1, 3])
def test_commit_many_outside_sqlite_commits_one_by_one(n: int) -> None:
    store = Store()
    runs = [_claim(store, f"m{i}") for i in range(n)]
    items = []
    for run in runs:
        new, rows, encoded = run._prepare("running", "b", None, None, [("step", "a", 1)], [])
        items.append((new, run.head.version, rows, encoded))
    assert commit_many(store.backend, items) == [True] * n
    for run in runs:
        run.release()


def _step_item(run, version=None, seq_rows=None, writes=()):  # type: ignore[no-untyped-def]
    new, rows, _ = run._prepare("running", "b", None, None, [("step", "a", 1)], [])
    expected = run.head.version if version is None else version
    return (new, expected, seq_rows if seq_rows is not None else rows, list(writes))


def test_sqlite_batches_take_claims_too_and_check_items_in_order(tmp_path: Path) -> None:
    # guarantee 255
    from stepstone.durable._kernel import _claimer

    with Store(db=tmp_path / "c.sqlite") as store:
        store.write("plain", 1)  # a key that holds a plain value: its claim is refused
        run = _claim(store, "r")
        first = _step_item(run)
        twice = (first[0].replace(version=first[0].version + 1), first[0].version, [], [])
        decide_new, finish_new = _claimer(store, "new", kind="test", resume=False, first_step="a")
        decide_bad, _ = _claimer(store, "plain", kind="test", resume=False, first_step="a")
        stale_twin = _step_item(run)  # the same commit again: its version is taken by then
        out = commit_many(
            store.backend,
            [first, ("new", decide_new), ("plain", decide_bad), twice, stale_twin],
        )
        assert out[0] is True and out[3] is True and out[4] is False
        assert isinstance(out[2], StoreKeyConflictError)
        new_run = finish_new(out[1]).run
        assert new_run is not None and store.backend.run_get("new") == new_run.head
        assert store.read("plain") == 1
        assert store.backend.run_get("r").version == run.head.version + 2  # type: ignore[union-attr]
        assert _rows(store, "r") == [(0, "step", "a", "1")]
        run.release()
        new_run.release()


def test_a_statement_failing_in_a_sqlite_batch_retries_each_run_on_its_own(
    tmp_path: Path,
) -> None:
    # guarantee 255
    with Store(db=tmp_path / "f.sqlite") as store:
        ok, bad = _claim(store, "ok"), _claim(store, "bad")
        bad.commit_sync(status="running", next_step="b", rows=[("step", "a", 0)])
        # a journal row whose seq is taken: its INSERT fails and rolls the batch back
        clash = _step_item(bad, seq_rows=[JournalRow(0, "step", "a", "9")])
        out = commit_many(store.backend, [_step_item(ok, writes=[("v", '"ok"')]), clash])
        assert out[0] is True and isinstance(out[1], sqlite3.IntegrityError)
        assert _rows(store, "ok") == [(0, "step", "a", "1")]
        assert store.read("v") == "ok"
        assert _rows(store, "bad") == [(0, "step", "a", "0")]
        assert store.backend.run_get("bad").version == bad.head.version  # type: ignore[union-attr]
        ok.release()
        bad.release()


def test_a_release_lands_after_the_commits_its_loop_still_has_pending(tmp_path: Path) -> None:
    # guarantee 256
    from stepstone.durable import aclaim_run

    with Store(db=tmp_path / "d.sqlite") as store:

        async def main() -> None:
            claimed = await aclaim_run(store, "d", kind="test", resume=False, first_step="a")
            run = claimed.run
            assert run is not None
            commit = asyncio.ensure_future(
                run.commit(status="running", next_step="b", rows=[("step", "a", 1)])
            )
            await asyncio.sleep(0)  # the commit has joined the group, not been written
            run.release()
            head = store.backend.run_get("d")
            assert head is not None and head.version == claimed.head.version + 1
            assert head.lease_until == 0.0  # released after the commit, not before it
            await commit

        asyncio.run(main())


def _note(payload: dict[str, Any]) -> dict[str, Any]:
    _ORDER.append(payload["run"])
    return payload


_ORDER: list[int] = []


def test_runs_let_in_one_by_one_keep_sharing_commits_with_quick_steps(tmp_path: Path) -> None:
    """guarantee 626: steps quick enough to run on the loop's thread, and a lone run's
    commits written at once, never let one run hold its loop: the runs that
    ``arun_many``'s semaphore lets in as the first ones end run side by side with it."""
    from stepstone import Envelope

    _ORDER.clear()
    runs, steps = 32, 6
    with Store(db=tmp_path / "q.sqlite", durability="normal") as store:
        plan = Plan(
            *[Step(_note, name=f"s{i}") for i in range(steps)],
            store=store,
            checkpoint_key="quick",
            on_concurrent="fork",
        )
        envs = asyncio.run(
            plan.arun_many(
                [Envelope(task="t", payload={"run": i}) for i in range(runs)], concurrency=8
            )
        )
        assert [e.payload for e in envs] == [{"run": i} for i in range(runs)]
    late = [r for r in _ORDER if r >= 16]  # runs let in once others had ended
    assert sorted(late) == sorted(r for r in range(16, runs) for _ in range(steps))
    switches = sum(a != b for a, b in pairwise(late))
    # One run at a time switches 15 times; runs side by side switch at almost every step.
    assert switches >= 3 * (runs - 16), switches


def _rows(store: Store, key: str) -> list[tuple[int, str, str | None, str]]:
    """The journal of ``key`` as (seq, kind, name, data): what each row holds, its times
    aside (they are the commits')."""
    return [(r.seq, r.kind, r.name, r.data) for r in store.backend.run_journal(key)]
