"""The run views of stepstone's own engines, registered in one place.

``Store.read(key)`` shows a durable run through the view registered for its kind. The
built-in kinds are registered here, by :func:`register_builtin_views`, which
``stepstone/__init__.py`` calls: importing any part of stepstone (``stepstone.store``
included) runs ``stepstone/__init__.py`` first, so every read sees the same views whatever
the caller imported. No engine module registers anything when it is imported.

Third-party engines register the view of their own kind with
:func:`stepstone.store.register_run_view`; a kind nobody registered is shown with the
store's generic view (head fields and the decoded journal).

Why not Python entry points: the built-in views are part of this package and known here,
so a plain call is simpler, cannot be broken by stale installation metadata, and costs
nothing at read time; third-party engines are imported by the code that uses them and can
register their view then.
"""

from __future__ import annotations

from typing import Any

from stepstone.store._base import JournalRow, RunHead
from stepstone.store._views import register_internal_kind, register_run_view

__all__ = ["BUILTIN_KINDS", "INTERNAL_KINDS", "register_builtin_views"]

#: The run kinds of stepstone's engines (each engine module defines its own constant; a
#: test checks they agree with these).
BUILTIN_KINDS = ("plan", "graph", "replan", "agent", "workflow")

#: Record kinds of stepstone's engines that are bookkeeping, not runs: a graph record's
#: resume lock (``graph:<id>#resume``), a step execution's own journal of its sleeps,
#: receives and stream writes (``<idempotency key>:ops``). Listings of runs leave them out.
#: (Written out rather than imported from the kernel, so ``import stepstone`` loads no
#: kernel module; a test checks they agree with the graph engine's and the kernel's.)
INTERNAL_KINDS = ("graph.resume", "step-ops")


def register_builtin_views() -> None:
    """Register the view of every built-in run kind (idempotent)."""
    register_run_view("plan", _plan_view)
    register_run_view("graph", _graph_view)
    register_run_view("replan", _replan_view)
    register_run_view("agent", _agent_view)
    register_run_view("workflow", _workflow_view)
    for kind in INTERNAL_KINDS:
        register_internal_kind(kind)


# `import stepstone` loads no engine (a program that runs Plans never needs the graph or
# the LLM engine): each view loads its engine's module the first time a run of its kind is
# read.


def _plan_view(head: RunHead, rows: list[JournalRow]) -> Any:
    from stepstone.engines.plan._checkpoint import plan_view

    return plan_view(head, rows)


def _graph_view(head: RunHead, rows: list[JournalRow]) -> Any:
    from stepstone.engines.graph._fold import graph_view

    return graph_view(head, rows)


def _replan_view(head: RunHead, rows: list[JournalRow]) -> Any:
    from stepstone.engines.replan._record import replan_view

    return replan_view(head, rows)


def _agent_view(head: RunHead, rows: list[JournalRow]) -> Any:
    from stepstone.engines.llm._durable import agent_view

    return agent_view(head, rows)


def _workflow_view(head: RunHead, rows: list[JournalRow]) -> Any:
    from stepstone.engines.workflow._view import workflow_view

    return workflow_view(head, rows)
