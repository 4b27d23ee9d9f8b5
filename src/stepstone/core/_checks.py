"""Argument checks shared by every layer (one wording for one kind of bad value)."""

from __future__ import annotations

import math

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError

__all__ = ["positive_seconds"]


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
