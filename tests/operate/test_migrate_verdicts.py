"""guarantee 426: every verdict of ``stepstone migrate --dry-run`` is what ``stepstone
resume`` with the same target then does, on SQLite and PostgreSQL.

Before, a run written by another version of the plan was ``changed`` ("a resume still
works") while the resume failed with StaleCheckpointError, and a done run was
``current``."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from stepstone import Agent
from stepstone.cli import app
from tests.operate._live import SteppedRun
from tests.operate.conftest import open_args

MODULE = "i36b_verdict_plans"

PLANS = """
from pathlib import Path

from stepstone import Plan, Step


def _log(name):
    with open("calls.log", "a") as fh:
        fh.write(name + "\\n")


def a(p):
    _log("a")
    return "a"


def b(p):
    _log("b")
    return "b"


def c(p):
    _log("c")
    if not Path("fixed").exists():
        raise ValueError("c broke")
    return "c"


def d(p):
    _log("d")
    return "d"


def v1(**options):
    return Plan(Step(a), Step(b), Step(c), **options)


same = v1()
added = Plan(Step(a), Step(b), Step(c), Step(d))
added_continue = Plan(Step(a), Step(b), Step(c), Step(d), on_plan_change="continue")
added_restart = Plan(Step(a), Step(b), Step(c), Step(d), on_plan_change="restart")
c_removed = Plan(Step(a), Step(b), Step(d), on_plan_change="continue")
"""

runner = CliRunner()


@pytest.fixture
def plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The application's module, importable as the CLI imports targets (from the current
    directory), and its steps' log."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(PLANS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module(MODULE)
    yield module
    sys.modules.pop(MODULE, None)


def _calls() -> list[str]:
    log = Path("calls.log")
    return log.read_text().split() if log.exists() else []


def _damage(store_args: list[str], key: str) -> None:
    """Make the first step row of ``key`` undecodable, through SQL."""
    sql = "UPDATE stepstone_journal SET data = 'cut' WHERE run_key = {} AND seq = 1"
    if store_args[0] == "--db":
        with sqlite3.connect(store_args[1]) as conn:
            conn.execute(sql.format("?"), (key,))
        conn.close()
    else:
        with psycopg.connect(store_args[1], autocommit=True) as pg:
            pg.execute(sql.format("%s").encode(), (key,))


def test_every_verdict_is_what_the_resume_does(store_args: list[str], plans: Any) -> None:
    with open_args(store_args) as store:
        for key in ("cur", "stale", "cont", "rest", "gone", "broken"):
            Agent(engine=plans.v1(store=store, checkpoint_key=key))("go")  # failed at c
        Path("fixed").touch()
        Agent(engine=plans.v1(store=store, checkpoint_key="fin"))("go")  # done
        _damage(store_args, "broken")
        live = SteppedRun(store, "busy").start()
        assert live.started[0].wait(60)
        try:
            cases = {
                "cur": ("same", "current"),
                "fin": ("same", "done"),
                "stale": ("added", "stale"),
                "cont": ("added_continue", "changed"),
                "rest": ("added_restart", "restarts"),
                "gone": ("c_removed", "stale"),
                "broken": ("same", "corrupt"),
                "busy": ("same", "live"),
            }
            for key, (target, verdict) in cases.items():
                spec = f"{MODULE}:{target}"
                asked = ["migrate", "--dry-run", "--target", spec, "--prefix", key, "--json"]
                said = runner.invoke(app, [*asked, *store_args])
                assert said.exit_code == 0, said.stderr
                (row,) = [r for r in json.loads(said.stdout) if r["key"] == key]
                assert row["verdict"] == verdict, (key, row)
                before = _calls()
                did = runner.invoke(app, ["resume", key, "--target", spec, *store_args])
                ran = _calls()[len(before) :]
                if verdict in ("current", "changed", "restarts"):
                    assert did.exit_code == 0, (key, did.stderr)
                    assert row["runs_steps"] is True and ran, key
                    assert store.backend.run_get(key).status == "done"  # type: ignore[union-attr]
                elif verdict == "done":
                    assert did.exit_code == 0 and ran == [] and not row["runs_steps"]
                else:  # refused: the error the resume gives is the one the verdict names
                    assert did.exit_code == 1 and ran == [] and not row["runs_steps"], key
                    # (a live owner's lease in the message moves on: its run is what counts)
                    named = row["detail"].split(",")[0] if verdict == "live" else row["detail"]
                    assert named in " ".join(did.stderr.split()), (key, row, did.stderr)
                expected = {"cur": ["c"], "cont": ["c", "d"], "rest": ["a", "b", "c", "d"]}
                assert ran == expected.get(key, []), key
        finally:
            live.finish()


GRAPHS = """
from pathlib import Path
from typing import ClassVar

from stepstone.graph import END, GraphBuilder, State


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


def first(state):
    with open("calls.log", "a") as fh:
        fh.write("first\\n")
    return {"n": state.n + 1}


def second(state):
    with open("calls.log", "a") as fh:
        fh.write("second\\n")
    if not Path("fixed").exists():
        raise ValueError("second broke")
    return {"n": state.n + 1}


def build(cls, migrate=False):
    builder = (
        GraphBuilder(cls)
        .add_node("first", first)
        .add_node("second", second)
        .add_edge("first", "second")
        .add_edge("second", END)
        .set_entry("first")
    )
    if migrate:
        builder = builder.with_state_migration("v1", "v2", lambda s: {**s, "label": "x"})
    return builder.compile()


same = build(V1)
with_chain = build(V2, migrate=True)
without_chain = build(V3)
"""


def test_every_graph_verdict_is_what_the_resume_does(
    store_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "i36b_verdict_graphs"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(GRAPHS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    from stepstone.graph import StoreCheckpointer

    graphs = importlib.import_module(name)
    try:
        with open_args(store_args) as store:
            recorded = graphs.build(graphs.V1)
            recorded.checkpointer = StoreCheckpointer(store)
            keys = {}
            for label in ("cur", "mig", "nochain"):
                with pytest.raises(Exception, match="second broke"):
                    recorded.invoke(graphs.V1(), correlation_id=label)
                keys[label] = max(store.backend.run_list("graph:"), key=lambda h: h.created_at).key
            Path("fixed").touch()
            recorded.invoke(graphs.V1(), correlation_id="fin")
            keys["fin"] = max(store.backend.run_list("graph:"), key=lambda h: h.created_at).key
            cases = {
                "cur": ("same", "current", ["second"]),
                "mig": ("with_chain", "migrates", ["second"]),
                "nochain": ("without_chain", "no chain", []),
                "fin": ("same", "done", []),
            }
            for label, (target, verdict, expected) in cases.items():
                key, spec = keys[label], f"{name}:{target}"
                said = runner.invoke(
                    app, ["migrate", "--dry-run", "--target", spec, "--json", *store_args]
                )
                assert said.exit_code == 0, said.stderr
                (row,) = [r for r in json.loads(said.stdout) if r["key"] == key]
                assert row["verdict"] == verdict, (label, row)
                before = _calls()
                did = runner.invoke(app, ["resume", key, "--target", spec, *store_args])
                assert _calls()[len(before) :] == expected, label
                if verdict == "no chain":
                    assert did.exit_code == 1 and row["detail"] in " ".join(did.stderr.split())
                else:
                    assert did.exit_code == 0, (label, did.stderr)
    finally:
        sys.modules.pop(name, None)
