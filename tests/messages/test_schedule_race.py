"""Two ``stepstone worker`` processes racing on one per-second schedule for 50 ticks: 50
runs, one per tick (guarantee 511)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from stepstone import Schedule, Store, schedule
from stepstone.durable._queue import queue_backend
from tests import _spawn

ROOT = Path(__file__).resolve().parents[2]
T = "tests.messages.targets:noop_plan"
TICKS = 50


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, list[str]]]:
    if request.param == "sqlite":
        db = tmp_path / "race.sqlite"
        with Store(db=db) as s:
            yield s, ["--db", str(db)]
    else:
        url = request.getfixturevalue("pg_url")
        with Store(url=url) as s:
            s.setup()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE stepstone_queue, stepstone_schedules")
            yield s, ["--url", url]


def _worker(args: list[str]) -> _spawn.Process:
    """``stepstone worker`` in a process of its own, forked from the tests' warm server."""
    return _spawn.Popen(
        [sys.executable, "-m", "stepstone.cli", "worker", *args, "--poll-interval", "0.05"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _tick(run_key: str) -> float:
    return datetime.fromisoformat(run_key.split("@")[1].replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
def test_two_workers_racing_on_a_schedule_for_50_ticks_start_50_runs(
    where: tuple[Store, list[str]],
) -> None:
    # guarantee 511
    store, args = where
    handle = schedule(store, T, cron="* * * * * *", name="race", task="go")
    first = handle.info().next_tick.timestamp()
    workers = [_worker(args), _worker(args)]
    try:
        deadline = time.monotonic() + TICKS + 60
        while time.monotonic() < deadline:
            last = Schedule(store, "race").info().last_tick
            if last is not None and last.timestamp() >= first + TICKS - 1:
                break
            assert all(w.poll() is None for w in workers), "a worker died"
            time.sleep(0.2)
        handle.pause()  # no more ticks: the race is over
        qb = queue_backend(store)
        wait_done = time.monotonic() + 60
        while time.monotonic() < wait_done:
            entries = qb.entries(None, None)
            if all(e.status == "done" for e in entries):
                break
            time.sleep(0.2)
    finally:
        outputs = []
        for w in workers:
            w.send_signal(signal.SIGTERM)
            outputs.append(w.communicate(timeout=60)[0])
    entries = queue_backend(store).entries(None, None)
    in_range = [e for e in entries if first <= _tick(e.run_key) <= first + TICKS - 1]
    ticks = sorted(_tick(e.run_key) for e in in_range)
    assert ticks == [first + i for i in range(TICKS)], outputs  # each tick once
    assert all(e.status == "done" for e in entries), [(e.run_key, e.status) for e in entries]
    assert all(w.returncode == 0 for w in workers), outputs
