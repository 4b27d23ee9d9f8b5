"""How a workflow run looks through ``Store.read(key)``, the CLI and the inspector.

``workflow_view(head, rows)`` gives the workflow's name, status, arguments, result or
error, and one entry per operation in position order: its kind and name, its arguments,
its value or error, how many attempts it took, when it started and how long it ran. Values
are shown as plain JSON (type tags removed).
"""

from __future__ import annotations

import json
from typing import Any

from stepstone.core._serialization import untag
from stepstone.durable._operations import operation_rows
from stepstone.store._base import JournalRow, RunHead

__all__ = ["workflow_view"]


def workflow_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
    """A workflow run as a JSON-ready dict (what ``store.read(key)`` returns for it)."""
    start: dict[str, Any] = {}
    result: Any = None
    done = False
    for row in rows:
        if row.kind == "start":
            start = json.loads(row.data)
        elif row.kind == "result":
            result, done = untag(json.loads(row.data).get("value")), True
    error = head.meta.get("error")
    return {
        "kind": head.kind,
        "workflow": head.meta.get("workflow", start.get("workflow")),
        "status": head.status,
        "next_step": head.next_step,
        "args": untag(start.get("args")),
        "steps": operation_rows(head, rows),
        "result": result if done else None,
        "error": error if isinstance(error, dict) else None,
        "parent": head.meta.get("parent"),
        "run_uid": head.run_uid,
        "version": head.version,
        "iteration": head.iteration,
    }
