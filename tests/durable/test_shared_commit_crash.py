"""Crash tests of commits shared across threads: durable Plan runs called from a thread
pool in a real subprocess, SIGKILLed (at random points, or inside a shared transaction,
before or after its COMMIT) and started again.

Invariants: every run finishes; a step whose commit landed before a kill never runs again
(the side-effect log holds it once); only the step each run had in flight at a kill may
run twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from stepstone import Store
from tests import _spawn

WORKER = Path(__file__).with_name("crash_threads_worker.py")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _run(
    args: list[str], log: Path, kill_after: tuple[int, float] | None, *, fresh: bool = False
) -> int:
    """Run the worker (forked from the tests' warm server unless ``fresh``); with
    ``kill_after`` (steps, seconds), SIGKILL it that many seconds after its log grew by that
    many steps (unless it ended first). Its exit code."""
    start = _lines(log)
    with _spawn.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        fresh=fresh,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        if kill_after is not None:
            steps, extra = kill_after
            while proc.poll() is None and _lines(log) < start + steps:
                time.sleep(0.002)
            if proc.poll() is None:
                time.sleep(extra)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, -signal.SIGKILL), err
        return proc.returncode


def _committed(db: Path, runs: int) -> dict[int, list[str]]:
    with Store(db=db) as store:
        out = {}
        for r in range(runs):
            state = store.read(f"run-{r}")
            out[r] = [] if state is None else list(state["completed_steps"])
        return out


def _per_run(log: Path, runs: int) -> dict[int, list[int]]:
    per_run: dict[int, list[int]] = {r: [] for r in range(runs)}
    for line in log.read_text().splitlines():
        run, index = map(int, line.split())
        per_run[run].append(index)
    return per_run


def _check_finished(db: Path, log: Path, runs: int, steps: int, kills: int) -> None:
    with Store(db=db) as store:
        for run, indices in _per_run(log, runs).items():
            assert indices == sorted(indices), f"run {run}: a committed step ran again"
            assert set(indices) == set(range(steps)), f"run {run}: a step never ran"
            assert len(indices) - steps <= kills, f"run {run}: more re-runs than kills"
            state = store.read(f"run-{run}")
            assert state["status"] == "done"
            assert len(state["completed_steps"]) == steps


@pytest.mark.crash
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("seed", [6, 7])
def test_sigkill_inside_a_shared_commit_then_every_run_resumes_from_its_last_step(
    tmp_path: Path, when: str, seed: int
) -> None:
    """guarantee 625: the process dies in a transaction that writes several runs' commits,
    before its COMMIT (none of them landed: each of those runs runs that step again) or
    just after it (all of them landed, no thread was told: none runs it again)."""
    rng = random.Random(int(os.environ.get("CRASH_SEED", seed)))
    db, log = tmp_path / "threads.sqlite", tmp_path / "effects.log"
    runs, steps = 8, 60
    kill_at = rng.randint(2, 25)
    args = [str(db), str(log), str(runs), str(steps), str(kill_at), when]
    code = _run(args, log, None, fresh=when == "before" and seed == 6)  # one fresh interpreter
    assert code == -signal.SIGKILL, "the worker never reached a shared commit to die in"
    committed = _committed(db, runs)
    before = Counter(map(tuple, (map(int, line.split()) for line in log.read_text().splitlines())))
    assert _run([str(db), str(log), str(runs), str(steps)], log, None) == 0
    ran = Counter(map(tuple, (map(int, line.split()) for line in log.read_text().splitlines())))
    for run in range(runs):
        done = {int(name[1:]) for name in committed[run]}
        assert done == set(range(len(done))), f"run {run}: committed steps with a gap"
        for index in range(steps):
            times = ran[(run, index)]
            if index in done:  # landed before the kill: never again
                assert times == before[(run, index)] == 1, (run, index, times)
            elif index == len(done):  # in flight at the kill: at most once more
                assert 1 <= times <= 2, (run, index, times)
            else:
                assert times == 1, (run, index, times)
    _check_finished(db, log, runs, steps, kills=1)


@pytest.mark.crash
@pytest.mark.parametrize("seed", [8, 9])
def test_thread_pool_runs_sigkilled_at_random_points_then_resumed(
    tmp_path: Path, seed: int
) -> None:
    """guarantee 625: eight runs on eight threads, their commits shared, in a subprocess
    SIGKILLed at random points and started again until every run finished."""
    rng = random.Random(int(os.environ.get("CRASH_SEED", seed)))
    db, log = tmp_path / "threads.sqlite", tmp_path / "effects.log"
    runs, steps, kills = 8, 100, 0
    args = [str(db), str(log), str(runs), str(steps)]
    for _attempt in range(40):
        if _run(args, log, (rng.randint(40, 250), rng.uniform(0, 0.05))) == 0:
            break
        kills += 1
    else:
        pytest.fail("the runs never finished")
    assert kills >= 2, "the test did not crash the runs often enough to mean anything"
    _check_finished(db, log, runs, steps, kills)
