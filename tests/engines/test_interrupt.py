"""Ctrl-C during a sync call's step: the step finishes and commits, the run stops there
and raises KeyboardInterrupt, and a resume runs only the steps after it (guarantee 345).
During a parallel band, the branches running in worker threads finish and are journaled
too, so the resume runs none of them again (guarantee 347).

Real processes and a real SIGINT: each step prints its name before it sleeps, and the
test sends the signal while the third step (or the band's branches) runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from stepstone import Agent, Plan, Step, Store
from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from stepstone import Agent, Plan, Step, Store
from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

def work(name):
    def step(payload):
        sys.stdout.write(name + "\\n")  # one write: band branches print from threads
        sys.stdout.flush()
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
    if sys.argv[1] in ("plan", "band"):
        band = sys.argv[1] == "band"  # s1, s2 and s3 run as one parallel band
        steps = [Step(work(n), parallel=band and n in ("s1", "s2", "s3")) for n in names]
        plan = Plan(*steps, store=Store(db=db), checkpoint_key="job", resume=True)
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


def _run(kind: str, db: Path, interrupt_at: str | set[str] | None) -> list[str]:
    """The script's output lines; SIGINT once it printed ``interrupt_at`` (every name of
    a set)."""
    wanted = {interrupt_at} if isinstance(interrupt_at, str) else interrupt_at
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
            while wanted is not None and not wanted <= set(lines):
                line = proc.stdout.readline()
                assert line, f"ended early: {lines} {proc.stderr.read() if proc.stderr else ''}"
                lines.append(line.strip())
            if wanted is not None:
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


def test_ctrl_c_during_a_band_keeps_the_branches_that_were_running(tmp_path: Path) -> None:
    """The band's branches run in worker threads (a thread cannot be stopped): Ctrl-C
    waits for them, journals each one's result, then stops before the next step; the
    resume runs none of them again (guarantee 347)."""
    db = tmp_path / "runs.sqlite"
    first = _run("band", db, interrupt_at={"s1", "s2", "s3"})
    assert first[0] == "s0" and sorted(first[1:4]) == ["s1", "s2", "s3"], first
    assert first[4:] == ["KeyboardInterrupt"], first  # s4 never started
    second = _run("band", db, interrupt_at=None)
    assert second[:2] == ["s4", "s5"] and second[2].startswith("result"), second


# -- a run awaited on the caller's loop, cancelled while a step's thread runs ------------
def _blocking_steps(ran: list[str], started: threading.Event) -> list[Any]:
    def work(name: str) -> Any:
        def step(payload: Any) -> str:
            ran.append(name)
            started.set()
            time.sleep(0.3)  # in a worker thread: the run is awaited on a shared loop
            return name

        step.__name__ = name
        return step

    return [work(f"s{i}") for i in range(4)]


async def _cancel_when_started(task: asyncio.Task[Any], started: threading.Event) -> None:
    while not started.is_set():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_async_plan_run_commits_the_step_its_thread_finished(
    tmp_path: Path,
) -> None:
    """Guarantee 347: the cancellation waits for the step running in a worker thread, the
    step commits, the run stops before the next one, and a resume starts after it."""
    store = Store(db=tmp_path / "runs.sqlite")
    ran: list[str] = []
    started = threading.Event()
    fns = _blocking_steps(ran, started)
    plan = Plan(*[Step(f) for f in fns], store=store, checkpoint_key="job", resume=True)
    await _cancel_when_started(asyncio.ensure_future(Agent(engine=plan).run("go")), started)
    assert ran == ["s0"]
    head = store.backend.run_get("job")
    assert head is not None and head.next_step == "s1"  # s0 committed, s1 never started
    env = await Agent(engine=plan).run("go")
    assert env.ok and env.payload == "s3"
    assert ran == ["s0", "s1", "s2", "s3"]  # s0 ran once


class _Seen(State):
    seen: list[str] = Field(default_factory=list)


async def test_a_cancelled_async_graph_run_commits_the_node_its_thread_finished(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    started = threading.Event()
    fns = _blocking_steps(ran, started)
    builder = GraphBuilder(_Seen)
    names = [f.__name__ for f in fns]
    for i, (name, fn) in enumerate(zip(names, fns, strict=True)):

        def node(state: _Seen, fn: Any = fn, name: str = name) -> dict[str, Any]:
            fn(None)
            return {"seen": [*state.seen, name]}

        builder = builder.add_node(name, node)
        builder = builder.add_edge(name, names[i + 1] if i + 1 < len(names) else END)
    cp = SQLiteCheckpointer(str(tmp_path / "graph.sqlite"))
    graph = builder.set_entry("s0").with_checkpointer(cp).compile()
    task = asyncio.ensure_future(graph.ainvoke(_Seen(), correlation_id="job"))
    await _cancel_when_started(task, started)
    assert ran == ["s0"]
    attempts = cp.list()
    final = await graph.ainvoke(resume_invocation=attempts[-1].invocation_id)
    assert final.seen == names
    assert ran == names  # s0 ran once: its update was committed before the cancellation
