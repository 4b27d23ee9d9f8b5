"""An LLM planner through each official provider SDK, against a loopback server."""

from __future__ import annotations

import json

from stepstone import Agent, LLMEngine, PlanRound, ReplanEngine
from tests.providers.conftest import (  # noqa: F401 - fixtures used by name
    Case,
    WireServer,
    _no_real_requests,
    case,
    server,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_llm_planner_over_the_wire(case: Case, server: WireServer) -> None:  # noqa: F811
    # guarantee 71, 72
    server.push(
        json.dumps({"reasoning": "sum", "tasks": [{"tool": "add", "kwargs": {"a": 2, "b": 3}}]}),
        json.dumps({"reasoning": "done", "done": True, "final_answer": "five"}),
    )
    engine = LLMEngine(case.model, provider=case.provider(server.base_url), retry_delay=0.01)
    server.engines.append(engine)
    planner = Agent(engine=engine, name="planner", output=PlanRound)
    env = await Agent(engine=ReplanEngine(), tools=[planner, add]).run("add two and three")
    assert env.ok, env.error
    assert env.payload == "five"
    first, second = (json.dumps(r.json()) for r in server.requests)
    assert "final_answer" in first  # the PlanRound schema went to the provider
    assert "add two and three" in first and "Add two integers." in first
    assert '[1.0] add({\\"a\\": 2, \\"b\\": 3}) -> result: 5' in second
