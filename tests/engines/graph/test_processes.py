"""Real OS processes: SIGKILL mid-run then resume; two concurrent resumes of one record."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter as Tally
from pathlib import Path

import pytest

from stepstone.graph import CheckpointFilter, NodeException, SQLiteCheckpointer
from tests import _spawn
from tests.engines.graph._graphs import Counter, loop_graph

WORKER = Path(__file__).with_name("proc_worker.py")
LIMIT = 20


def _committed_ticks(db: Path) -> list[int]:
    cp = SQLiteCheckpointer(db)
    try:
        attempts = cp.list(CheckpointFilter(correlation_id="crash"))
        if not attempts:
            return []
        return [
            p.step for p in attempts[-1].completed_positions if p.node_name == "tick"
        ]  # tick k has step k
    finally:
        cp.close()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _ran_ticks(proc: _spawn.Process, log: Path, ticks: int) -> bool:
    """Wait until ``proc`` logged ``ticks`` more tick executions; False if it exited first."""
    start = _lines(log)
    deadline = time.monotonic() + 60
    while proc.poll() is None and _lines(log) < start + ticks:
        assert time.monotonic() < deadline, "the worker ran no tick for a minute"
        time.sleep(0.005)
    return proc.poll() is None


@pytest.mark.crash
def test_sigkill_mid_run_then_resume_in_a_new_process(tmp_path: Path) -> None:
    # guarantee 106, 109, 110: every committed node ran exactly once; nothing committed is lost
    rng = random.Random(int(os.environ.get("CRASH_SEED", "4")))
    db, log = tmp_path / "c.sqlite", tmp_path / "ticks.log"
    committed: list[int] = []
    in_flight: set[int] = set()
    kills = 0
    for attempt in range(40):
        proc = _spawn.Popen(
            [sys.executable, str(WORKER), "crash", str(db), str(log), str(LIMIT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,  # readline() below must not read ahead of what communicate() gets
            fresh=attempt == 0,  # the first a fresh interpreter, the others forked ones
        )
        assert proc.stdout is not None
        # The kill comes a few ticks after the worker is ready (imports take seconds on a
        # loaded machine) and a moment more, so every attempt gets to run some nodes.
        proc.stdout.readline()
        if _ran_ticks(proc, log, rng.randint(2, 6)):
            time.sleep(rng.uniform(0, 0.05))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
            now = _committed_ticks(db)
            assert now[: len(committed)] == committed, "a committed node was lost"
            committed = now
            logged = (
                {int(line.split()[1]) for line in log.read_text().splitlines()}
                if log.exists()
                else set()
            )
            in_flight |= {n for n in logged if n not in committed}
            continue
        out, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert b"DONE" in out
        break
    else:
        pytest.fail("the graph never finished")
    assert kills >= 1, "no kill landed mid-run; widen the timeout window"
    assert _committed_ticks(db) == list(range(1, LIMIT + 1))
    runs = Tally(int(line.split()[1]) for line in log.read_text().splitlines())
    assert sorted(runs) == list(range(1, LIMIT + 1))
    for n, count in runs.items():
        # only a tick in flight at a kill (ran, but its commit did not land) may run twice
        assert count == 1 or (n in in_flight and count == 2), (n, count, in_flight)
    cp = SQLiteCheckpointer(db)
    final = cp.list(CheckpointFilter(correlation_id="crash"))[-1]
    assert final.status == "done"
    assert final.state["trace"] == ["start", *[f"tick{n}" for n in range(1, LIMIT + 1)], "finish"]
    cp.close()


@pytest.mark.crash
def test_two_processes_resuming_one_record(tmp_path: Path) -> None:
    # the second concurrent resume gets ConcurrentGraphResumeError; nothing runs twice
    db, log = tmp_path / "c.sqlite", tmp_path / "ticks.log"
    cp = SQLiteCheckpointer(db)
    with pytest.raises(NodeException) as info:
        loop_graph(cp, log=log, fail_at=2).invoke(Counter(limit=4), correlation_id="pair")
    inv = info.value.invocation_id or ""
    cp.close()
    cmd = [sys.executable, str(WORKER), "resume", str(db), str(log)]
    # the first resume is stopped (SIGSTOP: alive, holding the record) once its first
    # tick is committed, so it is still running however long the second process takes to
    # start; stopped then, it sleeps in its next tick and holds no write lock
    first = _spawn.Popen([*cmd, inv, "1.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    watch = SQLiteCheckpointer(db)
    try:
        while not any(
            r.resumed_from == inv and r.state["n"] >= 2
            for r in watch.list(CheckpointFilter(correlation_id="pair"))
        ):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        watch.close()
    first.send_signal(signal.SIGSTOP)
    try:
        second = _spawn.run([*cmd, inv, "0"], capture_output=True, timeout=60)
    finally:
        first.send_signal(signal.SIGCONT)
    out1, err1 = first.communicate(timeout=60)
    assert second.returncode == 3, second.stderr.decode()
    assert b"REFUSED" in second.stdout and inv.encode() in second.stdout
    assert first.returncode == 0, err1.decode()
    assert out1.strip() == b"DONE 4"
    lines = log.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["1", "2", "3", "4"]  # no tick twice
    assert {line.split()[2] for line in lines[1:]} == {str(first.pid)}
    cp = SQLiteCheckpointer(db)
    assert [r.status for r in cp.list(CheckpointFilter(correlation_id="pair"))] == [
        "failed",
        "done",
    ]
    cp.close()
