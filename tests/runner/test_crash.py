"""SIGKILL crash tests: a durable agent run killed at random points, resumed in a new process.

Each tool call's side effect happens once unless the kill landed inside that very call (it
started and its outcome was not committed), and the model is asked at most once per
committed turn. The kill points are chosen by line counts of the effect log (deterministic
seeds), not by wall-clock time, so a loaded machine changes nothing.
"""

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
from stepstone.durable._journal_format import read_entries
from tests import _spawn

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]
EXPECTED_CALLS = {f"t{t}{s}" for t in range(5) for s in "ab"}


def _lines(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line.strip()]


def _committed(where: str) -> tuple[set[str], set[int]]:
    """Tool calls and model turns whose outcome is committed, over every agent run."""
    store = Store(url=where) if "://" in where else Store(db=where)
    tools: set[str] = set()
    turns: set[int] = set()
    try:
        for head in store.backend.run_list(None):
            if head.kind != "agent":
                continue
            for row in read_entries(store.backend.run_journal(head.key)):
                if row.kind != "outcome":
                    continue
                data = row.data
                if data["kind"] == "model":
                    turns.add(data["turn"])
                else:
                    tools.add(f"t{data['turn']}{'ab'[data['index']]}")
    finally:
        store.close()
    return tools, turns


def _run_until_done(
    mode: str, where: str, log: Path, seed: int, max_kills: int, *, fresh: bool = False
) -> int:
    """Run crash_worker.py until it finishes, SIGKILLed up to ``max_kills`` times (forked
    from the warm server unless ``fresh``)."""
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    allowed_tools: Counter[str] = Counter()
    allowed_turns: Counter[int] = Counter()
    kills = 0
    for _attempt in range(max_kills + 3):
        before = len(_lines(log))
        target = before + rng.randint(1, 5)
        kill = kills < max_kills
        proc = _spawn.Popen(
            [sys.executable, str(WORKER), mode, where, str(log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            fresh=fresh,
        )
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if kill and len(_lines(log)) >= target:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:
            assert b"DONE all done" in out, err.decode()
            break
        assert proc.returncode == -signal.SIGKILL, err.decode()
        kills += 1
        pid = str(proc.pid)
        tools, turns = _committed(where)
        for parts in _lines(log)[before:]:
            if parts[0] == "start" and parts[2] == pid and parts[1] not in tools:
                allowed_tools[parts[1]] += 1  # the kill landed inside this call
            if parts[0] == "model" and parts[2] == pid and int(parts[1]) not in turns:
                allowed_turns[int(parts[1])] += 1
    else:
        pytest.fail(f"the {mode} run never finished")
    lines = _lines(log)
    done = Counter(p[1] for p in lines if p[0] == "done")
    assert set(done) == EXPECTED_CALLS
    for name, n in done.items():
        assert n <= 1 + allowed_tools[name], (name, n, allowed_tools, lines)
    asked = Counter(int(p[1]) for p in lines if p[0] == "model")
    assert set(asked) == set(range(6))
    for turn, n in asked.items():
        assert n <= 1 + allowed_turns[turn], (turn, n, allowed_turns, lines)
    keys = {p[1]: set() for p in lines if p[0] == "start"}
    for p in lines:
        if p[0] == "start":
            keys[p[1]].add(p[3])
    assert all(len(k) == 1 for k in keys.values()), keys  # one idempotency key per call
    return kills


@pytest.mark.crash
@pytest.mark.parametrize(
    ("mode", "seed"), [("runner", 11), ("runner-async", 12), ("plan", 13), ("graph", 14)]
)
def test_sigkill_at_random_points_then_resume_sqlite(tmp_path: Path, mode: str, seed: int) -> None:
    # guarantee 102, 104, 160, 161, 166, 167, 176
    # the runner's kills hit fresh interpreters, the others forked ones
    db = str(tmp_path / "c.sqlite")
    kills = _run_until_done(mode, db, tmp_path / "e.log", seed, 5, fresh=mode == "runner")
    assert kills >= 2  # a kill may land after the last line: then the run just finishes


@pytest.mark.crash
@pytest.mark.postgres
@pytest.mark.parametrize(("mode", "seed"), [("runner", 21), ("plan", 22)])
def test_sigkill_at_random_points_then_resume_postgres(
    tmp_path: Path, pg_url: str, mode: str, seed: int
) -> None:
    # guarantee 102, 104, 160, 161, 184
    with Store(url=pg_url) as store:  # one database per module: start from a clean one
        for key in store.keys():
            store.delete(key)
    kills = _run_until_done(mode, pg_url, tmp_path / "e.log", seed, 4)
    assert kills >= 2
