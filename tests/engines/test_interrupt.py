"""Ctrl-C during a sync call's step: the step finishes and commits, the run stops there
and raises KeyboardInterrupt, and a resume runs only the steps after it (guarantee 345).

Real processes and a real SIGINT: each step prints its name before it sleeps, and the
test sends the signal while the third step runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from stepstone import Agent, Plan, Step, Store
from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

def work(name):
    def step(payload):
        print(name, flush=True)
        time.sleep(0.4)
        return name
    step.__name__ = name
    return step

class S(State):
    seen: list[str] = []

def node(name):
    def run(state):
        work(name)(None)
        return {"seen": [*state.seen, name]}
    run.__name__ = name
    return run

names = [f"s{i}" for i in range(6)]
db = sys.argv[2]
try:
    if sys.argv[1] == "plan":
        plan = Plan(*[Step(work(n)) for n in names], store=Store(db=db),
                    checkpoint_key="job", resume=True)
        print("result", Agent(engine=plan)("go").payload, flush=True)
    else:
        builder = GraphBuilder(S)
        for i, n in enumerate(names):
            builder = builder.add_node(n, node(n))
            builder = builder.add_edge(n, names[i + 1] if i + 1 < len(names) else END)
        cp = SQLiteCheckpointer(db)
        graph = builder.set_entry(names[0]).with_checkpointer(cp).compile()
        attempts = cp.list()
        final = (graph.invoke(resume_invocation=attempts[-1].invocation_id) if attempts
                 else graph.invoke(S(), correlation_id="job"))
        print("result", final.seen, flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
"""


def _run(kind: str, db: Path, interrupt_at: str | None) -> list[str]:
    with subprocess.Popen(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(SCRIPT), kind, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    ) as proc:
        try:
            assert proc.stdout is not None
            lines: list[str] = []
            while interrupt_at is not None and interrupt_at not in lines:
                line = proc.stdout.readline()
                assert line, f"ended early: {lines} {proc.stderr.read() if proc.stderr else ''}"
                lines.append(line.strip())
            if interrupt_at is not None:
                proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert err == "", err
    return lines + out.splitlines()


@pytest.mark.parametrize("kind", ["plan", "graph"])
def test_ctrl_c_stops_the_run_after_the_step_it_interrupts(kind: str, tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    first = _run(kind, db, interrupt_at="s2")
    assert first == ["s0", "s1", "s2", "KeyboardInterrupt"]  # s3 never started
    second = _run(kind, db, interrupt_at=None)
    assert second[:3] == ["s3", "s4", "s5"] and second[3].startswith("result"), second
    if kind == "graph":
        assert second[3] == "result ['s0', 's1', 's2', 's3', 's4', 's5']"
