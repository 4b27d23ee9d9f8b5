"""LLM loops inside durable Plan steps and graph nodes are journaled like Runner runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Store, tool
from stepstone.graph import END, CheckpointFilter, GraphBuilder, State, StoreCheckpointer
from stepstone.testing import call
from tests.runner.conftest import Crash, Script

REPLIES = {0: [call("charge", order="a"), call("charge", order="b")], 1: "charged a and b"}


def _charge(done: list[str], crash_in: set[str]) -> Any:
    @tool
    async def charge(order: str) -> str:
        """Charge an order."""
        done.append(order)
        if order in crash_in:
            crash_in.discard(order)
            raise Crash(f"died after charging {order}")
        return f"charged {order}"

    return charge


def _plan(store: Store, script: Script, done: list[str], crash_in: set[str]) -> Agent:
    llm = Agent(name="biller", model=script.model(), tools=[_charge(done, crash_in)])
    return Agent(
        engine=Plan(Step(llm, writes="bill_text"), store=store, checkpoint_key="bill", resume=True)
    )


async def test_plan_step_loop_resumes_at_its_last_committed_turn(tmp_path: Path) -> None:
    # guarantee 183, 184
    done: list[str] = []
    with Store(db=tmp_path / "p.sqlite") as store:
        with pytest.raises(Crash):
            await _plan(store, Script(REPLIES), done, {"b"}).run("bill")
        runs = [k for k in store.keys() if k.endswith(":llm")]
        origin = store.backend.run_get("bill").meta["origin"]  # type: ignore[union-attr]
        assert runs == [f"bill:{origin}:biller:1:llm"]  # the step execution's idempotency key
        again = Script(REPLIES)
        env = await _plan(store, again, done, set()).run("bill")
        assert env.ok and env.payload == "charged a and b"
        assert env.metadata["replayed_effect_count"] == 2  # turn 0 and "a"
        assert store.read("bill_text") == "charged a and b"
    assert again.asked == [1]
    # "b" died inside its call: it runs again (in_doubt="rerun"); "a" is replayed
    assert sorted(done) == ["a", "b", "b"]


async def test_plan_without_store_is_not_journaled(tmp_path: Path) -> None:
    # guarantee 185
    done: list[str] = []
    llm = Agent(name="biller", model=Script(REPLIES).model(), tools=[_charge(done, set())])
    env = await Agent(engine=Plan(Step(llm))).run("bill")
    assert env.ok and done == ["a", "b"]
    assert "replayed_effect_count" not in env.metadata


async def test_graph_node_loop_resumes_at_its_last_committed_turn(tmp_path: Path) -> None:
    # guarantee 186
    class Bill(State):
        text: str = ""

    done: list[str] = []

    def graph(store: Store, script: Script, crash_in: set[str]) -> Any:
        llm = Agent(name="biller", model=script.model(), tools=[_charge(done, crash_in)])

        async def ask(state: Bill) -> dict[str, Any]:
            env = await llm.run("bill")
            assert env.ok, env.error
            return {"text": env.payload}

        return (
            GraphBuilder(Bill)
            .add_node("ask", ask)
            .add_edge("ask", END)
            .set_entry("ask")
            .with_checkpointer(StoreCheckpointer(store))
            .compile()
        )

    with Store(db=tmp_path / "g.sqlite") as store:
        with pytest.raises(Crash):
            await graph(store, Script(REPLIES), {"a"}).ainvoke(Bill(), correlation_id="c")
        [attempt] = StoreCheckpointer(store).list(CheckpointFilter(correlation_id="c"))
        again = Script(REPLIES)
        final = await graph(store, again, set()).ainvoke(resume_invocation=attempt.invocation_id)
    assert final.text == "charged a and b"
    assert again.asked == [1] and sorted(done) == ["a", "a", "b"]


async def test_function_step_running_two_agents(tmp_path: Path) -> None:
    # guarantee 183, 184
    done: list[str] = []
    asked: list[Script] = []

    def step_fn(crash_in: set[str]) -> Any:
        async def two_agents(task: str) -> str:
            first, second = Script(REPLIES), Script({0: call("charge", order="c"), 1: "c done"})
            asked.extend([first, second])
            one = Agent(name="one", model=first.model(), tools=[_charge(done, crash_in)])
            two = Agent(name="two", model=second.model(), tools=[_charge(done, crash_in)])
            a, b = await one.run(task), await two.run(task)
            return f"{a.payload} / {b.payload}"

        return two_agents

    with Store(db=tmp_path / "f.sqlite") as store:

        def plan(crash_in: set[str]) -> Agent:
            return Agent(
                engine=Plan(Step(step_fn(crash_in)), store=store, checkpoint_key="f", resume=True)
            )

        with pytest.raises(Crash):
            await plan({"c"}).run("bill")
        env = await plan(set()).run("bill")
        assert env.ok and env.payload == "charged a and b / c done"
        origin = store.backend.run_get("f").meta["origin"]  # type: ignore[union-attr]
        assert sorted(k for k in store.keys() if ":llm" in k) == [
            f"f:{origin}:two_agents:1:llm",
            f"f:{origin}:two_agents:1:llm2",
        ]
    assert [s.asked for s in asked] == [[0, 1], [0], [], [1]]
    assert sorted(done) == ["a", "b", "c", "c"]
