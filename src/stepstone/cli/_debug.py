"""Whether this command line asked for tracebacks instead of one-line errors: ``--debug``
before the command or after it, or ``STEPSTONE_DEBUG=1`` in the environment."""

from __future__ import annotations

import os

__all__ = ["asked", "state"]

#: set by the app's own ``--debug`` (before the command)
state = {"on": False}


def asked(flag: bool = False) -> bool:
    """True when tracebacks were asked for: ``flag`` (the command's own ``--debug``), the
    app's ``--debug``, or ``STEPSTONE_DEBUG``."""
    return flag or state["on"] or os.environ.get("STEPSTONE_DEBUG", "") not in ("", "0")
