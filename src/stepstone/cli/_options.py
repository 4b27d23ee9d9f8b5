"""Reading the values of options: a value an option does not take is a wrong command line.

Each failure here names the option, the value and what the option takes, and ends the
command with one ``error:`` line and exit status 2 (the command group prints it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

from stepstone.durable._inspect import SORTS
from stepstone.store._base import RUN_STATUSES

__all__ = ["SORTS", "UsageFailure", "check_sort", "seconds", "whole", "wrong_statuses"]


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
    bad = [s for s in statuses if s not in RUN_STATUSES]
    if not bad:
        return None
    return UsageFailure(
        f"--status: unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}"
    )


def check_sort(sort: str) -> None:
    """Raise UsageFailure for a ``--sort`` that is not one of :data:`SORTS`."""
    if sort not in SORTS:
        raise UsageFailure(f"--sort: unknown sort {sort!r}; pass one of {', '.join(SORTS)}")
