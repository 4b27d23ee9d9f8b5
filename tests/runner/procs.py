"""Running agent_worker.py in its own process: start it, kill it with SIGKILL at a chosen
point, read what it printed and what it committed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone.durable._journal_format import read_entries
from stepstone.store import JournalRow
from stepstone.testing import LoopbackServer
from tests import _spawn

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("agent_worker.py")


def spawn(
    mode: str, db: Path, server: LoopbackServer, *, fresh: bool = False, **opts: Any
) -> _spawn.Process:
    """agent_worker.py in a new process (see its docstring), forked from the warm server
    unless ``fresh``."""
    return _spawn.Popen(
        [sys.executable, str(WORKER), mode, str(db), server.base_url, json.dumps(opts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        fresh=fresh,
    )


def run_worker(mode: str, db: Path, server: LoopbackServer, **opts: Any) -> dict[str, Any]:
    """agent_worker.py run to its end in a new process: what it printed."""
    return result_of(spawn(mode, db, server, **opts))


def result_of(proc: _spawn.Process) -> dict[str, Any]:
    """What the worker printed, once it has ended on its own."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def kill_when(proc: _spawn.Process, ready: Callable[[], bool]) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (it must hold within two minutes)."""
    deadline = time.monotonic() + 120
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the worker ended before the kill point: {out} {err}")
        assert time.monotonic() < deadline, "the worker never reached the kill point"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL


def turn_of(body: dict[str, Any]) -> int:
    """The turn a model request asks for: the assistant messages before it."""
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def committed(db: Path) -> set[str]:
    """The committed effect entries, as ``kind position`` (``outcome model:0:0``...)."""
    conn = sqlite3.connect(db)
    try:
        found = conn.execute(
            "SELECT run_key, seq, kind, name, data FROM stepstone_journal ORDER BY run_key, seq"
        ).fetchall()
    finally:
        conn.close()
    runs: dict[str, list[JournalRow]] = {}
    for key, *row in found:
        runs.setdefault(key, []).append(JournalRow(*row))
    return {
        f"{e.kind} {e.name}"
        for rows in runs.values()
        for e in read_entries(rows)
        if e.kind in ("intent", "outcome")
    }


def ledger(db: Path) -> list[str]:
    path = Path(f"{db}.ledger")
    return path.read_text().split() if path.exists() else []
