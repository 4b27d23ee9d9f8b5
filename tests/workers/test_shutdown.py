"""A worker told to stop while its store cannot be reached (the PostgreSQL server down, the
SQLite file locked by another process) exits within a bounded time instead of waiting out
the store's retries, says which runs it could not hand back, and loses nothing: another
worker takes those runs over and no committed step runs again (guarantee 222).

The workers are real ``stepstone worker`` processes stopped with a real SIGTERM (and, for
``Worker.run()``, an in-process worker stopped with ``Worker.stop()``); the outage is the
real server stopped, or a real second connection holding the file's write lock.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stepstone import RunHandle, Store, Worker, submit
from tests import _spawn
from tests.pgserver import PgServer
from tests.workers.targets import executions, task
from tests.workers.test_pg_processes import ROOT, T, finish, spawn, wait_for

#: The store's own retry windows are 60 s (PostgreSQL's reconnect_timeout) and 30 s per
#: operation (SQLite's busy_timeout), and a stopping worker used to wait out several of
#: them in a row. It now gives up 0.5 s (its shutdown_timeout) plus 5 s after the stop;
#: this bound leaves room for a loaded machine.
BOUND = 30.0


def _stop_and_time(proc: _spawn.Process) -> tuple[float, str]:
    """SIGTERM ``proc``; how long it took to exit, and what it printed."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"the worker did not exit within {BOUND} s of SIGTERM:\n{finish(proc)}"
        ) from None
    return time.monotonic() - started, finish(proc)


def _spawn_sqlite(db: Path, *args: str) -> _spawn.Process:
    """``stepstone worker`` on SQLite, forked from the tests' warm server."""
    command = ["worker", "--db", str(db), "--poll-interval", "0.05", *args]
    return _spawn.Popen(
        [sys.executable, "-m", "stepstone.cli", *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _assert_left(out: str, entry_id: str) -> None:
    said = " ".join(out.split())  # the console wraps lines
    assert f"stopped without handing back queued runs {entry_id}" in said, out
    assert "other workers take them over when their leases run out" in said, out


def _assert_each_committed_step_ran_once(log: str, first_pid: int) -> None:
    runs = executions(log)
    assert sorted(s for _, s in runs) == list(range(40))
    repeated = [s for (_, s), pids in runs.items() if len(pids) > 1]
    # only the step in flight when the store went away may run again
    assert len(repeated) <= 1, runs
    assert all(runs[("r", s)][0] == first_pid for s in repeated)


@pytest.mark.postgres
@pytest.mark.slow
def test_sigterm_during_a_database_outage_exits_promptly_and_loses_nothing(
    own_pg_server: PgServer, tmp_path: Path
) -> None:
    url = own_pg_server.create_database("w_outage")
    log = str(tmp_path / "log")
    with Store(url=url) as store:
        h = submit(store, T + "long_plan", task(log, "r", sleep=0.1))
    first = spawn(url, "--shutdown-timeout", "0.5", "--lease-seconds", "60")
    try:
        wait_for(lambda: len(executions(log)) >= 3, what="3 steps of the first worker")
        own_pg_server.stop()
        took, out = _stop_and_time(first)
    finally:
        if not own_pg_server.running:
            own_pg_server.start()
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out
    assert took < BOUND  # guarantee 222
    _assert_left(out, h.id)  # guarantee 222
    # the server is back: another worker takes the run over (the first one's process is
    # gone, so at once rather than when its 60 s lease runs out) and finishes it
    second = spawn(url, "--until-idle")
    out = finish(second)
    assert second.returncode == 0, out
    with Store(url=url) as store:
        assert RunHandle(store, h.id).result(timeout=5).ok
    _assert_each_committed_step_ran_once(log, first.pid)  # guarantee 222


@pytest.mark.slow
def test_sigterm_while_another_process_locks_the_sqlite_file_exits_promptly(
    tmp_path: Path,
) -> None:
    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        h = submit(store, T + "long_plan", task(log, "r", sleep=0.1))
    first = _spawn_sqlite(db, "--shutdown-timeout", "0.5", "--lease-seconds", "60")
    lock = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        wait_for(lambda: len(executions(log)) >= 3, what="3 steps of the first worker")
        lock.execute("BEGIN IMMEDIATE")  # every write of the worker now waits for it
        took, out = _stop_and_time(first)
    finally:
        lock.close()  # rolls back: the lock is gone
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out
    assert took < BOUND  # guarantee 222
    _assert_left(out, h.id)  # guarantee 222
    second = _spawn_sqlite(db, "--until-idle")
    out = finish(second)
    assert second.returncode == 0, out
    with Store(db=db) as store:
        assert RunHandle(store, h.id).result(timeout=5).ok
    _assert_each_committed_step_ran_once(log, first.pid)  # guarantee 222


@pytest.mark.slow
def test_worker_run_returns_when_stopped_while_its_file_is_locked(tmp_path: Path) -> None:
    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        h = submit(store, T + "long_plan", task(log, "r", sleep=0.1))
        worker = Worker(store, shutdown_timeout=0.5, poll_interval=0.05)
        serving = threading.Thread(target=worker.run)
        serving.start()
        lock = sqlite3.connect(db, isolation_level=None, timeout=30)
        try:
            wait_for(lambda: len(executions(log)) >= 3, what="3 steps")
            lock.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            worker.stop()
            serving.join(timeout=BOUND)
            assert not serving.is_alive(), "Worker.run() waited for the locked file"
            assert time.monotonic() - started < BOUND  # guarantee 222
            assert worker.abandoned == [h.id]  # guarantee 222
        finally:
            lock.close()
            serving.join(timeout=120)
        # Its calls still waiting on the lock go on once it is gone, in this process:
        # they hand the run back (or, failing that, its lease runs out).
        wait_for(lambda: h.status() != "running", timeout=120, what="the run handed back")
        assert h.status() == "queued"
        assert Worker(store, poll_interval=0.05).run(until_idle=True) == 1
        assert h.result(timeout=5).ok
    runs = executions(log)
    assert sorted(s for _, s in runs) == list(range(40))
    assert sum(len(pids) > 1 for pids in runs.values()) <= 1  # guarantee 222
