"""The effect journal: in-doubt policies, group commit, idempotency keys, subagents."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Runner, RunnerConfig, Store, Tool, ToolContext, tool
from stepstone.testing import FakeModel, call
from tests.durable.journal_edit import entries
from tests.runner.conftest import Crash, Script


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store(db=tmp_path / "fx.sqlite") as s:
        yield s


def _tool(policy: Any, done: list[str], crash: set[str]) -> Tool:
    @tool(in_doubt=policy)
    async def transfer(ref: str) -> str:
        """Move money (not idempotent)."""
        done.append(ref)
        if ref in crash:
            crash.discard(ref)
            raise Crash("died inside the transfer")
        return f"moved {ref}"

    return transfer


SCRIPT = {0: call("transfer", ref="x1"), 1: "moved"}


async def _crash_inside(store: Store, policy: Any, done: list[str]) -> Runner:
    runner = Runner(store=store)
    agent = Agent(model=Script(SCRIPT).model(), tools=[_tool(policy, done, {"x1"})])
    with pytest.raises(Crash):
        await runner.run(agent, user_message="pay", run_id="p", thread_id="t")
    return runner


async def test_in_doubt_fail_fails_the_run_naming_the_call(store: Store) -> None:
    # guarantee 171
    done: list[str] = []
    runner = await _crash_inside(store, "fail", done)
    agent = Agent(model=Script(SCRIPT).model(), tools=[_tool("fail", done, set())])
    result = await runner.resume(agent, run_id="p", thread_id="t")
    assert result.state == "failed"
    assert result.error is not None and result.error["type"] == "EffectInDoubtError"
    assert "'transfer'" in result.error["message"] and "in_doubt='fail'" in result.error["message"]
    assert done == ["x1"]  # never run a second time
    again = await runner.resume(agent, run_id="p", thread_id="t")
    assert again == result  # terminal: stored


async def test_in_doubt_rerun_is_the_default(store: Store) -> None:
    # guarantee 172
    done: list[str] = []
    runner = await _crash_inside(store, "rerun", done)
    agent = Agent(model=Script(SCRIPT).model(), tools=[_tool("rerun", done, set())])
    result = await runner.resume(agent, run_id="p", thread_id="t")
    assert result.state == "completed" and done == ["x1", "x1"]
    assert _tool("rerun", [], set()).in_doubt == Tool(name="n").in_doubt == "rerun"


@pytest.mark.parametrize(
    ("decision", "runs"), [(True, 2), (False, 1), ("checked: it went through", 1)]
)
async def test_in_doubt_ask_pauses_for_a_person(store: Store, decision: Any, runs: int) -> None:
    # guarantee 173
    done: list[str] = []
    runner = await _crash_inside(store, "ask", done)
    script = Script(SCRIPT)
    agent = Agent(model=script.model(), tools=[_tool("ask", done, set())])
    paused = await runner.resume(agent, run_id="p", thread_id="t")
    assert paused.state == "paused" and len(done) == 1
    [pending] = paused.pending_approvals
    assert pending["tool"] == "transfer" and pending["reason"] == "in_doubt"
    assert pending["arguments"] == {"ref": "x1"}
    result = await runner.resume(
        agent, run_id="p", thread_id="t", approvals={pending["call_id"]: decision}
    )
    assert result.state == "completed" and len(done) == runs
    assert script.asked == [1]  # turn 0 was committed before the crash
    [execution] = result.tool_executions
    if decision is True:
        assert execution["content"] == "moved x1"
    else:
        assert execution["error"]["type"] == "ApprovalDenied"


def test_in_doubt_value_is_checked() -> None:
    with pytest.raises(ValueError, match="in_doubt must be"):

        @tool(in_doubt="maybe")
        def f() -> None:
            """Nothing."""


async def test_concurrent_tool_outcomes_share_one_commit(store: Store) -> None:
    # guarantee 174
    @tool
    async def fast(n: int) -> int:
        """Return n."""
        return n

    model = FakeModel([[call("fast", n=i) for i in range(4)], "ok"])
    runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=False))
    before = store.backend.run_get
    commits: list[int] = []

    def counting(head: Any, expected: int, rows: Any, writes: Any) -> bool:
        commits.append(len(rows))
        return type(store.backend).run_commit(store.backend, head, expected, rows, writes)

    store.backend.run_commit = counting  # type: ignore[method-assign]
    result = await runner.run(Agent(model=model, tools=[fast]), user_message="go")
    assert result.state == "completed" and before is not None
    # the run's opening records; turn 0's model outcome with the four intents; the four
    # outcomes together, with turn 0's closing and turn 1's opening records; the end.
    assert len(commits) == 4, commits


async def test_tool_context_key_is_stable_and_hidden_from_the_model(store: Store) -> None:
    # guarantee 175
    keys: list[str] = []

    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge."""
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            raise Crash("died after the charge")
        return "ok"

    assert set(charge.parameters["properties"]) == {"amount"}
    runner = Runner(store=store)
    script = {0: call("charge", amount=5), 1: "done"}
    agent = Agent(model=Script(script).model(), tools=[charge])
    with pytest.raises(Crash):
        await runner.run(agent, user_message="go", run_id="k", thread_id="t")
    agent = Agent(model=Script(script).model(), tools=[charge])
    await runner.resume(agent, run_id="k", thread_id="t")
    assert len(keys) == 2 and keys[0] == keys[1] == "k:tool:0:0"
    # outside an LLM loop the tool still gets a (fresh) context
    assert await charge.run(amount=1) == "ok"
    assert len(keys[-1]) == 32


async def test_finished_subagent_is_replayed(store: Store) -> None:
    # guarantee 176
    inner = Script({0: "the answer is 42"})
    researcher = Agent(name="researcher", model=inner.model(), description="Finds answers.")
    outer_script = {0: call("researcher", task="find it"), 1: call("boom"), 2: "done: 42"}
    crashed = [False]

    @tool
    def boom() -> str:
        """Crash once."""
        if not crashed[0]:
            crashed[0] = True
            raise Crash("died after the subagent finished")
        return "fine"

    runner = Runner(store=store)
    agent = Agent(name="lead", model=Script(outer_script).model(), tools=[researcher, boom])
    with pytest.raises(Crash):
        await runner.run(agent, user_message="go", run_id="s", thread_id="t")
    outer = Script(outer_script)
    agent = Agent(name="lead", model=outer.model(), tools=[researcher, boom])
    result = await runner.resume(agent, run_id="s", thread_id="t")
    assert result.state == "completed" and result.final_text == "done: 42"
    assert inner.asked == [0]  # the subagent's model was asked once, ever
    assert outer.asked == [2]
    [sub] = result.subagent_executions
    assert sub["tool"] == "researcher" and sub["content"] == "the answer is 42"
    phases = [c["phase"] for c in runner.checkpoints("s")]
    assert "pre_subagent_batch" in phases and "post_subagent_batch" in phases


@pytest.mark.parametrize("parallel", [1, 8])
async def test_batch_closes_after_its_last_call(store: Store, parallel: int) -> None:
    # guarantee 86, 174
    from stepstone import LLMEngine, checkpoint_latest_key

    @tool
    async def fast(n: int) -> int:
        """Return n."""
        await asyncio.sleep(0.001 * n)
        return n

    turn0 = [call("fast", n=3), call("fast", n="not a number"), call("nope"), call("fast", n=1)]
    engine = LLMEngine(FakeModel([turn0, "ok"]), max_parallel_tools=parallel)
    runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=False))
    result = await runner.run(Agent(engine=engine, tools=[fast]), user_message="go", run_id="b")
    assert result.state == "completed"
    rows = entries(store, checkpoint_latest_key("b"))
    names = [(r.kind, r.name) for r in rows]
    closing = names.index(("phase", "post_tool_batch"))
    outcomes = [i for i, n in enumerate(names) if n[0] == "outcome" and n[1].startswith("tool:")]
    assert len(outcomes) == 2 and max(outcomes) < closing
    record = rows[closing].data
    assert record["payload"] == {"tool_calls_total": 4, "tool_failures": 2}
    phases = [n[1] for n in names if n[0] == "phase"]
    assert phases.count("post_tool_batch") == 1 and phases.count("step_started") == 2
