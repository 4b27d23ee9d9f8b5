"""How a durable run looks through ``Store.read``: one view function per run kind.

The store only keeps the table. The views of stepstone's own engines are registered in one
place above the store (``stepstone.engines._views.register_builtin_views``, called when
``stepstone`` is imported, which any import of a stepstone module does first), so what
``Store.read`` returns never depends on what the caller imported. Third-party engines call
:func:`register_run_view` for their kind; a kind nobody registered gets
:func:`generic_view` (head fields and the decoded journal).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stepstone.exceptions import CheckpointCorruptError, ConfigurationTypeError
from stepstone.store._base import JournalRow, RunHead, journal_problem

__all__ = [
    "RunView",
    "generic_view",
    "has_run_view",
    "is_internal_kind",
    "register_internal_kind",
    "register_run_view",
    "render_run",
]

RunView = Callable[[RunHead, list[JournalRow]], Any]


_VIEWS: dict[str, RunView] = {}


def register_run_view(kind: str, view: RunView) -> None:
    """Make ``Store.read(key)`` render runs of ``kind`` with ``view(head, journal)``.

    For third-party engines (stepstone's own kinds are registered when ``stepstone`` is
    imported): call it once, before runs of ``kind`` are read, e.g. in the module that
    defines the engine. A later call for the same kind replaces the view.

    Raises:
        ConfigurationTypeError: ``kind`` is not a non-empty string or ``view`` is not
            callable.
    """
    if not isinstance(kind, str) or not kind:
        raise ConfigurationTypeError(f"run kind must be a non-empty string, got {kind!r}")
    if not callable(view):
        raise ConfigurationTypeError(
            f"the view of run kind {kind!r} must be a function (head, journal_rows) -> "
            f"value, got {view!r}"
        )
    _VIEWS[kind] = view


_INTERNAL: set[str] = set()


def register_internal_kind(kind: str) -> None:
    """Mark run records of ``kind`` as an engine's own bookkeeping (a lock, a marker), not
    runs: operators' listings (``stepstone runs``, ``stranded``, the inspector) leave them
    out unless asked for that kind by name. Reading, pruning and checking them is
    unchanged."""
    if not isinstance(kind, str) or not kind:
        raise ConfigurationTypeError(f"run kind must be a non-empty string, got {kind!r}")
    _INTERNAL.add(kind)


def is_internal_kind(kind: str) -> bool:
    """Whether records of ``kind`` are bookkeeping, not runs (:func:`register_internal_kind`)."""
    return kind in _INTERNAL


def has_run_view(kind: str) -> bool:
    """Whether runs of ``kind`` have a registered view (stepstone's own kinds do)."""
    return kind in _VIEWS


def render_run(head: RunHead, rows: list[JournalRow]) -> Any:
    """Render a run with its kind's view (or the generic one)."""
    view: RunView = _VIEWS.get(head.kind, generic_view)
    problem = journal_problem(head, rows)
    try:
        if problem is not None:
            raise ValueError(problem)
        return view(head, rows)
    except CheckpointCorruptError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CheckpointCorruptError(
            f"checkpoint {head.key!r} ({head.kind} run) cannot be decoded: {exc}; "
            f"inspect it with `stepstone inspect --db FILE {head.key}` (`--url URL` for "
            f"PostgreSQL) or remove it with "
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
