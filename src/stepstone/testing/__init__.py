"""Testing helpers for users' own tests: scripted models, request blocking, loopback servers.

Scripted models stand in for a real provider; pass one where a model string goes::

    from stepstone import Agent, LLMEngine
    from stepstone.testing import FakeModel, FunctionModel, Reply, call

    model = FakeModel([
        call("get_weather", city="Paris"),               # turn 1: one tool call
        [call("a", x=1), call("b", y=2)],                # turn 2: two calls, run concurrently
        Reply(text="Sunny, 21C", chunk_delay=0.01),      # turn 3: final answer (streamed
    ])                                                   #   word by word by agent.stream())
    agent = Agent(engine=LLMEngine(model), tools=[get_weather, a, b])
    env = agent("weather in Paris?")
    env.payload                                          # "Sunny, 21C"
    model.requests[1].messages[-1].tool_results          # what the tools returned

Script items, one per model turn:

- ``"text"``: a final answer.
- ``call("tool", **arguments)``: one tool call; a list of calls: several in one turn.
- a ``dict`` or pydantic model: a JSON answer (for ``Agent(..., output=Model)``).
- ``Reply(text=..., tool_calls=[...], chunks=[...], delay=..., chunk_delay=...,
  stall_after=..., usage=Usage(...))``: every option.
- an exception instance: raised on that turn. ``TransientModelError("busy", retry_after=0)``
  is retried by the engine like a 429; other exceptions end the run with an error envelope.

``FunctionModel(fn)`` computes each turn: ``fn(request)`` gets the
:class:`~stepstone.providers.ModelRequest` and returns a script item (sync or async).

``block_model_requests()`` (a context manager, or the ``STEPSTONE_BLOCK_MODEL_REQUESTS=1``
environment variable) makes every real provider request raise
:class:`~stepstone.providers.ModelRequestsBlockedError`; requests to loopback addresses
(:class:`LoopbackServer`, which speaks a provider's wire format to the official SDKs)
are still allowed.

``stepstone.testing.store_conformance`` is the store conformance suite, and
``stepstone.testing.checkpointer_conformance`` the graph checkpointer one (see their
docstrings).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from stepstone.providers._base import ModelRequestsBlockedError, set_blocked
from stepstone.testing._dialects import (
    SSE,
    AnthropicDialect,
    Dialect,
    GoogleDialect,
    Hang,
    OpenAIDialect,
    RecordedRequest,
    Reset,
    Respond,
)
from stepstone.testing._loopback import LoopbackServer
from stepstone.testing._scripted import (
    FakeModel,
    FunctionModel,
    Reply,
    ScriptExhaustedError,
    TransientModelError,
    call,
)

__all__ = [
    "SSE",
    "AnthropicDialect",
    "Dialect",
    "FakeModel",
    "FunctionModel",
    "GoogleDialect",
    "Hang",
    "LoopbackServer",
    "ModelRequestsBlockedError",
    "OpenAIDialect",
    "RecordedRequest",
    "Reply",
    "Reset",
    "Respond",
    "ScriptExhaustedError",
    "TransientModelError",
    "block_model_requests",
    "call",
]


@contextlib.contextmanager
def block_model_requests() -> Iterator[None]:
    """Forbid real model requests inside the block (loopback addresses stay allowed).

    Example::

        with block_model_requests():
            Agent("claude-sonnet-4-6")("hi")   # raises ModelRequestsBlockedError
    """
    set_blocked(True)
    try:
        yield
    finally:
        set_blocked(False)
