"""Ownership is decided by the database: a live run is never taken over, not even by
another thread of the process that owns it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Store
from stepstone.exceptions import ConcurrentPlanRunError, ConcurrentRunError
from tests.durable.ownership_worker import build_plan

WORKER = Path(__file__).with_name("ownership_worker.py")
ROUNDS = 30
THREADS = 8


def _dead_runs(url: str, prefix: str, n: int) -> None:
    """N runs claimed by a real process, which is then SIGKILLed mid-step."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), url, prefix, str(n)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "READY", f"worker said {line!r}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()


def _race(url: str, tag: str) -> None:
    prefix = f"own-{tag}-"
    _dead_runs(url, prefix, ROUNDS)
    store = Store(url=url)
    runs: Counter[str] = Counter()
    lock = threading.Lock()
    refused: Counter[str] = Counter()

    def first(payload: Any) -> Any:
        return payload

    try:
        for i in range(ROUNDS):
            key = f"{prefix}{i}"
            barrier = threading.Barrier(THREADS)

            def counted(payload: Any, key: str = key) -> Any:
                with lock:
                    runs[key] += 1
                return first(payload)

            def contender(
                key: str = key, counted: Any = counted, barrier: threading.Barrier = barrier
            ) -> None:
                agent = Agent(engine=build_plan(store, key, counted))
                barrier.wait(timeout=60)
                try:
                    env = agent("go")
                except ConcurrentPlanRunError:
                    with lock:
                        refused[key] += 1
                    return
                assert env.ok, env.error

            threads = [threading.Thread(target=contender) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert store.read(key)["status"] == "done"
        twice = {k: n for k, n in runs.items() if n > 1}
        assert not twice, f"first step ran more than once for {twice} of {ROUNDS} rounds"
        assert sum(runs.values()) == ROUNDS
    finally:
        store.close()


def test_threads_of_one_process_never_steal_a_live_run_sqlite(tmp_path: Path) -> None:
    # guarantee 121
    _race(f"sqlite:///{tmp_path / 'own.sqlite'}", "sqlite")


@pytest.mark.postgres
def test_threads_of_one_process_never_steal_a_live_run_postgres(pg_url: str) -> None:
    # guarantee 121
    _race(pg_url, "pg")


def test_a_run_released_before_a_terminal_status_is_resumable_at_once(tmp_path: Path) -> None:
    # guarantee 121, 122
    from concurrent.futures import ThreadPoolExecutor

    from stepstone.durable import claim_run

    with Store(db=tmp_path / "rel.sqlite", lease_seconds=300) as store:
        held = claim_run(store, "k", kind="test", resume=False, first_step="a")
        assert held.run is not None
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(
                claim_run, store, "k", kind="test", resume=True, first_step="a"
            ).exception(timeout=60)
            assert isinstance(other, ConcurrentRunError)  # same process, live: refused
            held.run.release()
            head = store.backend.run_get("k")
            assert head is not None and head.status == "claimed" and head.lease_until == 0.0
            taken = pool.submit(
                claim_run, store, "k", kind="test", resume=True, first_step="a"
            ).result(timeout=60)
        assert taken.outcome == "resumed" and taken.run is not None
        assert taken.head.run_uid != held.head.run_uid
        taken.run.release()


def test_a_commit_of_a_value_that_is_not_json_names_it_and_writes_nothing(
    tmp_path: Path,
) -> None:
    # guarantee 123
    import datetime

    from stepstone.durable import claim_run
    from stepstone.exceptions import SerializationError

    with Store(db=tmp_path / "enc.sqlite") as store:
        claimed = claim_run(store, "k", kind="test", resume=False, first_step="a")
        assert claimed.run is not None
        with pytest.raises(SerializationError, match=r"'k'.*writes\['w'\]"):
            claimed.run.commit_sync(
                status="running", next_step="b", writes=[("w", datetime.date(2026, 1, 1))]
            )
        assert store.read("w") is None and store.backend.run_get("k") == claimed.head
        claimed.run.release()
