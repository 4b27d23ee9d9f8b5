"""How a replan run is journaled, rebuilt on resume, and shown by ``store.read(key)``.

Every commit appends rows to the run's journal through the durable kernel:

* ``start``: the original task (with the first round's planner answer);
* ``round`` named ``"<n>"``: the planner's answer for round n, committed as soon as the
  planner returns, so a resumed run never asks the planner for a round again;
* ``task`` named ``"<n>.<i>"``: the outcome (``result`` or ``error``) of task i of round
  n, committed as soon as that task finishes, so a resumed run only runs the tasks of the
  round that have no outcome yet.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import ValidationError

from stepstone.core._serialization import from_typed_json, untag
from stepstone.engines.replan._schema import PlanRound
from stepstone.exceptions import CheckpointCorruptError
from stepstone.store._base import JournalRow, RunHead, journal_problem

__all__ = ["RECORD_VERSION", "Replay", "Round", "checked_replay", "replan_view", "replay"]

RECORD_VERSION = 1

Row = tuple[str, str | None, Any]


@dataclasses.dataclass
class Round:
    """One round: the planner's answer and the outcomes of the tasks that finished.

    ``outcomes[i]`` is ``{"result": <typed JSON>}`` or ``{"error": {"type", "message"}}``.
    """

    number: int
    plan: PlanRound
    outcomes: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    _history: dict[str, Any] | None = dataclasses.field(default=None, repr=False)

    @property
    def complete(self) -> bool:
        """Whether every task has an outcome (a done round has nothing to run)."""
        return self.plan.done or all(i in self.outcomes for i in range(len(self.plan.tasks)))

    def row(self) -> Row:
        """The journal row of the planner's answer."""
        return ("round", str(self.number), {"round": self.number, "plan": self.plan.model_dump()})

    def history(self) -> dict[str, Any]:
        """Plain JSON: ``{round, reasoning, done, tasks: [{tool, kwargs, parallel,
        result|error|pending}]}`` (built once the round is complete, then reused: a
        planner gets every earlier round each round). Treat it as read-only."""
        if self._history is not None:
            return self._history
        tasks = []
        for i, task in enumerate(self.plan.tasks):
            item: dict[str, Any] = {
                "tool": task.tool,
                "kwargs": task.kwargs,
                "parallel": task.parallel,
            }
            outcome = self.outcomes.get(i)
            if outcome is None:
                item["pending"] = True
            elif "error" in outcome:
                item["error"] = outcome["error"]
            else:
                item["result"] = untag(outcome.get("result"))
            tasks.append(item)
        out: dict[str, Any] = {
            "round": self.number,
            "reasoning": self.plan.reasoning,
            "tasks": tasks,
        }
        if self.plan.done:
            out["done"] = True
            out["final_answer"] = self.plan.final_answer
        if self.complete:
            self._history = out
        return out


def task_row(number: int, index: int, tool: str, outcome: dict[str, Any]) -> Row:
    """The journal row of a finished task."""
    return ("task", f"{number}.{index}", {"round": number, "index": index, "tool": tool, **outcome})


@dataclasses.dataclass
class Replay:
    """A replan run's journal, decoded: the original task and the rounds so far."""

    task: str | None
    rounds: list[Round]

    @property
    def final_answer(self) -> str | None:
        """The final answer of a finished run (None before the last round)."""
        if self.rounds and self.rounds[-1].plan.done:
            return self.rounds[-1].plan.final_answer
        return None


#: The fields each kind of replan journal row holds (any other is a damaged field name).
_ROW_FIELDS = {
    "start": {"task"},
    "round": {"round", "plan"},
    "task": {"round", "index", "tool", "result", "error"},
}


def replay(key: str, rows: list[JournalRow]) -> Replay:
    """Decode ``rows``; raises CheckpointCorruptError naming ``key`` when they are bad."""
    task: str | None = None
    rounds: list[Round] = []
    for row in rows:
        data = _row_data(key, row)
        if row.kind == "start":
            task = data.get("task")
            if not isinstance(task, str | None):
                raise _corrupt(key, f"journal row {row.seq}: the run's task is not text")
        elif row.kind == "round":
            rounds.append(_round(key, row, data, len(rounds) + 1))
        elif row.kind == "task":
            _apply_task(key, row, data, rounds)
        else:
            raise _corrupt(key, f"journal row {row.seq} has unknown kind {row.kind!r}")
    return Replay(task, rounds)


def _row_data(key: str, row: JournalRow) -> dict[str, Any]:
    """A journal row's fields, checked to be the ones its kind of row holds."""
    try:
        data = json.loads(row.data)
    except ValueError as exc:
        raise _corrupt(key, f"journal row {row.seq} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise _corrupt(key, f"journal row {row.seq} is {type(data).__name__}, not an object")
    unknown = set(data) - _ROW_FIELDS.get(row.kind, set(data))
    if unknown:  # a byte flipped in a field's name: skipping it changes the run
        raise _corrupt(
            key,
            f"journal row {row.seq} ({row.kind}) has the field(s) {sorted(unknown)}, "
            "which a replan run never writes",
        )
    return data


def _round(key: str, row: JournalRow, data: dict[str, Any], expected: int) -> Round:
    number = data.get("round")
    if number != expected:
        raise _corrupt(key, f"journal row {row.seq} is round {number!r}, expected {expected}")
    try:
        plan = PlanRound.model_validate(data.get("plan"))
    except ValidationError as exc:
        raise _corrupt(key, f"round {number} does not decode: {exc}") from exc
    return Round(number, plan)


def _apply_task(key: str, row: JournalRow, data: dict[str, Any], rounds: list[Round]) -> None:
    """Record a task row's outcome in the last round (the round it must belong to)."""
    number, index = data.get("round"), data.get("index")
    if not rounds or number != rounds[-1].number or not isinstance(index, int):
        raise _corrupt(key, f"journal row {row.seq} is a task of an unknown round")
    if not 0 <= index < len(rounds[-1].plan.tasks):
        raise _corrupt(key, f"journal row {row.seq}: round {number} has no task {index}")
    planned = rounds[-1].plan.tasks[index].tool
    if data.get("tool", planned) != planned:
        raise _corrupt(
            key,
            f"journal row {row.seq} is task {index} of round {number} with tool "
            f"{data.get('tool')!r}, but the round planned {planned!r} there",
        )
    outcome: dict[str, Any] = {k: data[k] for k in ("result", "error") if k in data}
    if len(outcome) != 1:
        raise _corrupt(key, f"journal row {row.seq} holds no one result or error")
    rounds[-1].outcomes[index] = outcome


def checked_replay(head: RunHead, rows: list[JournalRow]) -> Replay:
    """:func:`replay` of the rows ``head`` counts (read consistently with it), after
    checking that they are all there and no more."""
    problem = journal_problem(head, rows)
    if problem is not None:
        raise _corrupt(head.key, problem)
    return replay(head.key, rows)


def result_value(outcome: dict[str, Any]) -> Any:
    """A task outcome's result as the tool returned it (pydantic models rebuilt)."""
    return from_typed_json(outcome.get("result"))


def _corrupt(key: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"replan checkpoint {key!r} is corrupt: {what}. Inspect it with `stepstone inspect "
        f"--db ... {key}`; to start over, remove it with store.delete({key!r})"
    )


def replan_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
    """The record ``store.read(checkpoint_key)`` returns for a replan run."""
    rep = checked_replay(head, rows)
    return {
        "status": head.status,
        "round": len(rep.rounds),
        "rounds": [r.history() for r in rep.rounds],
        "final_answer": rep.final_answer,
        "task": rep.task,
        "next_step": head.next_step,
        "error": head.meta.get("error"),
        "run_uid": head.run_uid,
        "checkpoint_version": RECORD_VERSION,
    }
