"""Argument checks shared by every layer (one wording for one kind of bad value)."""

from __future__ import annotations

import contextlib
import math

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError

__all__ = ["check_bool", "check_number", "positive_seconds"]


def positive_seconds(name: str, value: object) -> float:
    """``value`` as a duration in seconds: a finite int or float above zero.

    Raises:
        ConfigurationTypeError: ``value`` is not a number (a bool is not one either).
        ConfigurationError: ``value`` is zero, negative, NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationTypeError(
            f"{name} must be a number of seconds (int or float), got {value!r}"
        )
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


#: Text a caller may have meant as a bool (``"no"`` is truthy: never guessed from bool()).
_BOOL_WORDS = {
    "true": True,
    "yes": True,
    "on": True,
    "1": True,
    "false": False,
    "no": False,
    "off": False,
    "0": False,
}


def check_bool(option: str, value: object) -> bool:
    """``value`` when it is ``True`` or ``False``; ``option`` names it as the caller wrote it
    (``"RunnerConfig(checkpoint_async_writes=...)"``).

    Raises:
        ConfigurationTypeError: anything else (``"no"``, ``0``, ``None``...), naming the
            option, the value and the bool to pass instead.
    """
    if isinstance(value, bool):
        return value
    meant = _BOOL_WORDS.get(value.strip().lower()) if isinstance(value, str) else None
    if meant is None and type(value) is int and value in (0, 1):
        meant = bool(value)
    fix = "True or False" if meant is None else _with_value(option, meant)
    raise ConfigurationTypeError(
        f"{option} must be True or False, got {value!r} ({type(value).__name__}); pass a "
        f"bool, not text or a number: {fix}"
    )


def check_number(
    option: str,
    value: object,
    *,
    integer: bool = False,
    least: float = 0,
    inclusive: bool = True,
    example: float = 5,
) -> float:
    """``value`` when it is a number (an ``int`` with ``integer=True``; a bool is neither) at
    least ``least`` (above it when not ``inclusive``), never NaN; ``option`` names it as the
    caller wrote it.

    Raises:
        ConfigurationTypeError: ``value`` is not a number of that kind (``"5"``), naming the
            option, the value and a number to pass instead (``example``).
        ConfigurationError: ``value`` is out of range, or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        what = "an int" if integer else "a number"
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            parsed = float(value) if isinstance(value, str) else None  # "5" meant 5
            if parsed is not None and math.isfinite(parsed):
                example = int(parsed) if integer or parsed.is_integer() else parsed
        raise ConfigurationTypeError(
            f"{option} must be {what}, got {value!r} ({type(value).__name__}); pass the "
            f"number itself, e.g. {_with_value(option, example)}"
        )
    if math.isnan(value) or (value < least if inclusive else value <= least):
        bound = f">= {least:g}" if inclusive else f"> {least:g}"
        raise ConfigurationError(f"{option} must be {bound}, got {value!r}")
    return value


def _with_value(option: str, value: object) -> str:
    """``option`` written with ``value``: ``"f(x=...)"`` as ``f(x=5)``, ``"x"`` as ``x=5``."""
    return option.replace("...", repr(value)) if "..." in option else f"{option}={value!r}"
