"""`stepstone migrate --dry-run` against the current Plan or graph code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

PLANS = """
from stepstone import Plan, Step

def a(p): return "a"
def b(p): return "b"
def c(p): raise ValueError("c broke")
def d(p): return "d"

def v1(store, key):
    return Plan(Step(a), Step(b), Step(c), store=store, checkpoint_key=key)

current = Plan(Step(a), Step(b), Step(d))          # c was removed, d added
"""

GRAPHS = """
from typing import ClassVar
from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

class V1(State):
    schema_version: ClassVar[str] = "v1"
    n: int = 0

class V2(State):
    schema_version: ClassVar[str] = "v2"
    n: int = 0
    label: str

class V3(State):
    schema_version: ClassVar[str] = "v3"
    n: int = 0

def bump(state):
    return {"n": state.n + 1}

def build(cls, path, migrate=False):
    builder = GraphBuilder(cls).add_node("bump", bump).add_edge("bump", END).set_entry("bump")
    if migrate:
        builder = builder.with_state_migration("v1", "v2", lambda s: {**s, "label": "x"})
    return builder.with_checkpointer(SQLiteCheckpointer(path)).compile()

def with_chain():
    return build(V2, "unused.sqlite", migrate=True)

def without_chain():
    return build(V3, "unused.sqlite")
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "migrate", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(tmp_path)},
    )


def test_migrate_dry_run_for_plans_and_graphs(tmp_path: Path) -> None:
    # guarantee 275, 285, 286
    (tmp_path / "plans.py").write_text(textwrap.dedent(PLANS))
    (tmp_path / "graphs.py").write_text(textwrap.dedent(GRAPHS))
    db = tmp_path / "runs.sqlite"
    setup = f"""
import sys; sys.path.insert(0, {str(tmp_path)!r})
from stepstone import Agent, Store
import plans, graphs
store = Store(db={str(db)!r})
Agent(engine=plans.v1(store, "broken"))("go")           # failed at c
Agent(engine=plans.Plan(plans.Step(plans.a), plans.Step(plans.b), plans.Step(plans.d),
      store=store, checkpoint_key="fine"))("go")         # the current plan, done
Agent(engine=plans.Plan(plans.Step(plans.a), store=store, checkpoint_key="older"))("go")
graphs.build(graphs.V1, {str(db)!r}).invoke(graphs.V1(), correlation_id="g1")
"""
    done = subprocess.run(
        [sys.executable, "-c", setup], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr

    out = _cli(tmp_path, "--target", "plans:current", "--dry-run", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    verdicts = {r["key"]: r["verdict"] for r in json.loads(out.stdout)}
    # guarantee 426: what a resume of each would do (a done run: nothing; a changed plan:
    # refused, as on_plan_change="fail" refuses it)
    assert verdicts == {"broken": "stale", "fine": "done", "older": "stale"}

    out = _cli(tmp_path, "--target", "graphs:with_chain", "--dry-run", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["verdict"], r["detail"]) for r in rows] == [
        (
            "done",
            "finished: a resume makes a new record and runs no node (its state migrates v1 -> v2)",
        )
    ]
    out = _cli(tmp_path, "--target", "graphs:without_chain", "--dry-run", "--db", str(db))
    assert out.returncode == 0 and "no chain" in out.stdout

    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    for args, message in (
        (["--target", "broken:f", "--dry-run", "--db", str(db)], "importing 'broken' raised Syn"),
        (["--target", "plans:current", "--db", str(db)], "pass --dry-run"),
        (["--target", "plans", "--dry-run", "--db", str(db)], "use module:attribute"),
        (["--target", "nope:x", "--dry-run", "--db", str(db)], "cannot load 'nope:x'"),
        (["--target", "plans:a", "--dry-run", "--db", str(db)], "function of no arguments"),
        (["--target", "plans:PLANS_NOT", "--dry-run", "--db", str(db)], "cannot load"),
        (["--target", "graphs:V1", "--dry-run", "--db", str(db)], "not a Plan or a compiled"),
    ):
        out = _cli(tmp_path, *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("error: ") and message in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1


PIPELINE = """
import pathlib
from stepstone import Plan, Step

def extract(p):
    with open("calls.log", "a") as f:
        f.write("extract\\n")
    return "rows"

def load(p):
    if not pathlib.Path("fixed").exists():
        raise ValueError("db down")
    return f"loaded {p}"

plan = Plan(Step(extract), Step(load))
"""


def test_resume_command_continues_a_failed_plan(tmp_path: Path) -> None:
    # guarantee 287
    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE))
    db = tmp_path / "runs.sqlite"
    setup = f"""
import os, sys; sys.path.insert(0, {str(tmp_path)!r}); os.chdir({str(tmp_path)!r})
from stepstone import Agent, Plan, Store
import pipeline
Agent(engine=Plan(*pipeline.plan.steps, store=Store(db={str(db)!r}), checkpoint_key="job"))("go")
"""
    done = subprocess.run(
        [sys.executable, "-c", setup], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr

    def resume(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "stepstone.cli",
                "resume",
                "job",
                "--target",
                "pipeline:plan",
                "--db",
                str(db),
                *extra,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(tmp_path)},
        )

    again = resume()
    assert again.returncode == 1
    assert again.stderr == (
        "error: run 'job' stopped again (failed) at 'load': ValueError: db down\n"
    )
    again = resume("--json")  # the JSON says so too, and the exit status agrees
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout)["status"] == "failed"
    (tmp_path / "fixed").touch()
    ok = resume("--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"key": "job", "status": "done", "error": None}
    assert (tmp_path / "calls.log").read_text() == "extract\n"  # never re-run
    from stepstone import Store

    with Store(db=db) as store:
        assert store.read("job")["completed_steps"] == ["extract", "load"]


def test_resume_refuses_a_run_its_target_does_not_run(tmp_path: Path) -> None:
    """guarantee 375: `stepstone resume` of an agent run, or of a graph run with a Plan as
    its target, says what the run is and how to continue it, and changes nothing; before,
    the Plan's refusal advised deleting the agent run with store.delete."""
    from stepstone import Agent, Runner, Store
    from stepstone.testing import FunctionModel

    (tmp_path / "plans.py").write_text(textwrap.dedent(PLANS))
    (tmp_path / "graphs.py").write_text(textwrap.dedent(GRAPHS))
    db = tmp_path / "runs.sqlite"
    graph_db = str(tmp_path / "graph.sqlite")
    setup = f"""
import sys; sys.path.insert(0, {str(tmp_path)!r})
import graphs
graphs.build(graphs.V1, {graph_db!r}).invoke(graphs.V1())
"""
    made = subprocess.run([sys.executable, "-c", setup], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    with Store(db=db) as store:
        agent = Agent(model=FunctionModel(lambda r: "hello"), name="greeter")
        Runner(store=store).run_sync(agent, user_message="hi", run_id="greet", thread_id="t")
        agent_key = store.keys()[0]
        before = store.backend.run_get(agent_key)
    with Store(db=graph_db) as store:
        (graph_key,) = [h.key for h in store.backend.run_list(None)]

    def resume(key: str, where: str) -> subprocess.CompletedProcess[str]:
        args = ["resume", key, "--target", "plans:current", "--db", where]
        return subprocess.run(
            [sys.executable, "-m", "stepstone.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(tmp_path)},
        )

    proc = resume(agent_key, str(db))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"error: run {agent_key!r} is an agent run: `stepstone resume` resumes Plan and graph"
    )
    assert "runner.resume(" in proc.stderr and "store.delete" not in proc.stderr
    with Store(db=db) as store:
        assert store.backend.run_get(agent_key) == before
    proc = resume(graph_key, graph_db)
    assert proc.returncode == 1, proc.stderr
    assert f"run {graph_key!r} is a graph run, but --target 'plans:current' is a Plan" in (
        proc.stderr
    )
    assert "Pass the compiled graph that runs it" in proc.stderr
