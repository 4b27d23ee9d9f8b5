"""How `stepstone inspect` shows a ReplanEngine run: its rounds and every task's outcome."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stepstone.cli._render import visible
from stepstone.store import StoreEntry

__all__ = ["render_replan"]

_STYLE = {"done": "green", "failed": "red", "paused": "yellow"}


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return escape(visible(text if len(text) <= width else text[: width - 1] + "…"))


def _m(value: Any) -> str:
    """Stored ``value`` for a markup string: visible, and its ``[`` never markup."""
    return escape(visible(value))


def render_replan(console: Console, entry: StoreEntry, *, history: bool = True) -> None:
    """Print a replan run: status, where it continues, its error, then one table per round."""
    state: dict[str, Any] = entry.value
    style = _STYLE.get(str(state["status"]), "cyan")
    console.print(
        f"[bold]{_m(entry.key)}[/]  replan run  status [{style}]{_m(state['status'])}[/]  "
        f"next step [bold]{_m(state.get('next_step'))}[/]"
    )
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.updated_at or 0))
    console.print(
        f"  run_uid {_m(state.get('run_uid'))}  round {_m(state.get('round'))}  "
        f"version {entry.version}  updated {when}"
    )
    console.print(f"  task: {_short(state.get('task'), 100)}")
    err = state.get("error")
    if err:
        where = f"round {err.get('round')}"
        where += f" task {err['task']} ({err.get('tool')})" if "task" in err else " planner"
        console.print(
            f"  [red]error[/] at {_m(where)}: {_m(err.get('type'))}: {_m(err.get('message'))}"
        )
    if state.get("final_answer") is not None:
        console.print(f"  final answer: {_short(state['final_answer'], 100)}")
    if not history:
        return
    for rnd in state.get("rounds") or []:
        table = Table(title=f"round {_m(rnd['round'])}: {_m(rnd.get('reasoning'))}")
        for col in ("#", "tool", "kwargs", "outcome"):
            table.add_column(col)
        for i, task in enumerate(rnd.get("tasks") or []):
            if "error" in task:
                outcome = f"[red]error[/] {_m(task['error'].get('type'))}"
            elif err and err.get("round") == rnd["round"] and err.get("task") == i:
                outcome = "[red]stopped the run[/] (see error)"
            elif task.get("pending"):
                outcome = "[yellow]pending[/]"
            else:
                outcome = _short(task.get("result"))
            mode = "" if task.get("parallel", True) else " (sequential)"
            table.add_row(str(i), _m(task["tool"]) + mode, _short(task["kwargs"]), outcome)
        console.print(table)
