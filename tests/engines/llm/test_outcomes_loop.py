"""The loop's side of outcomes on scripted models: structured output in a stream, the
stream's final result, and tool timeouts on sync tools whose thread cannot be stopped."""

from __future__ import annotations

import asyncio
import threading
import time

from pydantic import BaseModel

from stepstone import Agent, EventType, LLMEngine, Session
from stepstone.engines.llm import last_stream_result
from stepstone.testing import FakeModel, Reply, call


class Verdict(BaseModel):
    label: str


async def test_stream_with_output_sends_only_the_validated_answer() -> None:
    # guarantee 215
    model = FakeModel(
        ['{"label": 1', Reply(text='{"label": "spam"}', chunks=['{"label"', ': "spam"}'])]
    )
    agent = Agent(engine=LLMEngine(model), output=Verdict)
    tokens = [t async for t in agent.stream("classify")]
    assert "".join(tokens) == '{"label": "spam"}'  # the failed attempt never went out
    result = last_stream_result()
    assert result is not None and result.payload == Verdict(label="spam")
    assert result.metadata["stop_reason"] == "stop"
    assert result.metadata["turns"] == 2 and result.metadata["usage"]["requests"] == 2


async def test_stream_result_for_plain_text() -> None:
    model = FakeModel([Reply(text="hello there", usage=None)])
    tokens = [t async for t in Agent(engine=LLMEngine(model)).stream("hi")]
    result = last_stream_result()
    assert result is not None and result.payload == "".join(tokens) == "hello there"
    assert result.metadata["raw_stop_reason"] == "stop"


async def test_sync_tool_timeout_says_it_still_runs_and_logs_the_late_outcome() -> None:
    # guarantee 216
    done = threading.Event()
    effects: list[str] = []

    def charge(amount: int) -> str:
        """Charge a card."""
        time.sleep(0.5)
        effects.append(f"charged {amount}")
        done.set()
        return "charged"

    model = FakeModel([call("charge", amount=5), "I could not confirm the charge."])
    session = Session()
    agent = Agent(engine=LLMEngine(model, tool_timeout=0.1), tools=[charge], session=session)
    env = await agent.run("charge 5")
    assert env.ok, env.error
    result = model.requests[1].messages[-1].tool_results[0]
    assert result.is_error and "ToolTimeoutError" in result.content
    assert "still running" in result.content and "do not simply call it again" in result.content
    assert await asyncio.to_thread(done.wait, 10)
    for _ in range(200):  # the late outcome is reported from the loop once the thread ends
        if session.of_type(EventType.TOOL_LATE_RESULT):
            break
        await asyncio.sleep(0.02)
    (late,) = session.of_type(EventType.TOOL_LATE_RESULT)
    assert late.payload["tool"] == "charge" and late.payload["ok"] is True
    assert late.payload["result"] == "charged"
    assert effects == ["charged 5"]


async def test_async_tool_timeout_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def slow() -> str:
        """Wait."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    model = FakeModel([call("slow"), "gave up"])
    env = await Agent(engine=LLMEngine(model, tool_timeout=0.05), tools=[slow]).run("q")
    assert env.payload == "gave up"
    content = model.requests[1].messages[-1].tool_results[0].content
    assert "was cancelled" in content
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_a_custom_providers_model_api_error_is_retried_as_it_says() -> None:
    from stepstone import ModelAPIError, ModelOverloadedError

    busy = ModelOverloadedError("busy", provider="mine", kind="overloaded", retryable=True)
    final = ModelAPIError("bad key", provider="mine", kind="auth", retryable=False)
    model = FakeModel([busy, "ok", final, "never"])
    agent = Agent(engine=LLMEngine(model, retry_delay=0.001))
    assert (await agent.run("q")).payload == "ok"
    env = await agent.run("q")
    assert env.error is not None and env.error.type == "ModelAPIError"
    assert model.remaining == 1  # the permanent one was not retried
