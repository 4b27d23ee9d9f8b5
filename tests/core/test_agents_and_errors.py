"""Engines are not mutated by the Agents holding them; retryability is set by the code that
raises, with one documented default for builtin exceptions."""

from __future__ import annotations

import asyncio

import pytest

from stepstone import Agent, Envelope, EventType, LLMEngine, PlanPaused, Session
from stepstone.core._envelope import TRANSIENT_BUILTINS, is_retryable
from stepstone.testing import FakeModel, TransientModelError


async def test_two_agents_sharing_one_engine_keep_their_own_names() -> None:
    # guarantee 134
    engine = LLMEngine(FakeModel(["a1", "b1", "a2", "b2"]))
    session = Session()
    alpha = Agent(engine=engine, name="alpha", session=session)
    beta = Agent(engine=engine, name="beta", session=session)
    before = dict(vars(engine))
    assert (await alpha.run("q")).ok and (await beta.run("q")).ok
    assert vars(engine) == before  # the engine was not written to
    starts = session.of_type(EventType.AGENT_START)
    names = [e.payload["agent_name"] for e in starts]
    assert names == ["alpha", "beta"]
    # Concurrent runs of both agents keep their names too.
    session2 = Session()
    engine2 = LLMEngine(FakeModel(["x"] * 8))
    agents = [Agent(engine=engine2, name=f"n{i}", session=session2) for i in range(4)]
    await asyncio.gather(*(a.run("q") for a in agents))
    got = sorted(e.payload["agent_name"] for e in session2.of_type(EventType.AGENT_START))
    assert got == ["n0", "n1", "n2", "n3"]


async def test_stream_reports_the_streaming_agents_name() -> None:
    # guarantee 134
    engine = LLMEngine(FakeModel(["hello", "world"]))
    session = Session()
    first = Agent(engine=engine, name="first", session=session)
    second = Agent(engine=engine, name="second", session=session)
    assert "".join([t async for t in first.stream("q")]) == "hello"
    assert "".join([t async for t in second.stream("q")]) == "world"
    names = [e.payload["agent_name"] for e in session.of_type(EventType.AGENT_START)]
    assert names == ["first", "second"]


async def test_exhausted_transient_model_error_is_reported_retryable() -> None:
    # guarantee 135
    model = FakeModel([TransientModelError("busy", retry_after=0)] * 4)
    env = await Agent(engine=LLMEngine(model, max_retries=2)).run("q")
    assert not env.ok and env.error is not None
    assert env.error.type == "TransientModelError" and env.error.retryable is True
    model = FakeModel([ValueError("bad request")])
    env = await Agent(engine=LLMEngine(model, max_retries=2)).run("q")
    assert env.error is not None and env.error.retryable is False


class Throttled(Exception):
    retryable = True


class NotAgain(TimeoutError):
    def __init__(self) -> None:
        super().__init__("gave up for good")
        self.retryable = False


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("x"), False),
        (TimeoutError("t"), True),
        (ConnectionResetError("c"), True),
        (Throttled("429"), True),
        (NotAgain(), False),
        (PlanPaused("later"), True),
        (RuntimeError("RateLimitError in the name is not a flag"), False),
    ],
)
def test_retryable_comes_from_the_exception(exc: BaseException, expected: bool) -> None:
    # guarantee 135
    assert is_retryable(exc) is expected
    env = Envelope.error_envelope(exc)
    assert env.error is not None and env.error.retryable is expected
    assert Envelope.error_envelope(exc, retryable=not expected).error.retryable is not expected  # type: ignore[union-attr]


def test_the_builtin_default_is_one_documented_tuple() -> None:
    assert (TimeoutError, ConnectionError) == TRANSIENT_BUILTINS
