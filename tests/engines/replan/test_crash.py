"""Crash tests: a ReplanEngine run in a real subprocess, SIGKILLed inside its rounds
(while several parallel tasks are in flight), resumed each time by a new process.

Invariants checked from the side-effect log and the record read after every kill:
* a task whose outcome was committed before a kill never starts again;
* a round whose planner answer was committed before a kill is never planned again, so
  the planner runs once per committed round (plus once per kill that landed inside it);
* the run finishes with every task's result, in a new process each time.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from tests import _spawn

WORKER = Path(__file__).with_name("crash_worker.py")
ROUNDS, PARALLEL = 3, 4
ITEMS = [f"{r}.{i}" for r in range(1, ROUNDS + 1) for i in [*map(str, range(PARALLEL)), "s"]]


def _read(where: str) -> dict[str, Any] | None:
    store = Store(url=where) if "://" in where else Store(db=where)
    with store:
        record: dict[str, Any] | None = store.read("crash-replan")
        return record


def _committed(record: dict[str, Any] | None) -> tuple[int, set[str]]:
    """Rounds planned and task items with an outcome, per the record."""
    if record is None:
        return 0, set()
    items = {t["kwargs"]["item"] for r in record["rounds"] for t in r["tasks"] if "result" in t}
    return record["round"], items


def _wait_for_lines(proc: _spawn.Process, log: Path, target: int) -> bool:
    """Wait until ``log`` has ``target`` lines; False when the process exited first."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= target:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    pytest.fail("the worker made no progress in 180 s")


def _crash_and_resume(
    where: str, log: Path, seed: int, step: tuple[int, int] = (1, 5), *, fresh: bool = False
) -> tuple[int, int]:
    """Kill a worker (forked from the tests' warm server; with ``fresh``, the first one is a
    fresh interpreter) after every
    ``step`` (random in that range) new log lines; returns (kills, kills that landed inside
    a round)."""
    rng = random.Random(seed)
    snapshots: dict[str, tuple[int, set[str]]] = {}  # killed attempt -> committed after it
    mid_round_kills = 0
    for attempt in range(80):
        name = f"a{attempt}"
        with _spawn.Popen(
            [sys.executable, str(WORKER), where, str(log), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            fresh=fresh and attempt == 0,
        ) as proc:
            lines = len(log.read_text().splitlines()) if log.exists() else 0
            if _wait_for_lines(proc, log, lines + rng.randint(*step)):
                time.sleep(rng.uniform(0.0, 0.05))
                proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=180)
            if proc.returncode == 0:
                break
            assert proc.returncode == -signal.SIGKILL, err
        record = _read(where)
        snapshots[name] = _committed(record)
        if record is not None and record["rounds"]:
            last = record["rounds"][-1]["tasks"]
            if any("result" in t for t in last) and any(t.get("pending") for t in last):
                mid_round_kills += 1
    else:
        pytest.fail("the run never finished")
    assert len(snapshots) >= 3, "the test did not crash the run often enough to mean anything"
    assert mid_round_kills >= 1, "no kill landed inside a round"
    expected = ",".join(f"R{item}" for item in ITEMS)
    assert out.strip() == expected
    record = _read(where)
    assert record is not None and record["status"] == "done"
    assert record["final_answer"] == expected and record["round"] == ROUNDS + 1

    events = [line.split() for line in log.read_text().splitlines()]
    order = [name for name in dict.fromkeys(e[2] for e in events)]
    for i, killed in enumerate(order):
        if killed not in snapshots:
            continue
        rounds, items = snapshots[killed]
        for kind, what, later in events:
            if later not in order[i + 1 :]:
                continue
            # guarantee 191: a committed task never runs again
            assert not (kind == "start" and what in items), f"{what} re-ran in {later}"
            # guarantee 190: a committed round is never planned again
            assert not (kind == "plan" and int(what) <= rounds), f"round {what} re-planned"
    for item in ITEMS:
        starts = [e[2] for e in events if e[:2] == ["start", item]]
        assert starts and all(a in snapshots for a in starts[:-1]), (item, starts)
    for rnd in range(1, ROUNDS + 2):
        calls = [e[2] for e in events if e[:2] == ["plan", str(rnd)]]
        assert calls and all(a in snapshots for a in calls[:-1]), (rnd, calls)
    return len(snapshots), mid_round_kills


@pytest.mark.crash
def test_sigkill_inside_rounds_then_resume_sqlite(tmp_path: Path) -> None:
    # guarantee 190, 191, 198
    db = str(tmp_path / "replan.sqlite")
    _crash_and_resume(db, tmp_path / "effects.log", seed=11, fresh=True)


@pytest.mark.crash
@pytest.mark.postgres
def test_sigkill_inside_rounds_then_resume_postgres(tmp_path: Path, pg_url: str) -> None:
    # guarantee 190, 191, 198
    # Fewer, later kills: each new process pays for its first connection to the server.
    _crash_and_resume(pg_url, tmp_path / "effects.log", seed=12, step=(3, 9))
