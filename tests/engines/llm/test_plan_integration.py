"""LLM agents as Plan steps: structured output drives ``routes_by`` (guarantee 52, 55)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from stepstone import Agent, LLMEngine, Plan, Step, Store
from stepstone.testing import FakeModel, Reply


class Triage(BaseModel):
    route: Literal["bug", "feature"]
    summary: str


async def test_routes_by_an_llm_agents_literal_field() -> None:  # guarantee 55
    triage_model = FakeModel([{"route": "feature", "summary": "wants dark mode"}])
    bug_model = FakeModel(["bug handled"])
    feature_model = FakeModel(["feature planned"])
    triage = Agent(engine=LLMEngine(triage_model), name="triage")
    bug = Agent(engine=LLMEngine(bug_model), name="bug")
    feature = Agent(engine=LLMEngine(feature_model), name="feature")
    store = Store()
    plan = Plan(
        Step(triage, name="triage", output=Triage, routes_by="route", after_branches="done"),
        Step(bug, name="bug", writes="handled"),
        Step(feature, name="feature", writes="handled"),
        Step(lambda task: f"closed: {task}", name="done"),
        store=store,
        checkpoint_key="triage-run",
    )
    env = await Agent(engine=plan).run("please add dark mode")
    assert env.ok, env.error
    assert env.payload == "closed: feature planned"
    assert store.read("handled") == "feature planned"
    assert bug_model.requests == []  # the other branch never ran
    # the triage agent was asked for structured output (guarantee 52)
    assert triage_model.requests[0].output_schema is not None
    assert triage_model.requests[0].output_schema["properties"]["route"]["enum"] == [
        "bug",
        "feature",
    ]
    # the feature agent saw the triage output as its task (from_prev)
    assert "dark mode" in feature_model.requests[0].messages[0].text


async def test_a_refusal_is_not_committed_as_a_successful_step() -> None:
    # guarantee 200: before, the empty refusal text was written as the step's result
    model = FakeModel([Reply(text="", stop_reason="refusal")])
    store = Store()
    plan = Plan(
        Step(Agent(engine=LLMEngine(model), name="writer"), name="write", writes="draft"),
        store=store,
        checkpoint_key="refusal-run",
    )
    env = await Agent(engine=plan).run("write it")
    assert not env.ok
    assert env.error is not None and "ModelRefusalError" in (env.error.type + env.error.message)
    assert "draft" not in store.keys()
