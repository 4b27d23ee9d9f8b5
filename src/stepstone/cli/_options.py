"""Reading the values of options: a value an option does not take is a wrong command line.

Each failure here names the option, the value and what the option takes, and ends the
command with one ``error:`` line and exit status 2 (the command group prints it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from stepstone.cli._debug import asked
from stepstone.exceptions import StepstoneError
from stepstone.store import Store

__all__ = [
    "DbOption",
    "DebugOption",
    "JsonOption",
    "OpsError",
    "UrlOption",
    "UsageFailure",
    "check_sort",
    "fail",
    "open_store",
    "seconds",
    "split_values",
    "whole",
    "wrong_statuses",
]

DbOption = Annotated[Path | None, typer.Option("--db", help="SQLite store file.")]
UrlOption = Annotated[
    str | None, typer.Option("--url", help="Store URL (postgresql://... or sqlite:///...).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback on failure.")]


def split_values(values: list[str] | None) -> tuple[str, ...]:
    """The values of a repeatable option, each occurrence also split at commas
    (``--status done,failed`` is ``--status done --status failed``)."""
    return tuple(v.strip() for raw in values or () for v in raw.split(",") if v.strip())


class OpsError(Exception):
    """A failure worth one line: the message names the bad value and the fix."""


def fail(message: str, code: int = 1) -> None:
    """Print ``error: message`` on stderr and exit with status ``code`` (1: the command
    failed; 2: a wrong command line)."""
    from stepstone.cli._render import visible

    typer.echo(f"error: {visible(message)}", err=True)  # stored text quoted in it, made visible
    raise typer.Exit(code)


@contextmanager
def open_store(
    db: Path | None, url: str | None, *, debug: bool = False, read_only: bool = False
) -> Iterator[Store]:
    """The store named by ``--db``/``--url``; any failure inside becomes one line.

    ``read_only`` for commands that only look: nothing is created, migrated or written.
    Commands that write first check, read-only, that the file or database already is a
    stepstone store, so they never create tables in someone else's database.
    """
    if (db is None) == (url is None):
        fail("pass exactly one of --db FILE or --url URL (see --help)", 2)
    if db is not None and not db.exists():
        fail(f"no store file at {str(db)!r}; check the path (stepstone never creates one here)")
    store: Store | None = None
    try:
        if not read_only:
            probe = Store(db=db, url=url, read_only=True)
            try:
                probe.setup()  # PostgreSQL connects here, and checks the schema is stepstone's
            finally:
                probe.close()
        store = Store(db=db, url=url, read_only=read_only)
        yield store
    except typer.Exit:
        raise
    except (
        StepstoneError,
        OpsError,
        ValueError,
        TypeError,
        KeyError,
        OSError,
        RuntimeError,
    ) as exc:
        if asked(debug):
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        fail(" ".join(str(msg).split()))
    finally:
        if store is not None:
            store.close()


class UsageFailure(Exception):
    """A wrong command line found after the options were parsed: exit status 2."""


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A parser for an option taking a whole number from ``minimum`` to ``maximum``."""
    takes = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def parse(value: str | int) -> int:
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            number = minimum - 1
        if number < minimum or (maximum is not None and number > maximum):
            raise typer.BadParameter(f"{text!r} is not a whole number {takes}")
        return number

    return parse


def seconds() -> Callable[[str], float]:
    """A parser for an option taking a finite number of seconds ``> 0``."""

    def parse(value: str | float) -> float:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise typer.BadParameter(f"{text!r} is not a number of seconds > 0")
        return number

    return parse


def wrong_statuses(statuses: tuple[str, ...]) -> UsageFailure | None:
    """The failure for ``--status`` values that are not a run's status, or None."""
    from stepstone.store._base import RUN_STATUSES

    bad = [s for s in statuses if s not in RUN_STATUSES]
    if not bad:
        return None
    return UsageFailure(
        f"--status: unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}"
    )


def check_sort(sort: str) -> None:
    """Raise UsageFailure for a ``--sort`` that is not one of the kernel's ``SORTS``."""
    from stepstone.durable._inspect import SORTS

    if sort not in SORTS:
        raise UsageFailure(f"--sort: unknown sort {sort!r}; pass one of {', '.join(SORTS)}")
