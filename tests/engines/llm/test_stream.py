"""Streaming: tokens across tool turns, stalls, backpressure, cancellation (guarantee 81, 85)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from stepstone import Agent, EventType, LLMEngine, Session, StreamStallError
from stepstone.core import Envelope
from stepstone.testing import FakeModel, Reply, TransientModelError, call


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


async def test_tokens_flow_across_tool_turns() -> None:  # guarantee 85
    model = FakeModel(
        [
            Reply(text="Let me add. ", tool_calls=[call("add", a=1, b=2)]),
            Reply(text="The sum is 3."),
        ]
    )
    session = Session()
    agent = Agent(engine=LLMEngine(model), tools=[add], session=session)
    tokens = [t async for t in agent.stream("1+2")]
    assert "".join(tokens) == "Let me add. The sum is 3."
    assert len(tokens) > 2
    assert model.requests[1].messages[-1].tool_results[0].content == "3"
    kinds = [e.type for e in session.events]
    assert kinds[0] == EventType.AGENT_START and kinds[-1] == EventType.AGENT_FINISH
    finish = session.of_type(EventType.AGENT_FINISH)[0]
    assert finish.payload["cancelled"] is False and finish.payload["ok"] is True
    assert session.of_type(EventType.MODEL_REQUEST)[0].payload["stream"] is True


async def test_idle_gap_raises_stream_stall_error() -> None:  # guarantee 81
    model = FakeModel([Reply(text="one two three four", stall_after=2)])
    agent = Agent(engine=LLMEngine(model, stream_idle_timeout=0.05))
    got: list[str] = []
    start = time.perf_counter()
    with pytest.raises(StreamStallError, match=r"stream_idle_timeout=0\.05"):
        async for token in agent.stream("q"):
            got.append(token)
    assert got == ["one ", "two "]
    assert time.perf_counter() - start < 1
    assert len(model.requests) == 1  # text already reached the consumer: no retry


async def test_stall_before_any_text_is_retried() -> None:  # guarantee 81
    model = FakeModel([Reply(text="lost", stall_after=0), Reply(text="second try")])
    agent = Agent(engine=LLMEngine(model, stream_idle_timeout=0.05, retry_delay=0.001))
    assert [t async for t in agent.stream("q")] == ["second ", "try"]
    assert len(model.requests) == 2


async def test_slow_but_steady_stream_is_not_a_stall() -> None:  # guarantee 81
    chunks = [f"t{i} " for i in range(8)]
    model = FakeModel([Reply(chunks=chunks, chunk_delay=0.15)])
    agent = Agent(engine=LLMEngine(model, stream_idle_timeout=1.0))
    # 8 chunks * 150 ms > the idle timeout in total, but no single gap comes near it
    assert [t async for t in agent.stream("q")] == chunks


async def test_no_idle_timeout_waits() -> None:  # guarantee 77
    with pytest.warns(UserWarning):
        engine = LLMEngine(
            FakeModel([Reply(chunks=["a", "b"], chunk_delay=0.05)]), stream_idle_timeout=None
        )
    assert [t async for t in Agent(engine=engine).stream("q")] == ["a", "b"]


async def test_consumer_break_cancels_the_loop() -> None:  # guarantee 85, 410
    ran: list[str] = []

    async def tool_after() -> str:
        """Should never run: the consumer left before the tool turn."""
        ran.append("tool")
        return "x"

    chunks = [f"w{i} " for i in range(200)]
    model = FakeModel(
        [Reply(chunks=chunks, tool_calls=[call("tool_after")], chunk_delay=0.001), "never"]
    )
    session = Session()
    agent = Agent(engine=LLMEngine(model, stream_buffer=2), tools=[tool_after], session=session)
    got = []
    async with contextlib.aclosing(agent.stream("q")) as stream:
        async for token in stream:
            got.append(token)
            if len(got) == 3:
                break
    assert got == chunks[:3]
    await asyncio.sleep(0.02)
    assert model.cancelled == 1
    assert ran == []
    assert len(model.requests) == 1
    finish = session.of_type(EventType.AGENT_FINISH)
    assert len(finish) == 1 and finish[0].payload["cancelled"] is True


async def test_engine_stream_break_without_aclosing_also_cancels() -> None:  # guarantee 85
    model = FakeModel([Reply(chunks=[f"{i} " for i in range(500)], chunk_delay=0.001)])
    engine = LLMEngine(model, stream_buffer=1)
    session = Session()
    gen = engine.stream(
        Envelope.from_task("q"), tools=[], output_type=str, memory=None, session=session
    )
    async for _ in gen:
        break
    await gen.aclose()
    assert model.cancelled == 1
    assert session.of_type(EventType.AGENT_FINISH)[0].payload["cancelled"] is True


async def test_bounded_buffer_applies_backpressure() -> None:  # stream_buffer bounds the queue
    produced = 0
    chunks = [f"c{i}" for i in range(50)]

    class CountingModel(FakeModel):
        async def stream(self, request):  # type: ignore[no-untyped-def,override]
            nonlocal produced
            async for item in super().stream(request):
                if isinstance(item, str) and item:
                    produced += 1
                yield item

    model = CountingModel([Reply(chunks=chunks)])
    agent = Agent(engine=LLMEngine(model, stream_buffer=4))
    stream = agent.stream("q")
    first = await anext(stream)
    assert first == "c0"
    await asyncio.sleep(0.05)  # a slow consumer: the producer must wait, not run ahead
    # queue (4) + the one handed over + at most one blocked in put()
    assert produced <= 4 + 2
    rest = [t async for t in stream]
    assert [first, *rest] == chunks


async def test_errors_reach_the_stream_consumer() -> None:
    model = FakeModel([ValueError("bad request")])
    with pytest.raises(ValueError, match="bad request"):
        async for _ in Agent(engine=LLMEngine(model)).stream("q"):
            pass
    model = FakeModel([TransientModelError("busy", retry_after=0), "fine"])
    assert [t async for t in Agent(engine=LLMEngine(model)).stream("q")] == ["fine"]


async def test_max_turns_in_stream_raises() -> None:
    model = FakeModel([call("add", a=1, b=1)], repeat_last=True)
    agent = Agent(engine=LLMEngine(model, max_turns=2), tools=[add])
    with pytest.raises(Exception, match="max_turns=2") as info:
        async for _ in agent.stream("q"):
            pass
    assert type(info.value).__name__ == "MaxTurnsExceeded"
