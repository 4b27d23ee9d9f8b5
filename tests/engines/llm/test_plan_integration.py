"""LLM agents as Plan steps: structured output drives ``routes_by`` (guarantee 52, 55)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from stepstone import Agent, LLMEngine, Plan, Runner, Step, Store
from stepstone.durable import retry_run
from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer
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


def test_another_run_of_a_key_asks_the_model_again(tmp_path: Path) -> None:
    # guarantee 183: the loop's key is derived from this run of the checkpoint key. Before,
    # a fresh start (resume=False) found the LLM journal of the key's previous run and
    # replayed its answer without asking the model, and a retry's re-run did the same
    store = Store(db=tmp_path / "s.sqlite")

    def run(answer: str, *, resume: bool = False) -> tuple[object, int]:
        model = FakeModel([answer])
        writer = Agent(engine=LLMEngine(model), name="writer")
        plan = Plan(
            Step("writer", writes="draft"), store=store, checkpoint_key="daily", resume=resume
        )
        env = Agent(engine=plan, tools=[writer])("write today's report")
        return (env.payload if env.ok else env.error), len(model.requests)

    assert run("report for MONDAY") == ("report for MONDAY", 1)
    assert run("report for TUESDAY") == ("report for TUESDAY", 1)
    assert run("report for TUESDAY, again", resume=True) == (  # a done run: its result
        {"draft": "report for TUESDAY"},
        0,
    )
    retry_run(store, "daily", from_step="writer")
    assert run("report for WEDNESDAY", resume=True) == ("report for WEDNESDAY", 1)
    assert store.read("draft") == "report for WEDNESDAY"


class Doc(State):
    day: str
    text: str = ""


def test_a_fresh_graph_invocation_asks_the_model_again(tmp_path: Path) -> None:
    # guarantee 186: the same correlation id, a new invocation (not a resume)
    store = Store(db=tmp_path / "g.sqlite")

    def invoke(answer: str, day: str) -> tuple[str, int]:
        model = FakeModel([answer])
        writer = Agent(engine=LLMEngine(model), name="writer")
        graph = (
            GraphBuilder(Doc)
            .add_node("write", writer, writes="text")
            .add_edge("write", END)
            .set_entry("write")
            .with_checkpointer(StoreCheckpointer(store))
            .compile()
        )
        out = graph.invoke(Doc(day=day), correlation_id="daily-graph")
        return out.text, len(model.requests)

    assert invoke("MONDAY text", "mon") == ("MONDAY text", 1)
    assert invoke("TUESDAY text", "mon") == ("TUESDAY text", 1)
    assert invoke("WEDNESDAY text", "wed") == ("WEDNESDAY text", 1)


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(
    ("output", "answer", "value"),
    [(Literal["spam", "ham"], '"spam"', "spam"), (Color, '"red"', Color.RED)],
)
def test_a_structured_output_that_is_a_str_in_a_durable_step(
    tmp_path: Path, output: object, answer: str, value: object
) -> None:
    # guarantee 52: an output type whose values are strings (a Literal, a str Enum) is
    # structured output too; before, a durable step stored None for it and every run and
    # resume failed to validate it
    store = Store(db=tmp_path / "s.sqlite")
    model = FakeModel([answer])
    clf = Agent(engine=LLMEngine(model), output=output, name="clf")

    def plan() -> Agent:
        steps = Plan(Step("clf", writes="label", output=output), store=store, checkpoint_key="k")
        return Agent(engine=steps, tools=[clf])

    env = plan()("classify this")
    assert env.ok, env.error
    assert env.payload == value and type(env.payload) is type(value)
    assert store.read("label") == answer.strip('"')  # stored as its JSON form
    direct = Agent(engine=LLMEngine(FakeModel([answer])), output=output)
    result = Runner(store=store).run_sync(direct, user_message="classify", run_id="direct")
    assert result.state == "completed", result.error
    assert result.final_structured == value and result.final_text == answer
