"""Provider adapters driven through their official SDKs against loopback servers."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from stepstone import LLMEngine
from stepstone.providers import AnthropicProvider, GoogleProvider, OpenAIProvider, Provider
from stepstone.testing import (
    AnthropicDialect,
    Dialect,
    GoogleDialect,
    LoopbackServer,
    OpenAIDialect,
    block_model_requests,
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One provider: its dialect, adapter, a model id, and how to read its wire requests."""

    name: str
    dialect: Callable[[], Dialect]
    provider: Callable[[str], Provider]
    model: str
    tool_choice: Callable[[dict[str, Any]], str | None]
    tool_results: Callable[[dict[str, Any]], list[tuple[str, bool | None]]]


def _anthropic_results(body: dict[str, Any]) -> list[tuple[str, bool | None]]:
    last = body["messages"][-1]["content"]
    return [(b["content"], b["is_error"]) for b in last if b.get("type") == "tool_result"]


def _openai_results(body: dict[str, Any]) -> list[tuple[str, bool | None]]:
    return [(m["content"], None) for m in body["messages"] if m["role"] == "tool"]


def _google_results(body: dict[str, Any]) -> list[tuple[str, bool | None]]:
    parts = body["contents"][-1]["parts"]
    out: list[tuple[str, bool | None]] = []
    for p in parts:
        response = p["functionResponse"]["response"]
        out.append((response.get("output", response.get("error")), "error" in response))
    return out


def _anthropic_choice(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    return None if choice is None else {"any": "required"}.get(choice["type"], choice["type"])


def _openai_choice(body: dict[str, Any]) -> str | None:
    return body.get("tool_choice")


def _google_choice(body: dict[str, Any]) -> str | None:
    mode = body.get("toolConfig", {}).get("functionCallingConfig", {}).get("mode")
    return None if mode is None else {"ANY": "required", "AUTO": "auto"}[mode]


CASES = [
    Case(
        "anthropic",
        AnthropicDialect,
        lambda url: AnthropicProvider(base_url=url, api_key="test-key"),
        "claude-sonnet-4-6",
        _anthropic_choice,
        _anthropic_results,
    ),
    Case(
        "openai",
        OpenAIDialect,
        lambda url: OpenAIProvider(base_url=url, api_key="test-key"),
        "gpt-4o",
        _openai_choice,
        _openai_results,
    ),
    Case(
        "google",
        GoogleDialect,
        lambda url: GoogleProvider(base_url=url, api_key="test-key"),
        "gemini-2.5-flash",
        _google_choice,
        _google_results,
    ),
]


@pytest.fixture(autouse=True)
def _no_real_requests() -> Iterator[None]:
    # Loopback addresses stay allowed; anything else would be a real request.
    with block_model_requests():
        yield


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


class WireServer(LoopbackServer):
    """A loopback server that also closes the engines a test built against it."""

    def __init__(self, case: Case) -> None:
        super().__init__(case.dialect(), model=case.model)
        self.engines: list[LLMEngine] = []


@pytest.fixture
async def server(case: Case) -> AsyncIterator[WireServer]:
    srv = WireServer(case)
    srv.start()
    try:
        yield srv
    finally:
        for engine in srv.engines:
            await engine.aclose()
        srv.stop()
