"""LoopbackServer and request blocking, from a user's point of view."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from stepstone import Agent, LLMEngine
from stepstone.providers import ModelRequestsBlockedError, OpenAIProvider, requests_blocked
from stepstone.testing import (
    SSE,
    LoopbackServer,
    OpenAIDialect,
    Respond,
    block_model_requests,
)


def post(url: str, body: dict[str, object]) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_records_requests_and_serves_raw_actions() -> None:
    with LoopbackServer(OpenAIDialect()) as server:
        server.push(
            Respond(status=201, body={"hello": "world"}, headers={"x-test": "1"}),
            SSE(events=[("greeting", {"n": 1}), (None, "[DONE]")]),
        )
        status, body, headers = post(server.url + "/anything", {"q": 1})
        assert (status, json.loads(body), headers["x-test"]) == (201, {"hello": "world"}, "1")
        status, body, headers = post(server.url + "/stream", {})
        assert headers["content-type"] == "text/event-stream"
        assert body.decode() == 'event: greeting\ndata: {"n": 1}\n\ndata: [DONE]\n\n'
        assert [r.path for r in server.requests] == ["/anything", "/stream"]
        assert server.requests[0].json() == {"q": 1}
        assert server.remaining == 0


def test_exhausted_script_answers_418_and_default_repeats() -> None:
    with LoopbackServer(OpenAIDialect()) as server:
        status, body, _ = post(server.url + "/x", {})
        assert status == 418 and b"script exhausted" in body
    with LoopbackServer(OpenAIDialect(), default="same") as server:
        for _ in range(2):
            status, body, _ = post(server.base_url + "/chat/completions", {"model": "m"})
            assert json.loads(body)["choices"][0]["message"]["content"] == "same"


async def test_agent_on_an_exhausted_server_gets_an_error_not_a_hang() -> None:
    with LoopbackServer(OpenAIDialect()) as server:
        engine = LLMEngine("gpt-4o", provider=OpenAIProvider(base_url=server.base_url, api_key="k"))
        env = await Agent(engine=engine).run("q")
        await engine.aclose()
    assert env.error is not None and "script exhausted" in env.error.message
    assert len(server.requests) == 1  # 418 is not retried


def test_block_switch_nests_and_reads_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPSTONE_BLOCK_MODEL_REQUESTS", raising=False)
    assert not requests_blocked()
    with block_model_requests():
        with block_model_requests():
            assert requests_blocked()
        assert requests_blocked()
    assert not requests_blocked()
    monkeypatch.setenv("STEPSTONE_BLOCK_MODEL_REQUESTS", "1")
    assert requests_blocked()
    monkeypatch.setenv("STEPSTONE_BLOCK_MODEL_REQUESTS", "false")
    assert not requests_blocked()


def test_env_var_blocks_a_real_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSTONE_BLOCK_MODEL_REQUESTS", "1")
    agent = Agent(engine=LLMEngine("gpt-4o", provider=OpenAIProvider(api_key="k")))
    with pytest.raises(ModelRequestsBlockedError, match="STEPSTONE_BLOCK_MODEL_REQUESTS"):
        agent("hi")
