"""Submitting from a script run with ``python script.py``: the target a run is queued under,
and a worker in the same process, never import (and so run) the script a second time."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

MODULE = """
from stepstone import Plan, Step


def up(task: str) -> str:
    return task.upper()


plan = Plan(Step(up))
"""

IMPORTING = """
from stepstone import Store
from qmod import plan

store = Store(db="q.sqlite")
plan.submit("o1", store=store, queue="q")
"""

INLINE = """
from stepstone import Plan, Step, Store, Worker


def fetch(order: str) -> dict:
    return {"order": order}


plan = Plan(Step(fetch))
store = Store(db="inline.sqlite")
handle = plan.submit("order-001", store=store, queue="orders")
Worker(store, queues=["orders"]).run(until_idle=True)
print(handle.status(), handle.result(timeout=30).payload["order"])
"""


def _script(tmp_path: Path, name: str, code: str) -> str:
    (tmp_path / name).write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _entries(db: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT target, status FROM stepstone_queue ORDER BY seq").fetchall()
    finally:
        con.close()


def test_a_plan_imported_by_a_script_is_queued_under_its_module(tmp_path: Path) -> None:
    # guarantee 230: workers import qmod, not the script that submitted
    (tmp_path / "qmod.py").write_text(MODULE, encoding="utf-8")
    _script(tmp_path, "submitter.py", IMPORTING)
    assert _entries(tmp_path / "q.sqlite") == [("qmod:plan", "queued")]


def test_a_worker_in_the_submitting_script_runs_its_plan_once(tmp_path: Path) -> None:
    # guarantee 230: the script's own plan is taken from the running script, which is not
    # imported again (that would submit again and start a worker inside the worker)
    assert _script(tmp_path, "inline.py", INLINE).split() == ["done", "order-001"]
    assert _entries(tmp_path / "inline.sqlite") == [("inline:plan", "done")]
