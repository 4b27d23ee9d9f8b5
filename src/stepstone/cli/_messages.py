"""``stepstone send``, ``events``, ``stream`` and ``schedules``: messages to a run, its
events and its streams, and the store's schedules, from the command line.

``send`` and ``schedules`` write (the store must already be a stepstone store; listing the
schedules opens it writable, since a SQLite file gets its queue's tables on first use);
``events`` and ``stream`` only read (the store is opened read-only).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from stepstone.cli._options import (
    DbOption,
    DebugOption,
    JsonOption,
    UrlOption,
    fail,
    open_store,
)
from stepstone.cli._render import visible, visible_console
from stepstone.core._serialization import untag
from stepstone.durable._messages import StreamReader, events, run_outcome, send
from stepstone.durable._schedules import Schedule, list_schedules

__all__ = ["events_cmd", "schedules_app", "send_cmd", "stream_cmd"]


def _shown(value: Any) -> str:
    """A value as one line of JSON (types the typed codec tags shown as plain JSON)."""
    return json.dumps(untag(value), ensure_ascii=False, default=str)


def send_cmd(
    key: Annotated[str, typer.Argument(help="The run's key (it may not have started yet).")],
    topic: Annotated[str, typer.Argument(help="The topic the run receives on.")],
    value: Annotated[str, typer.Argument(help="The message, as JSON: '{\"ok\": true}'.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Send a message to a run (kept for it if it has not started; refused once it is done)."""
    try:
        decoded = json.loads(value)
    except ValueError as exc:
        fail(
            f"the message {value!r:.80} is not JSON ({exc}); quote it for the shell, e.g. "
            f"stepstone send {key} {topic} '{{\"ok\": true}}' (a string: '\"yes\"')",
            2,
        )
    with open_store(db, url, debug=debug) as store:
        mid = send(store, key, topic, decoded)
    if as_json:
        typer.echo(json.dumps({"key": key, "topic": topic, "id": mid}))
    else:
        typer.echo(visible(f"sent message {mid} to {key} on topic {topic}"))


def events_cmd(
    key: Annotated[str, typer.Argument(help="The run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Print the events a run set, each with its last value."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        values = events(store, key)
    if as_json:
        typer.echo(json.dumps({name: untag(v) for name, v in values.items()}, default=str))
        return
    console = visible_console()
    if not values:
        console.print(f"{key}: no events")
    for name, value in values.items():
        console.print(f"{name}: {_shown(value)}")


def stream_cmd(
    key: Annotated[str, typer.Argument(help="The run's key.")],
    name: Annotated[str, typer.Argument(help="The stream's name.")],
    db: DbOption = None,
    url: UrlOption = None,
    start: Annotated[int, typer.Option("--from", min=0, help="The first offset to print.")] = 0,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--no-follow",
            help="Wait for new values until the run ends (--no-follow: print what is there).",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per value (and one at the end).")
    ] = False,
    debug: DebugOption = False,
) -> None:
    """Print a run's stream from an offset: one line per value, in offset order."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        reader = StreamReader(store, key, name, start, follow=follow)
        for item in reader:
            if as_json:
                line = {"offset": item.offset, "value": untag(item.value), "attempt": item.attempt}
                typer.echo(json.dumps(line, default=str))
            else:
                typer.echo(f"{item.offset}  {visible(_shown(item.value))}")
        outcome = reader.outcome if follow else run_outcome(store, key)
    ended = {
        "next_offset": reader.next_offset,
        "ended": None if outcome is None else outcome.status,
    }
    if as_json:
        typer.echo(json.dumps(ended))
    elif outcome is not None:
        why = f" ({outcome.error})" if outcome.error else ""
        typer.echo(visible(f"-- run {key} ended {outcome.status}{why}"), err=True)
    else:
        typer.echo(f"-- next offset {reader.next_offset} (the run goes on)", err=True)


# -- schedules -----------------------------------------------------------------------------
schedules_app = typer.Typer(
    help="List the schedules in a store; pause, resume or delete one.",
    no_args_is_help=False,
    invoke_without_command=True,
)


def _when(moment: Any) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")


@schedules_app.callback()
def schedules_cmd(
    ctx: typer.Context,
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List the schedules (or: schedules pause|resume|delete NAME)."""
    if ctx.invoked_subcommand is not None:
        return
    with open_store(db, url, debug=debug) as store:
        found = list_schedules(store)
    if as_json:
        out = [
            {
                **dataclasses.asdict(info),
                "next_tick": info.next_tick.isoformat(),
                "last_tick": None if info.last_tick is None else info.last_tick.isoformat(),
            }
            for info in found
        ]
        typer.echo(json.dumps(out))
        return
    console = visible_console()
    if not found:
        console.print("no schedules")
        return
    table = Table(title=f"{len(found)} schedule{'' if len(found) == 1 else 's'}")
    for column in ("name", "cron", "target", "queue", "state", "next tick", "last tick"):
        table.add_column(column)
    for info in found:
        cron = info.cron if info.timezone == "UTC" else f"{info.cron} ({info.timezone})"
        state = "paused" if info.paused else f"active, catch_up={info.catch_up}"
        table.add_row(
            info.name,
            cron,
            info.target,
            info.queue,
            state,
            "-" if info.paused else _when(info.next_tick),
            _when(info.last_tick),
        )
    console.print(table)


def _change(what: str, name: str, db: Any, url: Any, as_json: bool, debug: bool) -> None:
    with open_store(db, url, debug=debug) as store:
        handle = Schedule(store, name)
        if what == "delete":
            if not handle.delete():
                fail(f"no schedule {name!r}; `stepstone schedules` lists them")
        else:
            getattr(handle, what)()
    done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[what]
    if as_json:
        typer.echo(json.dumps({"name": name, "done": done}))
    else:
        typer.echo(visible(f"schedule {name} {done}"))


@schedules_app.command("pause")
def schedules_pause(
    name: Annotated[str, typer.Argument(help="The schedule's name.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Pause a schedule: it queues no run until resumed."""
    _change("pause", name, db, url, as_json, debug)


@schedules_app.command("resume")
def schedules_resume(
    name: Annotated[str, typer.Argument(help="The schedule's name.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Resume a schedule from its next tick after now (ticks while paused are skipped)."""
    _change("resume", name, db, url, as_json, debug)


@schedules_app.command("delete")
def schedules_delete(
    name: Annotated[str, typer.Argument(help="The schedule's name.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Delete a schedule (the runs it queued stay)."""
    _change("delete", name, db, url, as_json, debug)
