"""Two processes resuming one run: the second is refused while the first is alive."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import _spawn

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import os, sys, time
from pathlib import Path
from stepstone import Agent, ConcurrentRunError, Runner, Store, tool
from stepstone.testing import FunctionModel, call

db, gate, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

@tool
def slow(x: int) -> str:
    '''Wait for the gate file.'''
    gate.with_suffix(".entered").write_text(str(os.getpid()))
    while not gate.exists():
        time.sleep(0.01)
    return "ok"

replies = {0: call("slow", x=1), 1: "done"}
agent = Agent(model=FunctionModel(lambda r: replies[r.turn]), tools=[slow])
with Store(db=db) as store:
    runner = Runner(store=store)
    try:
        if mode == "run":
            result = runner.run_sync(agent, user_message="go", run_id="r", thread_id="t")
        else:
            result = runner.resume_sync(agent, run_id="r", thread_id="t")
    except ConcurrentRunError as exc:
        print("REFUSED", exc)
        sys.exit(3)
print("DONE", result.state)
"""


@pytest.mark.crash
def test_second_process_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    # guarantee 165
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db, gate = str(tmp_path / "r.sqlite"), tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = _spawn.Popen(  # both forked from the tests' warm server
        [sys.executable, str(script), db, str(gate), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not gate.with_suffix(".entered").exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = _spawn.run(
        [sys.executable, str(script), db, str(gate), "resume"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert second.returncode == 3, second.stderr
    assert "is owned by live run" in second.stdout
    gate.write_text("open")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert out.strip() == "DONE completed"
