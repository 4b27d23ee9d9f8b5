"""``stepstone send``, ``events`` and ``stream``: messages to a run, its events and its
streams, from the command line.

``send`` writes (one message; the store must already be a stepstone store); ``events``
and ``stream`` only read (the store is opened read-only).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from stepstone.cli._ops import (
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

__all__ = ["register"]


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


def register(app: typer.Typer) -> None:
    """Add ``send``, ``events`` and ``stream`` to ``app``."""
    app.command("send")(send_cmd)
    app.command("events")(events_cmd)
    app.command("stream")(stream_cmd)
