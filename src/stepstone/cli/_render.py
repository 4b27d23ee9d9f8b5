"""Rich rendering of checkpoints and runs, shared by `stepstone inspect` and the demo."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from stepstone.store import RunHead, StoreEntry

__all__ = ["render_entry", "render_runs"]

_STATUS_STYLE = {
    "done": "green",
    "failed": "red",
    "paused": "yellow",
    "running": "cyan",
    "claimed": "cyan",
}


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_entry(console: Console, entry: StoreEntry, *, history: bool = True) -> None:
    """Print a checkpoint (status, next step, completed steps, kv keys, history) or a value."""
    if entry.kind == "value":
        console.print(f"[bold]{entry.key}[/] is a plain value:")
        console.print_json(json.dumps(entry.value, default=str))
        return
    state = entry.value
    if entry.run_kind == "replan" and isinstance(state, dict):
        from stepstone.cli._render_replan import render_replan

        return render_replan(console, entry, history=history)
    if not isinstance(state, dict) or "status" not in state:
        console.print(f"[bold]{entry.key}[/] ({entry.run_kind} run):")
        console.print_json(json.dumps(state, default=str))
        return
    style = _STATUS_STYLE.get(str(state["status"]), "white")
    console.print(
        f"[bold]{entry.key}[/]  {entry.run_kind} run  status [{style}]{state['status']}[/]  "
        f"next step [bold]{state.get('next_step')}[/]"
    )
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.updated_at or 0))
    console.print(
        f"  run_uid {state.get('run_uid')}  iteration {state.get('iteration')}  "
        f"version {entry.version}  updated {when}"
    )
    console.print(f"  completed steps: {state.get('completed_steps')}")
    kv = state.get("kv") or {}
    console.print(f"  kv keys: {sorted(kv)}")
    if state.get("error"):
        err = state["error"]
        console.print(
            f"  [red]error[/] at step {err.get('step')!r}: {err.get('type')}: {err.get('message')}"
        )
    if history and state.get("history"):
        table = Table(title="history", show_lines=False)
        table.add_column("#", justify="right")
        table.add_column("step")
        table.add_column("iteration", justify="right")
        table.add_column("payload")
        for i, item in enumerate(state["history"], 1):
            env = item.get("envelope") or {}
            table.add_row(
                str(i),
                str(item.get("step")),
                str(item.get("iteration")),
                _short(env.get("payload")),
            )
        console.print(table)


def render_runs(console: Console, heads: list[RunHead]) -> None:
    """Print one line per durable run."""
    table = Table(title=f"{len(heads)} run(s)")
    for col in ("key", "kind", "status", "next step", "owner", "updated"):
        table.add_column(col)
    for h in heads:
        style = _STATUS_STYLE.get(h.status, "white")
        table.add_row(
            h.key,
            h.kind,
            f"[{style}]{h.status}[/]",
            str(h.next_step),
            f"pid {h.pid} on {h.host.split('/')[0]}" if h.host else "-",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.updated_at)),
        )
    console.print(table)
