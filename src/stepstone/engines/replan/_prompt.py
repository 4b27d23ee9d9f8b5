"""The planner's input, built by the engine every round: task, tools, history."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stepstone.core import Tool
from stepstone.engines.replan._record import Round

__all__ = ["PLANNER_ARGS", "planner_kwargs", "planner_prompt"]

# What a function planner may declare as parameters; the engine passes the ones it has.
PLANNER_ARGS = ("task", "original_task", "history", "tools", "round", "max_rounds")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def planner_prompt(
    task: str, tools: list[Tool], rounds: list[Round], *, number: int, max_rounds: int
) -> str:
    """The text a planner agent gets as its task for round ``number``."""
    lines = [
        "Tools you can dispatch (Task.tool is the name; Task.kwargs must match the JSON "
        "schema of its parameters):"
    ]
    for t in tools:
        lines.append(f"- {t.name}: {t.description or '(no description)'}")
        lines.append(
            f"  parameters: {json.dumps(t.parameters, ensure_ascii=False, sort_keys=True)}"
        )
    parts = [f"Task:\n{task}", "\n".join(lines)]
    if rounds:
        parts.append("History of earlier rounds:")
        for r in rounds:
            lines = [f"Round {r.number}. Reasoning: {r.plan.reasoning}"]
            for item_no, item in enumerate(r.history()["tasks"]):
                head = f"  [{r.number}.{item_no}] {item['tool']}({_text(item['kwargs'])})"
                if "error" in item:
                    err = item["error"]
                    lines.append(f"{head} -> error {err.get('type')}: {err.get('message')}")
                else:
                    lines.append(f"{head} -> result: {_text(item.get('result'))}")
            parts.append("\n".join(lines))
    else:
        parts.append("History of earlier rounds: none, this is the first round.")
    parts.append(
        f"This is round {number} of at most {max_rounds}. Answer with a PlanRound: the tasks "
        "for this round (parallel=true tasks run concurrently, parallel=false ones run after "
        "them in order). Tasks that need this round's results belong in the next round, "
        "after you have seen them. When the task is complete, answer done=true with the "
        "final_answer."
    )
    return "\n\n".join(parts)


def planner_kwargs(
    planner: Tool,
    *,
    task: str,
    tools: list[Tool],
    rounds: list[Round],
    number: int,
    max_rounds: int,
) -> dict[str, Any]:
    """Arguments for a function planner: the ones among :data:`PLANNER_ARGS` it declares
    (each built only when declared: the prompt and the history grow with the run)."""
    wanted = planner.parameters.get("properties") or {}
    offered: dict[str, Callable[[], Any]] = {
        "task": lambda: planner_prompt(task, tools, rounds, number=number, max_rounds=max_rounds),
        "original_task": lambda: task,
        "history": lambda: [r.history() for r in rounds],
        "tools": lambda: [t.definition() for t in tools],
        "round": lambda: number,
        "max_rounds": lambda: max_rounds,
    }
    return {k: make() for k, make in offered.items() if k in wanted}
