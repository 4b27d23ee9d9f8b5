"""Who is running: the name of the Agent whose engine is executing, as a context variable.

An engine can be shared by several Agents (and run by them concurrently), so an Agent never
writes its name onto the engine: it sets this variable for the duration of its call, and
engines read it when they start a run. Tasks started inside the call inherit it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["current_agent_name", "running_agent"]

_AGENT_NAME: ContextVar[str | None] = ContextVar("stepstone_agent_name", default=None)


def current_agent_name() -> str | None:
    """The name of the Agent running the current engine call, None outside of one."""
    return _AGENT_NAME.get()


@contextlib.contextmanager
def running_agent(name: str) -> Iterator[None]:
    """Make :func:`current_agent_name` return ``name`` inside the block."""
    token = _AGENT_NAME.set(name)
    try:
        yield
    finally:
        _AGENT_NAME.reset(token)
