"""Tool calls that need a person's approval, asked through a workflow's journal.

A call that needs approval is asked at a position of its own (an ``approval``
operation): the first time, its question is recorded with the answer ``{"pending":
true}`` and the run stops (:class:`~stepstone.exceptions.ApprovalPendingError`).
``stepstone approve KEY CALL_ID`` (``approve_call``), from any process, appends the
decision as that position's outcome (see
:func:`stepstone.durable._operations.approve_operation`); the run, run again, replays the
decision there instead of asking.
"""

from __future__ import annotations

from typing import Any

from stepstone.durable._operations import OperationJournal

__all__ = ["ask_approval"]


def ask_approval(
    journal: OperationJournal, pos: str, tool: str, call_id: str, arguments: Any
) -> bool | str | None:
    """The decision recorded for the call ``call_id`` of ``tool`` at ``pos``: True
    (approved), False or a reason (refused), or None (no decision yet: the question is
    recorded now, when it was not already)."""
    found = journal.check(pos, "approval", tool, None, check_args=False)
    if found is not None and found.outcome is not None and "value" in found.outcome:
        journal.replayed += 1
        value = found.outcome["value"]
        if isinstance(value, dict) and "decision" in value:
            decision = value["decision"]
            if decision is True or decision is False or isinstance(decision, str):
                return decision
        return None
    args = {"call_id": call_id, "tool": tool, "arguments": arguments}
    journal.record_done(pos, "approval", tool, args, {"pending": True})
    return None
