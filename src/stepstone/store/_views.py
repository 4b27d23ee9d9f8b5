"""How a durable run looks through ``Store.read``: one view function per run kind.

Engines register the view of their runs (the Plan engine registers its checkpoint dict).
The built-in kinds are found by name, on first read, in the module that defines their view,
so what ``Store.read`` returns never depends on what the caller happened to import; other
kinds get a generic view of head and journal until their engine registers one.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from stepstone.exceptions import CheckpointCorruptError
from stepstone.store._base import JournalRow, RunHead

__all__ = ["RunView", "generic_view", "register_run_view", "render_run"]

RunView = Callable[[RunHead, list[JournalRow]], Any]


_VIEWS: dict[str, RunView] = {}

#: Where the built-in run kinds register their views (imported on first need).
_BUILTIN_VIEWS: dict[str, str] = {
    "plan": "stepstone.engines.plan",
    "graph": "stepstone.engines.graph._fold",
    "replan": "stepstone.engines.replan",
    "agent": "stepstone.engines.llm._durable",
}


def register_run_view(kind: str, view: RunView) -> None:
    """Make ``Store.read(key)`` render runs of ``kind`` with ``view(head, journal)``."""
    _VIEWS[kind] = view


def render_run(head: RunHead, rows: list[JournalRow]) -> Any:
    """Render a run with its kind's view (or the generic one)."""
    view: RunView = _view_for(head.kind)
    try:
        return view(head, rows)
    except CheckpointCorruptError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(
            f"checkpoint {head.key!r} ({head.kind} run) cannot be decoded: {exc}; "
            f"inspect it with `stepstone inspect --db ... {head.key}` or remove it with "
            f"store.delete({head.key!r})"
        ) from exc


def _view_for(kind: str) -> RunView:
    view = _VIEWS.get(kind)
    if view is None and kind in _BUILTIN_VIEWS:
        # Importing the engine's module registers its view.
        importlib.import_module(_BUILTIN_VIEWS[kind])
        view = _VIEWS.get(kind)
    return view or generic_view


def generic_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
    """Head fields plus the decoded journal."""
    return {
        "kind": head.kind,
        "status": head.status,
        "next_step": head.next_step,
        "run_uid": head.run_uid,
        "version": head.version,
        "iteration": head.iteration,
        "meta": head.meta,
        "journal": [
            {"seq": r.seq, "kind": r.kind, "name": r.name, "data": json.loads(r.data)} for r in rows
        ],
    }
