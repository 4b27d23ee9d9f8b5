"""An HTTP 200 whose body is not valid JSON (cut off, or damaged on the way), through each
official SDK against a loopback server: retried like a connection reset, then a retryable
``ModelAPIError`` naming the provider, the model and the turn."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, LLMEngine, ModelAPIError, Runner, Store, tool
from stepstone.testing import SSE, Respond, call
from tests.providers.conftest import Case, WireServer

#: A stream event cut off in its JSON, as each provider's stream would carry it.
CUT_EVENT: dict[str, tuple[str | None, str]] = {
    "openai": (None, '{"id": "x", "object": "chat.completion.chunk", "cho'),
    "anthropic": ("message_start", '{"type": "message_start", "mess'),
    "google": (None, '{"candidates": [{"content": {"parts": [{"te'),
}


def agent_for(case: Case, server: WireServer, **options: Any) -> Agent:
    options.setdefault("retry_delay", 0.01)
    engine = LLMEngine(case.model, provider=case.provider(server.base_url), **options)
    server.engines.append(engine)
    return Agent(engine=engine)


async def test_a_cut_off_body_is_retried(case: Case, server: WireServer) -> None:
    # guarantee 219
    server.push(server.dialect.malformed(), "the answer")
    env = await agent_for(case, server).run("q")
    assert env.ok, env.error
    assert env.payload == "the answer"
    assert len(server.requests) == 2


async def test_a_body_whose_content_type_is_not_json_is_retried(
    case: Case, server: WireServer
) -> None:
    # guarantee 219
    page = Respond(status=200, body=b"<html>gateway</html>", content_type="text/html")
    server.push(page, "the answer")
    env = await agent_for(case, server).run("q")
    assert env.ok, env.error
    assert env.payload == "the answer"
    assert len(server.requests) == 2


async def test_a_cut_off_stream_event_before_text_is_retried(
    case: Case, server: WireServer
) -> None:
    # guarantee 219
    server.push(SSE(events=[CUT_EVENT[case.name]]), "second try")
    tokens = [t async for t in agent_for(case, server).stream("q")]
    assert "".join(tokens) == "second try"
    assert len(server.requests) == 2


async def test_cut_off_bodies_past_the_retries_are_a_retryable_model_api_error(
    case: Case, server: WireServer
) -> None:
    # guarantee 219
    server.push(*[SSE(events=[CUT_EVENT[case.name]])] * 3)
    with pytest.raises(ModelAPIError) as info:
        async for _ in agent_for(case, server, max_retries=2).stream("q"):
            pass
    error = info.value
    assert len(server.requests) == 3  # the first try and 2 retries
    assert error.kind == "invalid_response" and error.retryable
    assert (error.provider, error.model, error.status) == (case.name, case.model, 200)
    message = str(error)
    assert case.name in message and repr(case.model) in message
    assert "not valid JSON" in message and "turn 0" in message
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.kind, clone.retryable, str(clone)) == (error.kind, True, message)


async def test_cut_off_bodies_past_the_retries_end_run_retryable(
    case: Case, server: WireServer
) -> None:
    # guarantee 219
    server.push(*[server.dialect.malformed()] * 3)
    env = await agent_for(case, server, max_retries=2).run("q")
    assert len(server.requests) == 3
    assert env.error is not None and env.error.type == "ModelAPIError"
    assert env.error.retryable
    assert f"{case.name} request for {case.model!r} failed (invalid_response" in env.error.message
    assert "not valid JSON" in env.error.message and "turn 0" in env.error.message


async def test_a_runner_run_failing_on_cut_off_bodies_resumes(
    case: Case, server: WireServer, tmp_path: Path
) -> None:
    # guarantee 219
    done: list[str] = []

    @tool
    def append(x: str) -> str:
        """Append x."""
        done.append(x)
        return "ok"

    server.push(call("append", x="1"), *[server.dialect.malformed()] * 3)
    engine = LLMEngine(
        case.model, provider=case.provider(server.base_url), retry_delay=0.01, max_retries=2
    )
    server.engines.append(engine)
    agent = Agent(name="e", engine=engine, tools=[append])
    with Store(db=tmp_path / "runs.sqlite") as store:
        runner = Runner(store=store)
        first = await runner.run(agent, user_message="go", run_id="r", thread_id="t")
        assert first.state == "failed" and first.error is not None
        assert first.error["type"] == "ModelAPIError" and first.error.get("retryable") is True
        assert "not valid JSON" in first.error["message"]
        assert len(server.requests) == 4
        server.push("final")
        resumed = await runner.resume(agent, run_id="r", thread_id="t")
    assert resumed.state == "completed" and resumed.final_text == "final"
    assert done == ["1"]  # the tool call before the failure is not run again
    assert len(server.requests) == 5
