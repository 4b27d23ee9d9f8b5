"""Run views: registered in one place when stepstone is imported, the same whatever the
caller imported; third-party kinds register their own; unknown kinds get the generic view."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone
from stepstone import Agent, Plan, Step, Store
from stepstone.durable import claim_run
from stepstone.durable._agent_journal import AGENT_KIND
from stepstone.engines._views import BUILTIN_KINDS, register_builtin_views
from stepstone.engines.graph import END, GraphBuilder, State, StoreCheckpointer
from stepstone.engines.graph._records import GRAPH_KIND
from stepstone.engines.replan._engine import KIND as REPLAN_KIND
from stepstone.engines.workflow import WORKFLOW_KIND
from stepstone.exceptions import CheckpointCorruptError, ConfigurationTypeError
from stepstone.store import _views, register_run_view
from stepstone.store._base import JournalRow, RunHead
from stepstone.store._views import generic_view

SRC = Path(stepstone.__file__).parent


class _Count(State):
    n: int = 0


def _shout(text: str) -> str:
    return text.upper()


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[Path]:
    """A SQLite store holding one run of every built-in kind (and one of an unknown kind)."""
    path = tmp_path / "views.sqlite"
    with Store(db=path) as store:
        plan = Plan(Step(_shout, writes="out"), store=store, checkpoint_key="plan-run")
        Agent(engine=plan)("hi")
        for key, kind in (("replan-run", REPLAN_KIND), ("agent-run", AGENT_KIND), ("odd", "x")):
            claim = claim_run(store, key, kind=kind, resume=False, first_step="a")
            assert claim.run is not None
            rows = [("note", "n", {"k": 1})] if kind == "x" else []  # no engine rows
            claim.run.commit_sync(status="failed", next_step="a", rows=rows)
            claim.run.release()
        builder = GraphBuilder(_Count).add_node("inc", lambda s: {"n": s.n + 1})
        graph = builder.add_edge("inc", END).set_entry("inc")
        graph.with_checkpointer(StoreCheckpointer(store)).compile().invoke(_Count())
    yield path


READER = """
import json, sys
{imports}
from stepstone.store._views import _VIEWS
kinds = sorted(_VIEWS)  # before anything else is imported by the reads
with Store(db={path!r}, read_only=True) as store:
    values = {{key: store.read(key) for key in store.keys()}}
print(json.dumps({{"kinds": kinds, "values": values}}, sort_keys=True, default=str))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "from stepstone.store import Store",
        "from stepstone.store._store import Store",
        "from stepstone.durable import read_run\nfrom stepstone.store import Store",
        "import stepstone.graph\nfrom stepstone import Store",
    ],
)
def test_a_read_is_the_same_whatever_the_caller_imported(filled: Path, imports: str) -> None:
    # guarantee 143: a fresh interpreter that imports only the store reads every built-in
    # kind through its engine's view, exactly as a process that imported everything
    code = READER.format(imports=imports, path=str(filled))
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    ).stdout
    got = json.loads(out)
    assert got["kinds"] == sorted(BUILTIN_KINDS)
    with Store(db=filled, read_only=True) as store:
        here = {key: store.read(key) for key in store.keys()}
        heads = {h.key: h for h in stepstone.durable.list_runs(store)}
        generic = {k: generic_view(h, store.backend.run_journal(k)) for k, h in heads.items()}
    assert got["values"] == json.loads(json.dumps(here, sort_keys=True, default=str))
    graph_key = next(k for k, h in heads.items() if h.kind == GRAPH_KIND)
    assert here[graph_key]["state"] == {"n": 1}
    assert here["plan-run"]["kv"] == {"out": "HI"}
    for key in ("plan-run", "replan-run", "agent-run", graph_key):
        assert here[key] != generic[key], key  # shown through the engine's view
    assert here["agent-run"] == {"status": "failed", "phase": None}
    assert here["replan-run"]["round"] == 0


def test_a_kind_nobody_registered_gets_the_generic_view(filled: Path) -> None:
    # guarantee 312
    with Store(db=filled, read_only=True) as store:
        value = store.read("odd")
        entry = store.read_entry("odd")
    assert entry is not None and entry.run_kind == "x"
    assert value["kind"] == "x" and value["status"] == "failed" and value["next_step"] == "a"
    assert value["journal"] == [{"seq": 0, "kind": "note", "name": "n", "data": {"k": 1}}]
    assert set(value) == {
        "kind", "status", "next_step", "run_uid", "version", "iteration", "meta", "journal",
    }  # fmt: skip


@pytest.fixture
def restore_views() -> Iterator[None]:
    saved = dict(_views._VIEWS)
    yield
    _views._VIEWS.clear()
    _views._VIEWS.update(saved)


def test_a_third_party_engine_registers_its_view(filled: Path, restore_views: None) -> None:
    # guarantee 313
    def odd_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
        return {"odd": head.status, "rows": len(rows)}

    register_run_view("x", odd_view)
    with Store(db=filled, read_only=True) as store:
        assert store.read("odd") == {"odd": "failed", "rows": 1}
        assert dict(store.items(kind="checkpoint"))["odd"] == {"odd": "failed", "rows": 1}

        def broken(head: RunHead, rows: list[JournalRow]) -> Any:
            raise KeyError("missing")

        register_run_view("x", broken)  # a later call replaces the view
        with pytest.raises(CheckpointCorruptError, match="'odd' \\(x run\\) cannot be decoded"):
            store.read("odd")


@pytest.mark.parametrize(
    ("kind", "view", "match"),
    [
        ("", generic_view, "run kind must be a non-empty string, got ''"),
        (None, generic_view, "run kind must be a non-empty string, got None"),
        ("x", "not a function", "view of run kind 'x' must be a function"),
    ],
)
def test_register_run_view_refuses_bad_arguments(
    kind: Any, view: Any, match: str, restore_views: None
) -> None:
    # guarantee 313
    before = dict(_views._VIEWS)
    with pytest.raises(ConfigurationTypeError, match=match):
        register_run_view(kind, view)
    assert before == _views._VIEWS


def test_no_module_registers_a_view_as_an_import_side_effect(restore_views: None) -> None:
    # guarantee 143: the built-in views are registered in one function, and nothing else in
    # stepstone registers one, so importing more modules never changes what a read shows
    callers = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == (
                "register_run_view"
            ):
                callers.append(path.relative_to(SRC).as_posix())
    assert sorted(set(callers)) == ["engines/_views.py"]
    before = dict(_views._VIEWS)
    for info in pkgutil.walk_packages(stepstone.__path__, "stepstone."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert before == _views._VIEWS
    assert sorted(before) == sorted(BUILTIN_KINDS)
    register_builtin_views()  # idempotent
    assert before == _views._VIEWS


def test_builtin_kinds_are_the_engines_kinds() -> None:
    assert {GRAPH_KIND, AGENT_KIND, REPLAN_KIND, WORKFLOW_KIND, "plan"} == set(BUILTIN_KINDS)


def test_internal_kinds_are_the_engines_bookkeeping() -> None:
    # guarantee 424, 519: the graph's resume lock and a step's own operations journal are
    # the record kinds that are not runs
    from stepstone.durable._time import STEP_OPS_KIND
    from stepstone.engines._views import INTERNAL_KINDS
    from stepstone.engines.graph._records import LOCK_KIND
    from stepstone.store._views import is_internal_kind

    assert INTERNAL_KINDS == (LOCK_KIND, STEP_OPS_KIND)
    assert is_internal_kind(LOCK_KIND) and is_internal_kind(STEP_OPS_KIND)
    assert not any(is_internal_kind(kind) for kind in BUILTIN_KINDS)
