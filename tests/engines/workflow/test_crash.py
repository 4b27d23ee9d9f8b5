"""Workflows in real subprocesses SIGKILLed between steps, inside a step, inside a child
workflow and inside ``asyncio.gather``, then resumed in a new process (guarantees 471,
477, 478, 483).

After every kill, the steps whose outcome the journal holds are noted; no later process may
run them again (each committed step ran once, counted in the log the steps append to).
Only a step in flight at a kill, or one that had returned and whose outcome was not yet
committed, may run twice. The final result equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.durable import list_runs, read_run
from tests import _spawn
from tests.engines.workflow.crash_worker import expected

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[3]
N = 9


def _committed(db: Path) -> set[str]:
    """Labels of the steps whose outcome is committed, in every run of the store."""
    out: set[str] = set()
    with Store(db=db) as store:
        for head in list_runs(store):
            found = read_run(store, head.key)
            assert found is not None
            for row in found[1]:
                if row.kind != "ops":
                    continue
                for kind, _pos, data in json.loads(row.data):
                    if kind == "outcome" and data.get("name") == "work":
                        out.add(data["value"]["label"])
    return out


def _log(path: Path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def _run(
    db: Path, log: Path, kill_at: str = "", timeout: float = 120, *, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """The worker run to its end, forked from the tests' warm server unless ``fresh``."""
    args = [sys.executable, str(WORKER), str(db), str(log), str(N)]
    if kill_at:
        args.append(kill_at)
    return _spawn.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, fresh=fresh)


def _check(db: Path, log: Path, snapshots: list[tuple[int, set[str]]], kills: int) -> None:
    labels = _log(log)
    for seen, committed in snapshots:
        again = [label for label in labels[seen:] if label in committed]
        assert not again, f"committed steps ran again after a kill: {again}"
    want = expected(N)
    assert sorted(set(labels)) == sorted(want)
    # at most the steps in flight at each kill run again: two, inside asyncio.gather
    assert len(labels) - len(want) <= 2 * kills, "a step ran more than once per kill"
    assert all(labels.count(label) <= 1 + kills for label in want)
    with Store(db=db) as store:
        view = store.read("crash-run")
        assert view["status"] == "done"
        assert view["result"] == want


@pytest.mark.crash
@pytest.mark.parametrize(
    "kill_at",
    [
        "between:s2",  # in the body, after a step returned, before the next one
        "inside:s4",  # inside a step, after its effect
        "inside:c3.1",  # inside a step of a child workflow
        "between:c3.0",  # in a child's body
        "inside:g1b",  # inside a step run by asyncio.gather
        "between:g5a",  # after one gathered step returned, while the other runs
    ],
)
def test_sigkill_at_a_chosen_point_then_resume(tmp_path: Path, kill_at: str) -> None:
    # guarantee 471, 478, 483
    db, log = tmp_path / "wf.sqlite", tmp_path / "effects.log"
    died = _run(db, log, kill_at, fresh=kill_at == "inside:s4")  # one fresh interpreter
    assert died.returncode == -signal.SIGKILL, died.stderr
    snapshots = [(len(_log(log)), _committed(db))]
    label = kill_at.split(":")[1]
    assert label in _log(log)
    done = _run(db, log)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected(N)
    _check(db, log, snapshots, kills=1)
    if kill_at.startswith("inside"):
        # the step in flight ran again after the resume (in doubt, rerun), once
        assert _log(log).count(label) == 2


def _killed_after(db: Path, log: Path, steps: int, extra: float) -> bool:
    start = len(_log(log))
    args = [sys.executable, str(WORKER), str(db), str(log), str(N)]
    with _spawn.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    ) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()
        while proc.poll() is None and len(_log(log)) < start + steps:
            time.sleep(0.002)
        if proc.poll() is None:
            time.sleep(extra)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            return True
        _, err = proc.communicate()
        assert proc.returncode == 0, err
        return False


@pytest.mark.crash
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_random_points_then_resume(tmp_path: Path, seed: int) -> None:
    # guarantee 471, 478
    rng = random.Random(seed)
    db, log = tmp_path / "wf.sqlite", tmp_path / "effects.log"
    snapshots: list[tuple[int, set[str]]] = []
    kills = 0
    for _ in range(60):
        if not _killed_after(db, log, rng.randint(1, 4), rng.uniform(0.0, 0.03)):
            break
        kills += 1
        snapshots.append((len(_log(log)), _committed(db)))
    else:
        pytest.fail("the run never finished")
    assert kills >= 3, "the test did not crash the run often enough to mean anything"
    _check(db, log, snapshots, kills)
