"""``stepstone demo``, ``inspect`` and ``runs``, and the one-line failures they share.

The module is imported when one of its commands runs (see ``stepstone.cli``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from stepstone.cli import _debug as _debug_state
from stepstone.cli import _fail
from stepstone.cli._options import UsageFailure, check_sort, split_values, whole, wrong_statuses
from stepstone.cli._render import (
    entry_json,
    named_key,
    render_entry,
    render_runs,
    visible_console,
)
from stepstone.cli._runs import select_runs
from stepstone.durable import database_now
from stepstone.engines._views import BUILTIN_KINDS
from stepstone.exceptions import StepstoneError, StoreError
from stepstone.store import Store

__all__ = ["demo", "inspect", "runs"]

F = TypeVar("F", bound=Callable[..., Any])

DbOption = Annotated[
    Path | None, typer.Option("--db", help="SQLite store file (opened read-only).")
]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Store URL: postgresql://... or sqlite:///path (read-only)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error.")]


def _fails_in_one_line(fn: F) -> F:
    """Turn any error of ``fn`` into one ``error: ...`` line (the traceback with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("debug"):
            _debug_state.state["on"] = True
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except UsageFailure as exc:
            if _debug_state.asked():
                raise
            _fail(str(exc), 2)
        except Exception as exc:  # the CLI reports every error in one line
            if _debug_state.asked():
                raise
            _fail(_message(exc), 1)

    return wrapper  # type: ignore[return-value]


def _message(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, StepstoneError | ValueError | LookupError):
        return text
    return f"{type(exc).__name__}: {text}"


def _open_store(db: Path | None, url: str | None) -> Store:
    if (db is None) == (url is None):
        raise UsageFailure("pass exactly one of --db PATH or --url URL (see --help)")
    return Store(db=db, url=url, read_only=True)


@_fails_in_one_line
def demo(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help="SQLite file to keep (the graph story's file goes next to it); "
            "default: a temporary directory, removed at the end.",
        ),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Run the ETL crash/resume story (and the lunar-mission graph story) offline."""
    from stepstone.demos import run_demo

    run_demo(Console(), db)


@_fails_in_one_line
def inspect(
    key: Annotated[str, typer.Argument(help="The checkpoint key (or any store key).")],
    db: DbOption = None,
    url: UrlOption = None,
    history: Annotated[bool, typer.Option(help="Show the step history table.")] = True,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Print a checkpoint (status, next step, completed steps, kv keys, history) or a value."""
    with _open_store(db, url) as store:
        key = named_key(store, key)
        try:
            entry = store.read_entry(key)
        except Exception as exc:
            if key in str(exc):
                raise
            # A decoding error deep in a driver does not know which record it was reading.
            raise StoreError(f"cannot read key {key!r} in {store!r}: {_message(exc)}") from exc
        if entry is None:
            near = store.keys(prefix=key[:3]) if key else []
            hint = f"; keys starting like it: {', '.join(near[:10])}" if near else ""
            raise LookupError(f"no key {key!r} in {store!r}{hint}")
        if as_json:
            typer.echo(json.dumps(entry_json(entry), default=str, ensure_ascii=False))
        else:
            render_entry(visible_console(markup=True), entry, history=history)


def _age(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    from stepstone.durable._retention import parse_age

    try:
        return parse_age(value).total_seconds()
    except ValueError as exc:
        raise UsageFailure(f"{option} {value!r}: {exc}") from None


@_fails_in_one_line
def runs(
    db: DbOption = None,
    url: UrlOption = None,
    prefix: Annotated[str | None, typer.Option(help="Only keys starting with this.")] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(help="Only runs in this status (repeat it, or comma-separate)."),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            help="Only runs of this kind: plan, graph, agent, replan, workflow (repeat it)."
        ),
    ] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Only runs last updated longer ago (30d, 12h, 15m).")
    ] = None,
    newer_than: Annotated[
        str | None, typer.Option(help="Only runs updated within this age (1h, 2d).")
    ] = None,
    sort: Annotated[
        str, typer.Option(help="key (A-Z), updated or created (most recent first).")
    ] = "key",
    limit: Annotated[
        int | None,
        typer.Option(parser=whole(1), metavar="N", help="Show at most N runs (a page)."),
    ] = None,
    offset: Annotated[
        int,
        typer.Option(parser=whole(0), metavar="M", help="Skip the first M matching runs."),
    ] = 0,
    as_json: JsonOption = False,
    with_total: Annotated[
        bool,
        typer.Option(
            "--with-total",
            help='With --json: print {"total": N, "runs": [...]}, N the runs matching on every '
            "page, instead of the bare list.",
        ),
    ] = False,
    debug: DebugOption = False,
) -> None:
    """List the durable runs in a store, with their owner's state (live or dead)."""
    older, newer = _age(older_than, "--older-than"), _age(newer_than, "--newer-than")
    kinds, statuses = split_values(kind), split_values(status)
    wrong = wrong_statuses(statuses)
    if wrong is not None:
        raise wrong
    check_sort(sort)
    with _open_store(db, url) as store:
        now = database_now(store)  # owners are judged by the database's clock
        total, lines = select_runs(
            store,
            prefix,
            statuses=statuses,
            kinds=kinds,
            older_than=older,
            newer_than=newer,
            sort=sort,
            limit=limit,
            offset=offset,
            now=now,
        )
    odd = [k for k in kinds if k not in BUILTIN_KINDS]
    if odd and total == 0:
        # Not an error: an engine of the user's own journals runs of its own kind.
        typer.echo(
            f"note: no run has kind {', '.join(map(repr, odd))}; stepstone's kinds are "
            f"{', '.join(BUILTIN_KINDS)}",
            err=True,
        )  # repr: the kinds as typed, each character visible
    if as_json:
        # A bare list by default: scripts written for it keep working.
        listed = [line.to_json(now) for line in lines]
        out: Any = {"total": total, "runs": listed} if with_total else listed
        typer.echo(json.dumps(out, default=str))
    else:
        # One line per run, keys whole: a row wider than the terminal wraps on it.
        render_runs(Console(highlight=False), lines, now=now, total=total, offset=offset)
