"""Queue entries an older stepstone left behind: a run whose cancel was acknowledged, handed
back to its queue without its cancel looked at, never runs again (guarantee 223).

``tests/store/fixtures/queue_cancel_handed_back.sqlite`` is frozen: it was written by the
stepstone of commit 0d047ea (before guarantee 298), whose hand-back put a run back in its
queue whatever its cancel request said. In it, queue ``orders`` holds one entry: its run
(``tests.workers.targets:long_plan``, key ``orders/legacy``, task log ``"log"``, a path
relative to the worker's folder) committed steps ``s00`` to ``s03``; then
``handle.cancel()`` returned True (the run was running, so only ``cancel_requested`` was
set) and the worker's graceful shutdown handed it back before its lease renewal saw the
cancel. The entry is ``queued`` with ``cancel_requested`` set; its checkpoint ``failed``
at ``s04``. A worker of that version made it this way (one in-process ``Worker`` with
``shutdown_timeout=0``: the cancel, then ``stop()``), and the file was switched to
SQLite's rollback journal so that opening it leaves no ``-wal`` file beside it.

On PostgreSQL the same entry is loaded, row for row, from that file into the queue table
(its columns are the same), as the older stepstone's hand-back left it there too.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stepstone import QueuedRunError, RunHandle, Store, Worker, set_queue_limits, submit
from stepstone.durable._queue import queue_backend
from stepstone.store._queue_base import CANCELLED_RUNNING, ENTRY_COLUMNS
from tests.workers.targets import executions, task

FIXTURE = Path(__file__).parents[1] / "store" / "fixtures" / "queue_cancel_handed_back.sqlite"
T = "tests.workers.targets:"
KEY = "orders/legacy"


def _frozen_rows() -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"{FIXTURE.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM stepstone_queue").fetchall()
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def legacy(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    """A store whose queue holds the frozen entry (see the module docstring)."""
    monkeypatch.chdir(tmp_path)  # where the run's steps would write their log
    if request.param == "sqlite":
        db = tmp_path / "q.sqlite"
        shutil.copyfile(FIXTURE, db)
        store = Store(db=db)
    else:
        url = request.getfixturevalue("pg_url")
        store = Store(url=url)
        store.setup()
        cancel_requested = ENTRY_COLUMNS.index("cancel_requested")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
            for key in store.keys():
                store.delete(key)
            for row in _frozen_rows():
                values = list(row)
                values[cancel_requested] = bool(values[cancel_requested])  # INTEGER there
                conn.execute(
                    f"INSERT INTO stepstone_queue ({', '.join(ENTRY_COLUMNS)}) "
                    f"VALUES ({', '.join(['%s'] * len(ENTRY_COLUMNS))})",
                    values,
                )
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("limited", [False, True], ids=["no-limits", "limits"])
def test_a_run_handed_back_after_its_cancel_never_runs_again(
    legacy: Store, tmp_path: Path, limited: bool
) -> None:
    [entry] = queue_backend(legacy).entries("orders", None)
    assert entry.status == "queued" and entry.cancel_requested  # as the older worker left it
    checkpoint = legacy.read(KEY)
    behind = submit(legacy, T + "plan", task("log", "behind"), queue="orders")
    if limited:  # (a queue with limits is claimed on another path)
        set_queue_limits(legacy, "orders", concurrency=4)
    # one slot: the claim reaches the cancelled entry first, and takes the run behind it
    # in its place
    assert (
        Worker(legacy, queues=["orders"], concurrency=1, poll_interval=0.05).run(until_idle=True)
        == 1
    )
    ended = RunHandle(legacy, entry.id).entry()
    assert ended.status == "cancelled"  # guarantee 223
    assert ended.error == CANCELLED_RUNNING
    with pytest.raises(QueuedRunError, match="ended cancelled: cancelled while running"):
        RunHandle(legacy, entry.id).result(timeout=1)
    assert legacy.read(KEY) == checkpoint  # no step of it ran: guarantee 223
    runs = executions(str(tmp_path / "log"))
    assert [s for name, s in runs if name == "legacy"] == []  # guarantee 223
    assert behind.result(timeout=5).ok
    assert sorted(s for name, s in runs if name == "behind") == list(range(10))
