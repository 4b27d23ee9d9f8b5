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
from stepstone.durable._operations import iter_positions, load_entries
from stepstone.exceptions import WorkflowCorruptError
from stepstone.store._base import JournalRow, RunHead

__all__ = ["operation_rows", "workflow_view"]


def operation_rows(head: RunHead, rows: list[JournalRow]) -> list[dict[str, Any]]:
    """One entry per operation of the run, in position order (see the module docstring).

    Raises:
        ValueError: a row cannot be decoded (the store reports the run as corrupt).
    """
    try:
        entries, _ = load_entries(head.key, rows)
    except WorkflowCorruptError as exc:
        raise ValueError(str(exc)) from None
    out: list[dict[str, Any]] = []
    for pos, entry in iter_positions(entries):
        outcome = entry.outcome
        if outcome is None:
            state = "running" if head.status in ("claimed", "running") else "in doubt"
        else:
            state = "failed" if "error" in outcome else "done"
        item: dict[str, Any] = {
            "position": pos,
            "op": entry.op,
            "name": entry.name,
            "status": state,
            "args": untag(entry.intent.get("args")),
            "attempts": entry.starts + len(entry.failures),
            "started_at": entry.intent.get("at"),
            "ms": None if outcome is None else outcome.get("ms"),
        }
        if outcome is not None and "value" in outcome:
            item["value"] = untag(outcome["value"])
        if outcome is not None and "error" in outcome:
            item["error"] = outcome["error"]
        if entry.failures:
            item["failed_attempts"] = entry.failures
        for extra in ("key", "in_doubt"):
            if extra in entry.intent:
                item[extra] = entry.intent[extra]
        out.append(item)
    return out


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
