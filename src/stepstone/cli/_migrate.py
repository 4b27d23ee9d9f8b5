"""Commands that load the application's code: ``migrate --dry-run`` and ``resume``.

``migrate --dry-run`` says which stored runs the current code can still resume.

For graph records: which would migrate to the graph's current state schema, along which
chain, and which have no chain (or an ambiguous one). For Plan checkpoints: which were
written by another version of the plan (fingerprint) and which stopped at a step the plan no
longer has. Nothing is written: records migrate when they are resumed.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
from typing import Annotated, Any

import typer

from stepstone.agent import Agent
from stepstone.cli._ops import no_run
from stepstone.cli._options import (
    DbOption,
    DebugOption,
    JsonOption,
    OpsError,
    UrlOption,
    open_store,
)
from stepstone.cli._render import key_table, keyed_console, named_key, visible_console
from stepstone.durable import list_runs, run_head
from stepstone.durable._inspect import successors
from stepstone.durable._operate import a_kind
from stepstone.engines.graph import CompiledGraph, StoreCheckpointer
from stepstone.engines.graph._verdict import graph_resume_verdict
from stepstone.engines.plan import Plan
from stepstone.engines.plan._verdict import resume_verdict
from stepstone.store import RunHead, Store

__all__ = ["migrate_cmd", "resume_cmd"]


def load_target(spec: str) -> Plan | CompiledGraph[Any]:
    """Import ``module:attribute`` (a Plan, a compiled graph, an Agent around a Plan, or a
    function of no arguments returning one), with the current directory importable."""
    obj = load_object(spec)
    if isinstance(obj, Agent):
        obj = obj.engine
    if not isinstance(obj, Plan | CompiledGraph):
        raise OpsError(f"{spec!r} is a {type(obj).__name__}, not a Plan or a compiled graph")
    return obj


def load_object(spec: str) -> Any:
    """``module:attribute`` imported (and called when it is a factory)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise OpsError(f"bad target {spec!r}: use module:attribute, e.g. pipelines:build_plan")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OpsError(f"cannot load {spec!r}: {exc}; check the module and attribute") from exc
    except Exception as exc:  # the module itself fails: a SyntaxError, an error it raises
        raise OpsError(
            f"cannot load {spec!r}: importing {module_name!r} raised {type(exc).__name__}: "
            f"{exc}; fix the module, or point --target at another one"
        ) from exc
    if callable(obj) and not isinstance(obj, Plan | CompiledGraph | Agent):
        try:
            obj = obj()
        except Exception as exc:
            raise OpsError(
                f"calling {spec!r}() failed ({type(exc).__name__}: {exc}); the target must be "
                "a Plan, a compiled graph, or a function of no arguments returning one"
            ) from exc
    return obj


def resume_plan(engine: Plan, store: Store, key: str) -> Plan:
    """The Plan ``stepstone resume`` runs for ``key``: the target's steps and settings,
    recorded under ``key`` in ``store``, resumed. ``migrate --dry-run`` judges a run with
    this same Plan, so what it says is what the resume does."""
    return Plan(
        *engine.steps,
        max_iterations=engine.max_iterations,
        store=store,
        checkpoint_key=key,
        resume=True,
        strict=engine.strict,
        on_plan_change=engine.on_plan_change,
    )


def resume_graph(graph: CompiledGraph[Any], store: Store) -> CompiledGraph[Any]:
    """``graph`` recording in ``store`` (the store named on the command line), with its
    own checkpointer's prefix, serialization and pickle key: what ``stepstone resume``
    resumes a record with, and what ``migrate --dry-run`` judges it with."""
    own = graph.checkpointer
    cp = (
        StoreCheckpointer(store)
        if not isinstance(own, StoreCheckpointer)
        else StoreCheckpointer(
            store, prefix=own.prefix, serialization=own.serialization, pickle_key=own.codec.signer
        )
    )
    return CompiledGraph(
        state_cls=graph.state_cls,
        nodes=graph.nodes,
        edges=graph.edges,
        entry=graph.entry,
        checkpointer=cp,
        migrations=graph.migrations,
    )


def invocation_of(graph: CompiledGraph[Any], key: str) -> str:
    """The invocation id of the graph record under ``key``."""
    cp = graph.checkpointer
    prefix = cp.prefix if isinstance(cp, StoreCheckpointer) else "graph:"
    if not key.startswith(prefix):
        raise OpsError(
            f"{key!r} is not a record of this graph (its checkpointer keeps records under "
            f"{prefix!r}); pass the graph that saved it"
        )
    return key[len(prefix) :]


def migrate_cmd(
    target: Annotated[
        str, typer.Option("--target", help="module:attribute of the current Plan or graph.")
    ],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only (required).")] = False,
    db: DbOption = None,
    url: UrlOption = None,
    prefix: Annotated[str | None, typer.Option(help="Only keys starting with this.")] = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Which stored runs would migrate (and how) to the current Plan or graph."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        if not dry_run:
            raise OpsError(
                "records migrate when they are resumed; pass --dry-run to see which would "
                "migrate and which cannot"
            )
        obj = load_target(target)
        kind = "plan" if isinstance(obj, Plan) else "graph"
        graph = resume_graph(obj, store) if isinstance(obj, CompiledGraph) else None
        rows: list[dict[str, Any]] = []
        for head in list_runs(store, prefix):
            if head.kind != kind:
                continue
            if isinstance(obj, Plan):
                said = resume_verdict(resume_plan(obj, store, head.key), store, head.key)
            else:
                assert graph is not None
                said = graph_resume_verdict(graph, invocation_of(graph, head.key))
            rows.append(
                {
                    "key": head.key,
                    "status": head.status,
                    "verdict": said.verdict,
                    "detail": said.detail,
                    "runs_steps": said.runs,
                }
            )
        if as_json:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
            return
        keys = [r["key"] for r in rows]
        table = key_table(
            keys,
            "key",
            "status",
            "verdict",
            "detail",
            title=f"{len(rows)} {kind} run(s) against {target}",
        )
        for r in rows:
            table.add_row(r["key"], r["status"], r["verdict"], r["detail"])
        keyed_console(keys, 80).print(table)


def resume_cmd(
    key: Annotated[str, typer.Argument(help="The run to resume.")],
    target: Annotated[
        str, typer.Option("--target", help="module:attribute of the Plan (or graph) it runs.")
    ],
    task: Annotated[str, typer.Option(help="The task a resumed Plan is given.")] = "",
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Resume a stopped run with the application's Plan or graph, where it stopped."""
    with open_store(db, url, debug=debug) as store:
        key = named_key(store, key)
        head = run_head(store, key)
        if head is None:
            raise no_run(key, store)
        obj = load_object(target)
        engine = obj.engine if isinstance(obj, Agent) else obj
        _check_kinds(key, head, engine, target)
        went_on = key
        if isinstance(engine, CompiledGraph):
            # A graph resumes from the record in this store, with its own codec and prefix.
            graph = resume_graph(engine, store)
            graph.invoke(resume_invocation=invocation_of(graph, key))
            # it went on under a new invocation id: report that record
            went_on = successors(store, [head], prefix=key).get(key, key)
        elif isinstance(engine, Plan):
            plan = resume_plan(engine, store, key)
            runner = copy.copy(obj) if isinstance(obj, Agent) else Agent(engine=plan)
            runner.engine = plan
            runner(task)
        else:
            raise OpsError(f"{target!r} is a {type(obj).__name__}, not a Plan or a compiled graph")
        after = run_head(store, went_on)
        status = after.status if after is not None else "gone"
        err = after.meta.get("error") if after is not None else None
        stopped = err if status != "done" and isinstance(err, dict) else None  # its error
        if as_json:
            out = {"key": key, "status": status, "error": err}
            if went_on != key:
                out["resumed_as"] = went_on
            sys.stdout.write(json.dumps(out) + "\n")
            if stopped is not None:
                raise typer.Exit(1)
        elif stopped is not None:
            raise OpsError(
                f"run {key!r} stopped again ({status}) at "
                f"{stopped.get('step') or stopped.get('node')!r}: {stopped.get('type')}: "
                f"{stopped.get('message')}"
            )
        else:
            also = f" (resumed as {went_on})" if went_on != key else ""
            visible_console().print(f"{key}: {status}{also}")


def _check_kinds(key: str, head: RunHead, engine: Any, target: str) -> None:
    """Refuse, before anything runs, a run ``engine`` does not run: an agent run (or
    another engine's), or a Plan's run with a graph as the target (and the reverse). The
    engine's own refusal would advise deleting the run."""
    wanted = (
        "plan"
        if isinstance(engine, Plan)
        else "graph"
        if isinstance(engine, CompiledGraph)
        else None
    )
    if head.kind == wanted or wanted is None:  # None: the refusal below names the target
        return
    if head.kind not in ("plan", "graph"):
        how = (
            "resume it with runner.resume(agent, run_id=..., thread_id=...)"
            if head.kind == "agent"
            else "resume it with the engine that runs it"
        )
        raise OpsError(
            f"run {key!r} is {a_kind(head.kind)} run: `stepstone resume` resumes Plan and graph "
            f"runs; nothing was run or changed. To continue it, {how}"
        )
    raise OpsError(
        f"run {key!r} is {a_kind(head.kind)} run, but --target {target!r} is a "
        f"{'compiled graph' if wanted == 'graph' else 'Plan'}; nothing was run or changed. "
        f"Pass the {'compiled graph' if head.kind == 'graph' else 'Plan'} that runs it"
    )
