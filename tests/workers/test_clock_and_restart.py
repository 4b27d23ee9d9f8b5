"""Leases on the database's clock, and workers that ride out a database restart."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from stepstone import Store, submit
from stepstone.durable import claim_run
from stepstone.durable._queue import queue_backend
from stepstone.store import SQLiteBackend
from stepstone.store._postgres import PostgresBackend
from tests.pgserver import PgServer
from tests.workers.targets import executions, task
from tests.workers.test_pg_processes import T, finish, spawn, wait_for


class _SkewedSQLite(SQLiteBackend):
    """A SQLite backend whose "database clock" is an hour ahead of this host's."""

    def clock(self) -> float:
        return time.time() + 3600


def test_run_leases_are_set_and_judged_by_the_backend_clock(tmp_path: Path) -> None:
    store = Store(backend=_SkewedSQLite(tmp_path / "c.sqlite"), lease_seconds=5)
    claimed = claim_run(store, "k", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    try:
        # guarantee 242: the lease runs to the database's now + lease_seconds
        assert claimed.head.lease_until > time.time() + 3600
        claimed.run.commit_sync(status="running", next_step="b")
        assert claimed.run.head.lease_until > time.time() + 3600
        assert claimed.run.head.updated_at > time.time() + 3000
        # renewal is due by the database's clock too: a fresh lease is not due, though by
        # this host's clock it would not expire for an hour
        assert not claimed.run.lease_due()
        claimed.run.head = claimed.run.head.replace(lease_until=time.time() + 3600 + 1)
        assert claimed.run.lease_due()
    finally:
        claimed.run.release()


@pytest.mark.postgres
def test_postgres_clock_is_the_servers(pg_url: str) -> None:
    backend = PostgresBackend(pg_url)
    try:
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        assert abs(backend.clock() - float(row[0])) < 1.0  # guarantee 242
        queue = queue_backend(Store(backend=backend))
        assert abs(queue.now() - backend.clock()) < 1.0
    finally:
        backend.close()


@pytest.mark.postgres
def test_a_worker_started_while_the_database_is_down_waits_for_it(
    own_pg_server: PgServer, tmp_path: Path
) -> None:
    # guarantee 243: before, the worker exited at once ("cannot set up the stepstone
    # schema ... Connection refused"), shrinking a pool restarted during an outage
    url = own_pg_server.create_database("w_late")
    log = str(tmp_path / "log")
    with Store(url=url) as store:
        handle = submit(store, T + "plan", task(log, "late"))
        own_pg_server.stop()
        proc = spawn(url, "--max-runs", "1")
        try:
            time.sleep(3.0)
            assert proc.poll() is None, "the worker gave up while the database was down"
            own_pg_server.start()
            assert handle.result(timeout=120).ok
        finally:
            if proc.poll() is None and handle.status() != "done":
                proc.kill()
            finish(proc)
    assert proc.returncode == 0


@pytest.mark.postgres
def test_workers_ride_out_a_database_restart(own_pg_server: PgServer, tmp_path: Path) -> None:
    url = own_pg_server.create_database("w_restart")
    log = str(tmp_path / "log")
    with Store(url=url) as store:
        handles = [submit(store, T + "plan", task(log, f"r{i}", sleep=0.03)) for i in range(8)]
        procs = [spawn(url, "--concurrency", "2", "--max-runs", "8") for _ in range(2)]
        wait_for(lambda: len(executions(log)) >= 10, what="10 steps")
        own_pg_server.restart(down_for=1.0)  # guarantee 243
        for h in handles:
            assert h.result(timeout=120).ok
        runs = executions(log)
        assert len(runs) == 80
        # a step in flight during the outage may run again; no committed one does
        assert sum(len(p) - 1 for p in runs.values()) <= 4
        for p in procs:
            p.terminate()
            finish(p)
