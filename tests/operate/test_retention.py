"""Retention: which runs prune deletes, what it never deletes, and vacuum shrinking files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.durable import plan_prune, prune, prune_run
from stepstone.store import Retention, vacuum
from tests._missing import missing
from tests.operate._runs import done_run, failed_run
from tests.operate.conftest import open_args

DAY = 86400.0


def test_retention_validates_its_settings() -> None:
    # guarantee 355
    with pytest.raises(ValueError, match="needs ttl="):
        Retention()
    with pytest.raises(ValueError, match="keep_last must be >= 0"):
        Retention(keep_last=-1)
    with pytest.raises(ValueError, match="statuses must be a non-empty subset"):
        Retention(ttl=timedelta(days=1), statuses=("finished",))
    with pytest.raises(TypeError, match="retention must be a Retention"):
        Store(retention={"ttl": 3})  # type: ignore[arg-type]
    # settings of the wrong type are named, not raw comparison errors or accepted
    for settings, said in (
        ({"ttl": 30}, "ttl must be a timedelta"),
        ({"keep_last": 2, "min_age": None}, "min_age must be a timedelta"),
        ({"keep_last": 2.5}, "keep_last must be a whole number"),
        ({"keep_last": 2, "prefix": 5}, "prefix must be a str, a tuple of str, or None"),
        ({"keep_last": 2, "prefix": ("etl-", 3)}, "prefix must be a str"),
    ):
        with pytest.raises(TypeError, match=said):
            Retention(**settings)  # type: ignore[arg-type]


def test_ttl_and_keep_last_select_old_finished_runs(tmp_path: Path) -> None:
    # guarantee 260, 261
    with Store(db=tmp_path / "s.sqlite") as store:
        for i in range(5):
            done_run(store, f"etl-{i}")
        failed_run(store, "etl-failed")
        done_run(store, "other")
        heads = store.backend.run_list(None)
        now = max(h.updated_at for h in heads)
        # keep_last: only the 2 newest done etl- runs stay; the failed one is not a status
        # the policy names, and 'other' is outside the prefix.
        policy = Retention(keep_last=2, prefix="etl-", min_age=timedelta(0))
        report = prune(store, policy, dry_run=True, now=now + 1)
        assert [r.key for r in report.deleted] == ["etl-0", "etl-1", "etl-2"]
        assert {r.reason for r in report.deleted} == {"keep_last"}
        assert store.backend.run_get("etl-0") is not None  # a dry run writes nothing
        report = prune(store, policy, now=now + 1)
        assert (
            sorted(store.backend.run_get(k) is None for k in ("etl-0", "etl-1", "etl-2"))
            == [True] * 3
        )
        assert {h.key for h in store.backend.run_list(None)} == {
            "etl-3",
            "etl-4",
            "etl-failed",
            "other",
        }
        assert store.backend.run_journal("etl-0") == []
        # ttl: a day later every done run is older than 12 h; failed runs only when named.
        policy = Retention(ttl=timedelta(hours=12), statuses=("done", "failed"))
        report = prune(store, policy, now=now + DAY)
        assert sorted(r.key for r in report.deleted) == ["etl-3", "etl-4", "etl-failed", "other"]
        assert {r.reason for r in report.deleted} == {"ttl"}
        assert store.backend.run_list(None) == []
        # writes= values of ordinary runs are the user's data: prune keeps them.
        assert store.read("etl-0.raw") == "x"


def test_recent_runs_are_never_pruned(tmp_path: Path) -> None:
    # guarantee 262
    with Store(db=tmp_path / "s.sqlite") as store:
        for i in range(3):
            done_run(store, f"r{i}")
        now = time.time()
        report = prune(store, Retention(keep_last=0, ttl=timedelta(0)), now=now)
        assert report.deleted == []  # all updated less than min_age (5 min) ago
        report = prune(store, Retention(keep_last=0), now=now + 301)
        assert len(report.deleted) == 3


def test_store_retention_is_the_default_policy(tmp_path: Path) -> None:
    # guarantee 263
    policy = Retention(keep_last=1, min_age=timedelta(0))
    with Store(db=tmp_path / "s.sqlite", retention=policy) as store:
        done_run(store, "a")
        done_run(store, "b")
        report = prune(store)
        assert [r.key for r in report.deleted] == ["a"]
    with (
        Store(db=tmp_path / "s.sqlite") as store,
        pytest.raises(ValueError, match="needs a policy"),
    ):
        prune(store)


def _blocking_plan(store: Store, key: str, started: threading.Event, go: threading.Event) -> Plan:
    def wait(payload: object) -> str:
        started.set()
        assert go.wait(60)
        return "late"

    return Plan(Step(wait, name="wait"), store=store, checkpoint_key=key)


def test_a_live_run_is_never_pruned_whatever_the_policy(tmp_path: Path) -> None:
    # guarantee 264
    with Store(db=tmp_path / "s.sqlite") as store:
        started, go = threading.Event(), threading.Event()
        plan = _blocking_plan(store, "live", started, go)
        worker = threading.Thread(target=lambda: Agent(engine=plan)("go"))
        worker.start()
        try:
            assert started.wait(60)
            every = Retention(ttl=timedelta(0), keep_last=0, statuses=("claimed", "running"))
            report = prune(store, every, now=time.time() + 10 * DAY)
            assert report.deleted == []
            assert report.skipped_live == ["live"]
            # and judged-then-deleted directly: the CAS claim refuses a live owner
            assert prune_run(store, store.backend.run_get("live")) is None  # type: ignore[arg-type]
        finally:
            go.set()
            worker.join(60)
        assert store.read("live")["status"] == "done"


def test_a_run_that_changed_after_being_judged_is_left_alone(tmp_path: Path) -> None:
    # guarantee 265
    with Store(db=tmp_path / "s.sqlite") as store:
        done_run(store, "k", payload="first")
        judged = store.backend.run_get("k")
        assert judged is not None
        done_run(store, "k", payload="second")  # a fresh run under the same key
        assert prune_run(store, judged) is None
        assert store.read("k")["status"] == "done"
        assert store.read("k.raw") == "second"
        chosen, _ = plan_prune(
            store.backend.run_list(None), Retention(keep_last=0), now=time.time() + DAY
        )
        assert prune_run(store, chosen[0][0]) == []
        assert store.backend.run_get("k") is None


def test_a_stranded_run_goes_only_when_its_status_is_named(tmp_path: Path) -> None:
    # guarantee 264: a dead owner is not live
    db = tmp_path / "s.sqlite"
    code = f"""
import time
from stepstone import Agent, Plan, Step, Store
def hang(p):
    print("started", flush=True)
    time.sleep(600)
Agent(engine=Plan(Step(hang, name="hang"), store=Store(db={str(db)!r}),
      checkpoint_key="stranded"))("go")
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        with Store(db=db) as store:
            running = Retention(ttl=timedelta(0), statuses=("claimed", "running"))
            later = time.time() + DAY
            assert prune(store, running, now=time.time()).deleted == []  # recent
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(60)
            assert prune(store, Retention(ttl=timedelta(0)), now=later).deleted == []
            assert [r.key for r in prune(store, running, now=later).deleted] == ["stranded"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()


def test_fork_runs_go_with_their_writes(tmp_path: Path) -> None:
    # guarantee 266
    with Store(db=tmp_path / "s.sqlite") as store:
        store.write("backtest-config", {"window": 30})
        plan = Plan(
            Step(lambda p: f"result of {p}", name="backtest", writes="result"),
            store=store,
            checkpoint_key="backtest",
            on_concurrent="fork",
        )
        plan.run_many(["a", "b", "c"])
        forks = store.backend.run_list("backtest:")
        assert len(forks) >= 3
        values = [k for k, _ in store.backend.kv_items("backtest:")]
        assert len(values) == len(forks)
        report = prune(store, Retention(keep_last=0, prefix="backtest:"), now=time.time() + DAY)
        assert len(report.deleted) == len(forks)
        assert all(len(r.values) == 1 and r.values[0].endswith(":result") for r in report.deleted)
        assert store.keys(prefix="backtest:") == []
        assert store.read("backtest-config") == {"window": 30}


def _fill(store: Store, runs: int, payload_bytes: int) -> None:
    blob = "y" * payload_bytes
    for i in range(runs):
        done_run(store, f"big-{i:04d}", payload=blob)


def test_vacuum_shrinks_a_pruned_sqlite_file(tmp_path: Path) -> None:
    # guarantee 267
    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        _fill(store, 60, 20_000)
        for i in range(60):
            store.delete(f"big-{i:04d}.raw")
        report = prune(store, Retention(keep_last=5), now=time.time() + DAY)
        assert len(report.deleted) == 55
    first = vacuum(Store(db=db).backend)
    assert first.full and first.bytes_after < first.bytes_before / 3, first
    with Store(db=db) as store:
        _fill(store, 30, 20_000)
        prune(store, Retention(keep_last=0), now=time.time() + DAY)
        assert store.read("big-0001.raw") == "y" * 20_000
    second = vacuum(Store(db=db).backend)
    assert not second.full and second.bytes_after < second.bytes_before / 2, second
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # every free page went
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    finally:
        conn.close()
    with Store(db=db) as store:
        done_run(store, "after-vacuum")
        assert store.read("after-vacuum")["status"] == "done"


def test_vacuum_refuses_other_stores() -> None:
    from stepstone.exceptions import StoreError

    with pytest.raises(StoreError, match="SQLite files and PostgreSQL"):
        vacuum(Store().backend)


def test_prune_on_both_backends(store_args: list[str]) -> None:
    # guarantee 260, 264
    with open_args(store_args) as store:
        for i in range(4):
            done_run(store, f"p-{i}")
        failed_run(store, "p-failed")
        report = prune(store, Retention(keep_last=1, prefix="p-"), now=time.time() + DAY)
        assert [r.key for r in report.deleted] == ["p-0", "p-1", "p-2"]
        assert sorted(h.key for h in store.backend.run_list("p-")) == ["p-3", "p-failed"]


def test_background_pruner_applies_the_store_policy(tmp_path: Path) -> None:
    # guarantee 284
    from stepstone.durable import Pruner
    from tests.operate._live import SteppedRun

    policy = Retention(keep_last=1, min_age=timedelta(0))
    with Store(db=tmp_path / "s.sqlite", retention=policy) as store:
        for i in range(3):
            done_run(store, f"old-{i}")
        live = SteppedRun(store, "live", steps=2).start()
        try:
            assert live.started[0].wait(60)
            with Pruner(store, every=timedelta(seconds=0.05)) as pruner:
                deadline = time.time() + 60
                while pruner.passes < 3 and time.time() < deadline:
                    time.sleep(0.05)
            assert pruner.passes >= 3
            assert {h.key for h in store.backend.run_list(None)} == {"old-2", "live"}
            assert pruner.deleted == 2
            assert pruner.last_report is not None and pruner.last_report.deleted == []
        finally:
            live.finish()
    with pytest.raises(ValueError, match="needs a policy"), Store() as bare:
        Pruner(bare)


def test_a_delete_interrupted_by_a_crash_is_finished_by_the_next_prune(tmp_path: Path) -> None:
    # guarantee 265
    import dataclasses

    from stepstone.store import Claim

    with Store(db=tmp_path / "s.sqlite") as store:
        done_run(store, "half-deleted")
        done_run(store, "kept")
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        dead_pid = int(gone.stdout)

        def tombstone(head, _kv):  # type: ignore[no-untyped-def]
            # what prune_run writes before removing the head, from a pruner that then died
            return Claim(
                head=dataclasses.replace(
                    head,
                    status="claimed",
                    pid=dead_pid,
                    pid_start=None,
                    journal_len=0,
                    version=head.version + 1,
                    meta={**head.meta, "pruning": True},
                    lease_until=time.time() + 600,
                ),
                reset_journal=True,
            )

        store.backend.run_transact("half-deleted", tombstone)
        report = prune(store, Retention(ttl=timedelta(days=365)))
        assert [(r.key, r.reason) for r in report.deleted] == [("half-deleted", "interrupted")]
        assert [h.key for h in store.backend.run_list(None)] == ["kept"]


def test_keep_last_per_key_prefix(tmp_path: Path) -> None:
    # guarantee 260
    with Store(db=tmp_path / "s.sqlite") as store:
        for i in range(3):
            done_run(store, f"etl-{i}")
            done_run(store, f"report-{i}")
        done_run(store, "other")
        policy = Retention(keep_last=1, prefix=("etl-", "report-"), min_age=timedelta(0))
        report = prune(store, policy, now=time.time() + 1)
        assert sorted(r.key for r in report.deleted) == ["etl-0", "etl-1", "report-0", "report-1"]
        assert sorted(h.key for h in store.backend.run_list(None)) == ["etl-2", "other", "report-2"]
    with pytest.raises(ValueError, match="names no group"):
        Retention(keep_last=1, prefix=())


def test_vacuum_of_a_server_that_never_answers_fails_within_the_connect_timeout() -> None:
    # guarantee 267: vacuum connected without the store's connect timeout, and waited for
    # the operating system to give up (minutes) on a server that accepted and said nothing
    import socket

    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("a PostgreSQL test", "psycopg is not installed (pip install -e '.[postgres]')")
    from stepstone.exceptions import StoreError
    from stepstone.store import vacuum
    from stepstone.store._postgres import PostgresBackend

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        port = silent.getsockname()[1]
        backend = PostgresBackend(f"postgresql://nobody@127.0.0.1:{port}/none", connect_timeout=1)
        started = time.monotonic()
        with pytest.raises(StoreError, match="could not vacuum"):
            vacuum(backend)
        assert time.monotonic() - started < 30
        backend.close()
    finally:
        silent.close()


def test_ctrl_c_stops_a_prune_between_runs_and_reports_what_went(store_args: list[str]) -> None:
    """guarantee 373: SIGINT to `stepstone prune` in the middle of its deletes (a real
    process, as Ctrl-C sends it): it stops after the run it was deleting, prints what it
    deleted and how many it left (before, it exited without a word, and on PostgreSQL a
    half-deleted run was left claimed by a dead owner), exits 130, and the same prune run
    again deletes the rest."""
    import json

    # 500 runs: the prune deletes one a transaction, so it is still at work when the
    # SIGINT sent after its first delete arrives (1,500 took 15 s to write and delete)
    runs = 500
    # written without an fsync a commit (SQLite): the prune, not the setup, is under test
    quick = store_args[0] == "--db"
    with Store(db=store_args[1], durability="normal") if quick else open_args(store_args) as store:
        plan = Plan(Step(lambda p: p, name="only"), store=store, checkpoint_key="r")
        for i in range(runs):
            plan.checkpoint_key = f"r{i:04d}"
            assert Agent(engine=plan)("go").ok
    args = ["prune", "--keep-last", "0", "--min-age", "0s", "--json", *store_args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepstone.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with open_args(store_args) as store:
        deadline = time.time() + 60
        while store.backend.run_get("r0000") is not None:  # the oldest goes first
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    report = json.loads(out)
    gone = [d["key"] for d in report["deleted"]]
    assert report["interrupted"] is True and 0 < len(gone) < runs
    assert report["left"] == runs - len(gone)
    (line,) = err.strip().splitlines()
    assert line == (
        f"interrupted: deleted {len(gone)} of the {runs} selected run(s), {runs - len(gone)} "
        "left untouched; run the same prune again to delete the rest"
    )
    with open_args(store_args) as store:
        heads = store.backend.run_list(None)
        assert len(heads) == runs - len(gone) and not set(gone) & {h.key for h in heads}
        assert {h.status for h in heads} == {"done"}  # no half-deleted run left behind
    again = subprocess.run(
        [sys.executable, "-m", "stepstone.cli", *args], capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    rest = json.loads(again.stdout)
    assert rest["interrupted"] is False and rest["left"] == 0
    assert len(rest["deleted"]) == runs - len(gone)


def test_an_interrupted_prune_raises_what_it_deleted(tmp_path: Path) -> None:
    """guarantee 373: from Python, a KeyboardInterrupt during prune() (here raised by its
    progress callback after the second run) becomes PruneInterrupted, still a
    KeyboardInterrupt, carrying the report of the runs deleted before it."""
    from stepstone.durable._retention import PruneInterrupted

    with Store(db=tmp_path / "s.sqlite") as store:
        for i in range(5):
            done_run(store, f"p-{i}")

        def stop_after_two(done: int, total: int) -> None:
            if done == 2:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt) as caught:
            prune(store, Retention(keep_last=0), now=time.time() + DAY, progress=stop_after_two)
        stopped = caught.value
        assert isinstance(stopped, PruneInterrupted) and stopped.total == 5
        assert [r.key for r in stopped.report.deleted] == ["p-0", "p-1"]
        assert sorted(h.key for h in store.backend.run_list(None)) == ["p-2", "p-3", "p-4"]
