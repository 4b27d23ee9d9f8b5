"""Rich rendering of checkpoints and runs, shared by `stepstone inspect`, `runs` and the demo."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from stepstone.cli._runs import RunLine, owner_state
from stepstone.durable._inspect import steps_done
from stepstone.store import StoreEntry

__all__ = [
    "entry_json",
    "key_table",
    "key_width",
    "keyed_console",
    "render_entry",
    "render_runs",
]

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
    return text if len(text) <= width else text[: width - 3] + "..."


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts or 0))


def entry_json(entry: StoreEntry) -> dict[str, Any]:
    """A store entry as one JSON object (``stepstone inspect --json``)."""
    return {
        "key": entry.key,
        "kind": entry.kind,
        "run_kind": entry.run_kind,
        "version": entry.version,
        "updated_at": entry.updated_at,
        "value": entry.value,
    }


def render_entry(console: Console, entry: StoreEntry, *, history: bool = True) -> None:
    """Print a plain value, or a checkpoint in the shape of the engine that wrote it."""
    key = escape(entry.key)
    if entry.kind == "value":
        console.print(f"[bold]{key}[/] is a plain value:")
        console.print_json(json.dumps(entry.value, default=str))
        return
    state = entry.value
    if entry.run_kind == "replan" and isinstance(state, dict):
        from stepstone.cli._render_replan import render_replan

        return render_replan(console, entry, history=history)
    if entry.run_kind == "plan" and isinstance(state, dict):
        _render_plan(console, entry, state, history=history)
    elif entry.run_kind == "graph" and isinstance(state, dict):
        _render_graph(console, entry, state)
    else:
        console.print(f"[bold]{key}[/]  {entry.run_kind} run  version {entry.version}:")
        console.print_json(json.dumps(state, default=str))


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _status(status: Any) -> str:
    style = _STATUS_STYLE.get(str(status), "white")
    return f"[{style}]{escape(str(status))}[/]"


def _render_error(console: Console, err: Any, where: str) -> None:
    if isinstance(err, dict):
        console.print(
            f"  [red]error[/] at {where} {err.get(where) or err.get('step')!r}: "
            f"{escape(str(err.get('type')))}: {escape(str(err.get('message')))}"
        )
    elif err:
        console.print(f"  [red]error[/]: {escape(str(err))}")


def _render_plan(
    console: Console, entry: StoreEntry, state: dict[str, Any], *, history: bool
) -> None:
    console.print(
        f"[bold]{escape(entry.key)}[/]  plan run  status {_status(state.get('status'))}  "
        f"next step [bold]{escape(_or_dash(state.get('next_step')))}[/]"
    )
    console.print(
        f"  run_uid {state.get('run_uid')}  iteration {state.get('iteration')}  "
        f"version {entry.version}  updated {_when(entry.updated_at)}"
    )
    console.print(f"  completed steps: {escape(str(state.get('completed_steps')))}")
    kv = state.get("kv") or {}
    console.print(f"  kv keys: {escape(str(sorted(kv)))}")
    _render_error(console, state.get("error"), "step")
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
                escape(str(item.get("step"))),
                str(item.get("iteration")),
                escape(_short(env.get("payload"))),
            )
        console.print(table)


def _render_graph(console: Console, entry: StoreEntry, state: dict[str, Any]) -> None:
    console.print(
        f"[bold]{escape(entry.key)}[/]  graph run  status {_status(state.get('status'))}  "
        f"next node [bold]{escape(_or_dash(state.get('next_node')))}[/]"
    )
    console.print(
        f"  invocation_id {state.get('invocation_id')}  "
        f"correlation_id {escape(str(state.get('correlation_id')))}  "
        f"attempt {state.get('attempt_index')}  version {entry.version}  "
        f"updated {_when(entry.updated_at)}"
    )
    if state.get("resumed_from"):
        console.print(f"  resumed from {state['resumed_from']}")
    console.print(
        f"  schema version {state.get('schema_version')!r}  "
        f"serialization {state.get('serialization')}"
    )
    positions = state.get("completed_positions") or []
    names = [p[1] if isinstance(p, list) and len(p) > 1 else p for p in positions]
    console.print(f"  completed nodes: {escape(str(names))}")
    _render_error(console, state.get("error"), "node")
    console.print("  state:")
    console.print_json(json.dumps(state.get("state"), default=str))


def key_table(keys: list[str], key_column: str, *columns: str, title: str | None = None) -> Table:
    """A table whose ``key_column`` shows every key whole (never cropped, so it can be
    copied into the next command) and whose other columns wrap rather than crop; print it
    on a console :func:`key_width` wide."""
    table = Table(title=title)
    longest = max((len(k) for k in keys), default=0)
    table.add_column(key_column, no_wrap=True, min_width=max(longest, len(key_column)))
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def key_width(keys: list[str], others: int) -> int:
    """A console width for the longest of ``keys`` and ``others`` columns of other text:
    a narrow terminal then wraps the lines rather than a table cropping a key."""
    longest = max((len(k) for k in keys), default=0)
    return max(Console().width, longest + others)


def keyed_console(keys: list[str], others: int = 60) -> Console:
    """A console without markup, :func:`key_width` wide."""
    return Console(markup=False, width=key_width(keys, others))


def render_runs(
    console: Console,
    lines: list[RunLine],
    *,
    now: float | None = None,
    total: int | None = None,
    offset: int = 0,
) -> None:
    """Print one row per durable run; keys are printed whole so they can be copied.
    ``total`` (runs matching, all pages) and ``offset`` say which page this is."""
    now = time.time() if now is None else now
    total = len(lines) if total is None else total
    title = f"{total} run(s)"
    if len(lines) < total:
        title += f", {offset + 1}-{offset + len(lines)} shown" if lines else ", none shown"
    table = key_table(
        [line.key for line in lines],
        "key",
        *("kind", "status", "next step", "steps", "owner", "updated", "error"),
        title=title,
    )
    for line in lines:
        if line.head is None:
            table.add_row(
                escape(line.key),
                "?",
                "[red]corrupt[/]",
                "-",
                "-",
                escape(str(line.corrupt)),
                "-",
                "-",
            )
            continue
        h = line.head
        state, detail = owner_state(h, now)
        owner = "-" if state == "-" else f"[{'green' if state == 'live' else 'red'}]{state}[/]"
        if state != "-":
            owner += f" ({escape(detail)})"
        err = line.error
        table.add_row(
            escape(h.key),
            escape(h.kind),
            _status(h.status),
            escape(_or_dash(h.next_step)),
            str(steps_done(h)),
            owner,
            _when(h.updated_at),
            f"[red]{escape(str(err.get('type')))}[/]" if err else "",
        )
    console.print(table)
    if offset + len(lines) < total:
        console.print(f"more: --offset {offset + len(lines)} shows the next page")


@contextmanager
def progress_bar(label: str, *, hidden: bool) -> Iterator[Callable[[int, int], None]]:
    """A transient ``label ━━━ done/total`` bar on stderr while the block runs; yields the
    callback long work reports ``(done, total)`` to. Not shown when ``hidden`` (JSON
    output, a dry run) or when stderr is not a terminal."""
    err = Console(stderr=True)
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=hidden or not err.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
