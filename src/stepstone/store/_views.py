"""How a durable run looks through ``Store.read``: one view function per run kind.

Engines register the view users read of their runs (the Plan engine registers the
checkpoint dict of docs/plans.md); other kinds get a generic view of head and journal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stepstone.exceptions import CheckpointCorruptError
from stepstone.store._base import JournalRow, RunHead

__all__ = ["RunView", "generic_view", "register_run_view", "render_run"]

RunView = Callable[[RunHead, list[JournalRow]], Any]


_VIEWS: dict[str, RunView] = {}


def register_run_view(kind: str, view: RunView) -> None:
    """Make ``Store.read(key)`` render runs of ``kind`` with ``view(head, journal)``."""
    _VIEWS[kind] = view


def render_run(head: RunHead, rows: list[JournalRow]) -> Any:
    """Render a run with its kind's view (or the generic one)."""
    view: RunView = _VIEWS.get(head.kind) or generic_view
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
