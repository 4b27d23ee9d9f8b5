"""Where an LLM loop sends its text as it comes when a caller up the stack streams the run
(``Plan.stream``): a context variable, so the step functions in between need not pass it.

An engine streaming a run binds a sink with :func:`send_tokens_to`; the first LLM loop below
takes it with :func:`claim_tokens`, which hides it from what that loop calls (a tool that is
itself an agent streams nothing into the caller's stream).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator

__all__ = ["TokenSink", "claim_tokens", "send_tokens_to"]

#: ``await sink(text)`` for each piece of text an LLM loop produces.
TokenSink = Callable[[str], Awaitable[None]]

_SINK: contextvars.ContextVar[TokenSink | None] = contextvars.ContextVar(
    "stepstone_token_sink", default=None
)


@contextlib.contextmanager
def send_tokens_to(sink: TokenSink | None) -> Iterator[None]:
    """Send the text of the LLM loop run inside the block to ``sink`` (None: nowhere)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


@contextlib.contextmanager
def claim_tokens() -> Iterator[TokenSink | None]:
    """The sink bound above, if any, for the LLM loop that runs inside the block; what the
    loop calls meanwhile sees none."""
    sink = _SINK.get()
    if sink is None:
        yield None
        return
    token = _SINK.set(None)
    try:
        yield sink
    finally:
        _SINK.reset(token)
