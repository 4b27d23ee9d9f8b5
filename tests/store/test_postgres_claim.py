"""A claim on PostgreSQL commits without waiting for its WAL flush; the run's first step
commit flushes it. These tests own their server (they crash it with an immediate stop).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from stepstone import Agent, Plan, Step, Store, submit
from stepstone.durable import claim_run
from stepstone.exceptions import ConcurrentRunError
from stepstone.store import PostgresBackend
from tests.pgserver import PgServer
from tests.workers.targets import executions, task
from tests.workers.test_pg_processes import T, finish, spawn, wait_for

pytestmark = pytest.mark.postgres


def _lsns(observer: psycopg.Connection[object]) -> tuple[int, int]:
    """(WAL insert position, WAL flush position) of the server, in bytes."""
    row = observer.execute(
        "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, "
        "pg_current_wal_flush_lsn() - '0/0'::pg_lsn"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_claim_does_not_wait_for_its_wal_flush_and_its_first_step_flushes_it(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    # guarantee 330: the claim's transaction commits with synchronous_commit off (it returns
    # before the server flushed its WAL), the step commits on the same pooled connection
    # do not, and the first step commit flushes the WAL through the claim.
    # The WAL writer flushes asynchronous commits in the background every
    # wal_writer_delay: make that 10 s so it does not race the readings below.
    own_pg_server.admin("ALTER SYSTEM SET wal_writer_delay = '10s'")
    own_pg_server.admin("SELECT pg_reload_conf()")
    time.sleep(0.5)
    backend = PostgresBackend(own_pg_url, min_size=1, max_size=1)  # one connection for everything
    with (
        Store(backend=backend) as store,
        psycopg.connect(own_pg_url, autocommit=True) as observer,
    ):
        store.write("warm", 1)
        unflushed = 0
        for i in range(10):
            inserted_before, _ = _lsns(observer)
            run = claim_run(store, f"run{i}", kind="test", resume=False, first_step="a").run
            assert run is not None
            try:
                inserted, flushed = _lsns(observer)
                assert inserted > inserted_before  # the claim wrote WAL
                unflushed += flushed < inserted
                before_step, _ = _lsns(observer)
                run.commit_sync(status="running", next_step="b", rows=[("step", "a", i)])
                _, flushed_after_step = _lsns(observer)
                # a synchronous commit returns only once its own record is flushed, and
                # that record lies after everything inserted before it was sent
                assert flushed_after_step > before_step >= inserted
                run.commit_sync(status="done", next_step=None, rows=[("step", "b", i)])
            finally:
                run.release()
        # Each claim left its WAL unflushed for the background writer (10 s away); allow
        # a few to have been flushed by chance (a checkpoint, the writer waking up).
        assert unflushed >= 5, f"only {unflushed} of 10 claims returned before their flush"
        # the plain values and run updates that are not claims stay synchronous
        inserted_before, _ = _lsns(observer)
        store.write("after", 2)
        assert _lsns(observer)[1] > inserted_before


def test_a_claim_and_its_first_step_survive_a_server_crash(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    # guarantee 331: the server is killed (immediate stop: no shutdown checkpoint, WAL
    # buffers lost) right after a run's first step commit: claim and step are both there
    with Store(url=own_pg_url) as store:
        run = claim_run(store, "job", kind="test", resume=False, first_step="a").run
        assert run is not None
        run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)], writes=[("w", 1)])
        own_pg_server.stop("immediate")
        own_pg_server.start()
        head = store.backend.run_get("job")
        assert head is not None
        assert (head.run_uid, head.version, head.next_step) == (run.run_uid, 2, "b")
        assert [(r.seq, r.name) for r in store.backend.run_journal("job")] == [(0, "a")]
        assert store.read("w") == 1
        run.commit_sync(status="done", next_step=None, rows=[("step", "b", 2)])
        run.release()
        assert [r.name for r in store.backend.run_journal("job")] == ["a", "b"]


def test_a_plan_that_finished_survives_a_server_crash(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    # guarantee 331: every step of a finished Plan, and the values it wrote, outlive a
    # server crash right after the run returned
    with Store(url=own_pg_url) as store:
        plan = Plan(
            Step(lambda x: f"{x}+a", name="a", writes="va"),
            Step(lambda x: f"{x}+b", name="b", writes="vb"),
            store=store,
            checkpoint_key="plan",
        )
        env = Agent(engine=plan)("go")
        assert env.ok, env.error
        own_pg_server.stop("immediate")
        own_pg_server.start()
        state = store.read("plan")
        assert state["status"] == "done"
        assert state["completed_steps"] == ["a", "b"]
        assert (store.read("va"), store.read("vb")) == ("go+a", "go+a+b")


def test_a_claim_a_crash_takes_is_lost_whole_and_the_run_resumes(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    # guarantee 332: a server crash right after a claim (before any step commit) leaves the
    # key either with the whole claim or as it was before it; a claimer whose claim was
    # lost gets the ownership error from its first commit, with nothing written, and a
    # resume starts the run again
    own_pg_server.admin("ALTER SYSTEM SET wal_writer_delay = '10s'")
    own_pg_server.admin("SELECT pg_reload_conf()")
    time.sleep(0.5)
    with Store(url=own_pg_url) as store:
        store.write("warm", 1)
        old = claim_run(store, "job", kind="test", resume=False, first_step="a").run
        assert old is not None
        old.commit_sync(status="done", next_step=None, rows=[("step", "a", "old")])
        old.release()
        run = claim_run(store, "job", kind="test", resume=False, first_step="a").run
        assert run is not None
        own_pg_server.stop("immediate")
        own_pg_server.start()
        head = store.backend.run_get("job")
        assert head is not None
        rows = [(r.name, r.data) for r in store.backend.run_journal("job")]
        if head.run_uid == run.run_uid:  # the claim reached the disk: whole
            assert (head, rows) == (run.head, [])
            run.commit_sync(status="done", next_step=None, rows=[("step", "a", "new")])
        else:  # lost whole: the finished run and its journal are back, untouched
            assert (head.run_uid, head.version, head.status) == (old.run_uid, 2, "done")
            assert rows == [("a", '"old"')]
            with pytest.raises(ConcurrentRunError, match="lost checkpoint 'job'"):
                run.commit_sync(status="done", next_step=None, rows=[("step", "a", "new")])
            assert store.backend.run_get("job") == head  # nothing written
            again = claim_run(store, "job", kind="test", resume=False, first_step="a").run
            assert again is not None
            again.commit_sync(status="done", next_step=None, rows=[("step", "a", "new")])
            again.release()
        run.release()
        assert [r.data for r in store.backend.run_journal("job")] == ['"new"']


def test_a_commit_the_server_lost_entirely_counts_as_not_committed(own_pg_url: str) -> None:
    # guarantee 333: the outcome lookup of a COMMIT that got no answer: a transaction id the
    # server does not know yet (a crash lost the end of its WAL) means it did not commit
    backend = PostgresBackend(own_pg_url)
    with Store(backend=backend) as store:
        store.write("warm", 1)
        with psycopg.connect(own_pg_url, autocommit=True) as conn:
            row = conn.execute("SELECT txid_current()").fetchone()
        assert row is not None
        future = int(row[0]) + 1_000_000
        assert backend._committed(future, "test", time.monotonic() + 5) is False


def test_workers_ride_out_a_server_crash(own_pg_server: PgServer, tmp_path: Path) -> None:
    # guarantee 243, with the server crashing (immediate stop: unflushed claims are lost)
    # rather than restarting cleanly: a worker whose claim was lost hands its run back and
    # the run is taken again; every run finishes and no committed step runs again
    url = own_pg_server.create_database("c_workers_crash")
    log = str(tmp_path / "log")
    try:
        with Store(url=url) as store:
            handles = [submit(store, T + "plan", task(log, f"r{i}", sleep=0.03)) for i in range(8)]
            procs = [spawn(url, "--concurrency", "2", "--max-runs", "8") for _ in range(2)]
            try:
                wait_for(lambda: len(executions(log)) >= 10, what="10 steps")
                own_pg_server.stop("immediate")
                time.sleep(0.5)
                own_pg_server.start()
                for h in handles:
                    assert h.result(timeout=120).ok
                runs = executions(log)
                assert len(runs) == 80
                # a step in flight during the crash (at most one per running run) may run
                # again; no committed one does
                assert sum(len(p) - 1 for p in runs.values()) <= 4
            finally:
                for p in procs:
                    p.terminate()
                    finish(p)
    finally:
        own_pg_server.drop_database("c_workers_crash")
