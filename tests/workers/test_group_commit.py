"""Group commit on SQLite and PostgreSQL: concurrent runs' step commits share a
transaction, and each run's compare-and-swap is still its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

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
        assert store.backend.run_journal("good") == [JournalRow(0, "step", "a", "1")]
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
