"""What a test does when something it needs is missing from the machine.

A developer's machine may lack PostgreSQL's server binaries, Chromium or the right to mount
a tmpfs: those tests skip there, with the reason. CI installs all of them (``.ci/run``
sets ``CI=true``), so there a missing one fails the test instead: CI never skips silently.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["in_ci", "missing"]


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``, as ``.ci/run`` sets it)."""
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str, reason: str) -> NoReturn:
    """Skip the test (fail it under ``CI=true``): ``what`` cannot run here, ``reason``."""
    if in_ci():
        pytest.fail(f"CI=true but {what} cannot run: {reason}", pytrace=False)
    pytest.skip(reason)
