"""Submitted workflows run by workers on SQLite and PostgreSQL: found by import path,
result envelopes, errors, and a worker SIGKILLed mid-run (guarantee 484)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import RunHandle, Store, Worker
from tests import _spawn
from tests.engines.workflow.targets import batch, broken, counts, dies_once

ROOT = Path(__file__).resolve().parents[3]


WHERE: dict[int, list[str]] = {}  # the worker CLI's store options, by store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        with Store(db=tmp_path / "q.sqlite") as s:
            WHERE[id(s)] = ["--db", str(tmp_path / "q.sqlite")]
            yield s
        return
    url = request.getfixturevalue("pg_url")
    with Store(url=url) as s:
        WHERE[id(s)] = ["--url", url]
        s.setup()
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
        for key in s.keys():
            s.delete(key)
        yield s


def test_a_submitted_workflow_runs_on_a_worker_and_returns_its_value(
    store: Store, tmp_path: Path
) -> None:
    # guarantee 484
    log = str(tmp_path / "log")
    handle = batch.using(store=store, key="b-1", queue="wf").submit(log, 3)
    assert isinstance(handle, RunHandle) and handle.key == "b-1"
    assert Worker(store, queues=["wf"]).run(until_idle=True) == 1
    env = handle.result(timeout=5)
    assert env.ok and env.payload == ["s0", "s1", "s2"]
    assert store.read("b-1")["status"] == "done"
    assert handle.entry().target == "tests.engines.workflow.targets:batch"


def test_a_workflow_that_raises_ends_its_entry_failed_with_the_error(
    store: Store, tmp_path: Path
) -> None:
    # guarantee 484
    log = str(tmp_path / "log")
    handle = broken.using(store=store, queue="wf").submit(log)
    Worker(store, queues=["wf"]).run(until_idle=True)
    env = handle.result(timeout=5)
    assert not env.ok and env.error is not None
    assert env.error.type == "LookupError" and "no such item" in env.error.message
    assert handle.status() == "failed"
    assert store.read(handle.key)["status"] == "failed"


def _start_worker(store: Store, tmp_path: Path, *args: str) -> _spawn.Process:
    """``stepstone worker`` in a process of its own, forked from the tests' warm server."""
    where = WHERE[id(store)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return _spawn.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            *where,
            "--queue",
            "wf",
            "--poll-interval",
            "0.05",
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_worker_sigkilled_mid_run_is_taken_over_and_no_committed_step_reruns(
    store: Store, tmp_path: Path
) -> None:
    # guarantee 484
    log = str(tmp_path / "log")
    handle = dies_once.using(store=store, key="d-1", queue="wf").submit(log)
    first = _start_worker(store, tmp_path, "--lease-seconds", "60")
    out, _ = first.communicate(timeout=120)
    assert first.returncode == -signal.SIGKILL, out
    assert counts(log) == {"before": [first.pid]}
    second = _start_worker(store, tmp_path, "--until-idle", "--lease-seconds", "60")
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    env = handle.result(timeout=5)
    assert env.ok, env.error
    assert env.payload == ["before", "survived 2", "after"]
    ran = counts(log)
    assert ran == {"before": [first.pid], "die_once": [second.pid], "after": [second.pid]}
    deadline = time.monotonic() + 5
    while handle.status() != "done" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.entry().attempts == 2
