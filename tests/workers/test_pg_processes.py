"""Worker processes on one PostgreSQL queue: sharing, SIGKILL recovery, poison runs and
graceful SIGTERM, with real ``stepstone worker`` subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stepstone import QueuedRunError, RunHandle, Store, submit
from stepstone.graph import CheckpointFilter, StoreCheckpointer
from tests import _spawn
from tests.workers.targets import Tally, executions, task

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
T = "tests.workers.targets:"


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    with Store(url=pg_url) as s:
        s.setup()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
        for key in s.keys():
            s.delete(key)
        yield s


def spawn(url: str, *args: str, fresh: bool = False) -> _spawn.Process:
    """``stepstone worker`` in a process of its own, forked from the tests' warm server
    unless ``fresh``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return _spawn.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            "--url",
            url,
            "--poll-interval",
            "0.05",
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        fresh=fresh,
    )


def finish(proc: _spawn.Process, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def wait_for(cond: object, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_several_worker_processes_share_one_queue(
    store: Store, pg_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    handles = [submit(store, T + "plan", task(log, f"r{i}", sleep=0.02)) for i in range(24)]
    procs = [spawn(pg_url, "--until-idle", "--concurrency", "1") for _ in range(3)]
    outs = [finish(p) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for h in handles:
        assert h.result(timeout=5).ok
    runs = executions(log)
    assert len(runs) == 24 * 10 and all(len(p) == 1 for p in runs.values())  # guarantee 238
    pids = {p[0] for p in runs.values()}
    assert len(pids) >= 2, outs  # the work was shared


def test_a_sigkilled_workers_run_completes_elsewhere_and_no_committed_step_reruns(
    store: Store, pg_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    h = submit(store, T + "long_plan", task(log, "k", sleep=0.03))
    first = spawn(pg_url, "--lease-seconds", "60", fresh=True)  # killed: a fresh interpreter
    wait_for(lambda: len(executions(log)) >= 5, what="5 steps of the first worker")
    first.send_signal(signal.SIGKILL)
    finish(first)
    done_before = {s for (_, s), pids in executions(log).items() if pids[0] == first.pid}
    # the lease is 60 s, but the dead worker was on this host: taken over at once
    second = spawn(pg_url, "--until-idle", "--lease-seconds", "60")
    out = finish(second, timeout=90)
    assert second.returncode == 0, out
    env = h.result(timeout=5)
    assert env.ok, env.error  # guarantee 239
    runs = executions(log)
    assert sorted(s for _, s in runs) == list(range(40))
    repeated = [s for (_, s), pids in runs.items() if len(pids) > 1]
    # only the step in flight at the kill may run again; every committed one ran once
    assert len(repeated) <= 1  # guarantee 239
    assert all(runs[("k", s)][0] == first.pid for s in repeated)
    assert len(done_before) >= 5
    assert h.entry().attempts == 2


def test_a_poison_run_is_failed_after_max_attempts_and_never_blocks_the_queue(
    store: Store, pg_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    poison = submit(store, T + "poison_plan", task(log, "p"), priority=9, max_attempts=2)
    healthy = submit(store, T + "plan", task(log, "ok"))
    for _ in range(2):  # each worker takes the poison run first and dies of it
        proc = spawn(pg_url)
        finish(proc)
        assert proc.returncode == -signal.SIGKILL
    last = spawn(pg_url, "--until-idle")
    out = finish(last)
    assert last.returncode == 0, out
    assert healthy.result(timeout=5).ok  # guarantee 240
    assert poison.status() == "failed"
    with pytest.raises(QueuedRunError, match="died or lost its lease on each of its 2 attempts"):
        poison.result(timeout=1)  # guarantee 240


def test_sigterm_hands_back_the_running_run_and_exits(
    store: Store, pg_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    h = submit(store, T + "long_plan", task(log, "t", sleep=0.03))
    proc = spawn(pg_url, "--shutdown-timeout", "0.2")
    wait_for(lambda: len(executions(log)) >= 3, what="3 steps")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=60)
    assert proc.returncode == 0, out  # guarantee 241
    entry = RunHandle(store, h.id).entry()
    assert entry.status == "queued" and entry.attempts == 0  # handed back, not an attempt
    after = spawn(pg_url, "--until-idle")
    assert finish(after) and after.returncode == 0
    assert h.result(timeout=5).ok
    runs = executions(log)
    assert sorted(s for _, s in runs) == list(range(40))
    # guarantees 241 and 347: the step running in a worker thread when the shutdown
    # cancelled the run finished and was committed, so no step ran twice
    assert [s for s, pids in runs.items() if len(pids) > 1] == []


def test_a_sigkilled_workers_graph_run_resumes_its_invocation_elsewhere(
    store: Store, pg_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    h = submit(store, T + "crash_graph", Tally(log=log, name="g"))
    first = spawn(pg_url)
    finish(first)  # its graph's node n1 SIGKILLs it after n0 was committed
    assert first.returncode == -signal.SIGKILL
    second = spawn(pg_url, "--until-idle")
    out = finish(second)
    assert second.returncode == 0, out
    assert h.result(timeout=5).payload["total"] == 3  # guarantee 249
    assert executions(log) == {
        ("g", 0): [first.pid],
        ("g", 1): [second.pid],
        ("g", 2): [second.pid],
    }
    chain = StoreCheckpointer(store).list(CheckpointFilter(correlation_id=h.key))
    assert [r.status for r in chain] == ["running", "done"]  # the second resumed the first
    assert chain[1].resumed_from == chain[0].invocation_id
