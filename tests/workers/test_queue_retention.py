"""Queue entry retention: ``prune_queue`` deletes finished entries past their age and frees
their dedupe keys; queued and running entries and the runs' checkpoints stay."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from stepstone import QueuedRunError, Store, UserError, Worker, prune_queue, submit
from tests.workers import targets
from tests.workers.targets import task

T = "tests.workers.targets:"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "q.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()
        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def test_finished_entries_past_their_age_are_deleted_and_the_rest_stay(
    store: Store, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    done = targets.plan.submit(task(log, "done"), store=store, queue="a", dedupe_key="d1")
    failed = submit(store, targets.failing_plan, task(log, "failed"), queue="a")
    cancelled = targets.plan.submit(task(log, "cancelled"), store=store, queue="a")
    assert cancelled.cancel()
    other = targets.plan.submit(task(log, "other"), store=store, queue="b")
    assert Worker(store, queues=["a", "b"], poll_interval=0.05).run(until_idle=True) == 3
    waiting = targets.plan.submit(task(log, "waiting"), store=store, queue="a")
    assert [h.status() for h in (done, failed, other, waiting)] == [
        "done",
        "failed",
        "done",
        "queued",
    ]
    done_key = done.key
    # nothing is old enough yet
    assert prune_queue(store, timedelta(hours=1)) == 0
    time.sleep(0.3)
    # one queue only: queue "b" keeps its finished entry
    assert prune_queue(store, 0.2, queue="a") == 3  # guarantee 246
    for gone in (done, failed, cancelled):
        with pytest.raises(QueuedRunError, match=gone.id):
            gone.status()
    assert other.status() == "done" and waiting.status() == "queued"  # guarantee 246
    # the run's checkpoint is not the queue's to delete
    assert store.read_entry(done_key).value["status"] == "done"
    assert prune_queue(store, 0.0) == 1  # queue "b"'s entry; the queued one stays
    assert waiting.status() == "queued"


def test_a_pruned_dedupe_key_queues_a_new_run(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    first = targets.plan.submit(task(log, "first"), store=store, dedupe_key="nightly")
    assert targets.plan.submit(task(log, "again"), store=store, dedupe_key="nightly") == first
    Worker(store, poll_interval=0.05).run(until_idle=True)
    assert first.result(timeout=5).ok
    time.sleep(0.1)
    assert prune_queue(store, timedelta(seconds=0.05)) == 1
    second = targets.plan.submit(task(log, "second"), store=store, dedupe_key="nightly")
    assert second != first and second.status() == "queued"  # guarantee 247
    Worker(store, poll_interval=0.05).run(until_idle=True)
    assert second.result(timeout=5).payload["name"] == "second"


def test_prune_queue_arguments_are_checked(store: Store) -> None:
    for bad in (-1, "7d", True, float("nan")):
        with pytest.raises(UserError, match="older_than"):
            prune_queue(store, bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="queue"):
        prune_queue(store, 1.0, queue="")
    assert prune_queue(store, 0, queue=T) == 0
