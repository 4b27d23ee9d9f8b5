"""pydantic-ai's own features inside a workflow, as its durable integrations' suites check
them: ``TestModel``, structured output and deps, a tool's ``ModelRetry``, ``agent.iter``,
usage limits counted once across a resume (guarantee 549), and a deferred tool whose
result comes later, from another process, as a message (guarantee 550)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    UsageLimits,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import stepstone
from stepstone import Store, step, workflow
from stepstone.integrations.pydantic_ai import StepstoneDurability

ROOT = Path(__file__).resolve().parents[2]


def _failing_once() -> Any:
    """A step that fails the first time it is called (the run stops after its agent)."""
    flaky = {"left": 1}

    @step
    def after(value: Any) -> Any:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return value

    return after


@dataclass
class Shop:
    country: str


class Verdict(BaseModel):
    order: int
    refundable: bool
    reason: str


def test_test_model_structured_output_and_deps_replay(tmp_path: Path) -> None:
    # guarantee 549
    lookups: list[tuple[str, int]] = []
    agent: Agent[Shop, Verdict] = Agent(
        TestModel(),
        name="judge",
        deps_type=Shop,
        output_type=Verdict,
        capabilities=[StepstoneDurability()],
    )

    @agent.tool
    def lookup(ctx: RunContext[Shop], order: int) -> str:
        lookups.append((ctx.deps.country, order))
        return f"order {order} shipped to {ctx.deps.country}"

    after = _failing_once()

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="judge")
    async def judge(country: str) -> dict[str, Any]:
        result = await agent.run("may I refund?", deps=Shop(country))
        assert isinstance(result.output, Verdict)  # rebuilt as the output type on replay
        usage = result.usage
        return await after(
            {
                "verdict": result.output.model_dump(),
                "requests": usage.requests,
                "tokens": usage.total_tokens,
            }
        )

    with pytest.raises(ConnectionError):
        judge.run_sync("NZ")
    out = judge.run_sync("NZ")
    clean = asyncio.run(agent.run("may I refund?", deps=Shop("NZ")))
    assert out["verdict"] == clean.output.model_dump()
    assert (out["requests"], out["tokens"]) == (clean.usage.requests, clean.usage.total_tokens)
    assert len(lookups) == 2  # once in the workflow (not again on resume), once clean
    assert lookups[0][0] == "NZ"


def test_a_tools_model_retry_is_replayed_not_retried_again(tmp_path: Path) -> None:
    # guarantee 549
    calls: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages if m.kind == "response")
        if n < 2:
            order = 7 if n == 0 else 8
            return ModelResponse(
                parts=[ToolCallPart("refund", {"order": order}, tool_call_id=f"c{n}")]
            )
        return ModelResponse(parts=[TextPart("refunded 8")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="support", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain(retries=2)
    def refund(order: int) -> str:
        calls.append(order)
        if order == 7:
            raise ModelRetry("order 7 does not exist; try 8")
        return f"refunded {order}"

    after = _failing_once()

    def shape(result: Any) -> list[tuple[str, Any]]:
        return [
            (p.part_kind, getattr(p, "content", None))
            for m in result.all_messages()
            for p in m.parts
        ]

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="retry")
    async def handle(ticket: str) -> dict[str, Any]:
        result = await agent.run(ticket)
        return await after(
            {"out": result.output, "messages": shape(result), "requests": result.usage.requests}
        )

    with pytest.raises(ConnectionError):
        handle.run_sync("refund")
    assert calls == [7, 8]
    out = handle.run_sync("refund")
    clean = asyncio.run(agent.run("refund"))  # outside a workflow: as without durability
    assert calls == [7, 8, 7, 8]
    assert out["out"] == "refunded 8" and out["requests"] == clean.usage.requests == 3
    # the conversation holds the retry as it did: "order 7 does not exist; try 8"
    assert [tuple(p) for p in out["messages"]] == shape(clean)
    assert "order 7 does not exist; try 8" in str(out["messages"])
    del calls[2:]
    assert calls == [7, 8]  # the retry was replayed: the tool did not run again


def test_agent_iter_in_a_workflow_replays(tmp_path: Path) -> None:
    # guarantee 549
    requests = {"n": 0}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests["n"] += 1
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("stock", {"item": "kayak"})])
        return ModelResponse(parts=[TextPart("3 kayaks left")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="stock", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    def stock(item: str) -> int:
        return 3

    after = _failing_once()

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="iter")
    async def handle(question: str) -> dict[str, Any]:
        nodes: list[str] = []
        async with agent.iter(question) as run:
            async for node in run:
                nodes.append(type(node).__name__)
        assert run.result is not None
        return await after({"out": run.result.output, "nodes": nodes})

    with pytest.raises(ConnectionError):
        handle.run_sync("how many kayaks?")
    out = handle.run_sync("how many kayaks?")
    assert out["out"] == "3 kayaks left" and out["nodes"][-1] == "End"
    assert requests["n"] == 2  # replayed, not asked again


def test_usage_limits_count_each_request_once_across_a_resume(tmp_path: Path) -> None:
    # guarantee 549: a limit the run fits is not broken by its resume
    requests = {"n": 0}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests["n"] += 1
        n = sum(1 for m in messages if m.kind == "response")
        if n < 2:
            return ModelResponse(parts=[ToolCallPart("ping", {"n": n})])
        return ModelResponse(parts=[TextPart("pong")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="pinger", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    def ping(n: int) -> str:
        return "pong"

    after = _failing_once()

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="limits")
    async def handle(text: str) -> str:
        result = await agent.run(text, usage_limits=UsageLimits(request_limit=3))
        return str(await after(result.output))

    with pytest.raises(ConnectionError):
        handle.run_sync("ping")
    assert handle.run_sync("ping") == "pong"
    assert requests["n"] == 3


def test_a_deferred_tool_waits_for_its_result_as_a_message(tmp_path: Path) -> None:
    # guarantee 550: the result of a deferred call comes hours later, from another process
    db = tmp_path / "wf.sqlite"
    asked: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(
                parts=[ToolCallPart("inspect_parcel", {"parcel": "p-9"}, tool_call_id="d-1")]
            )
        last = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"the warehouse says: {last.content}")])  # type: ignore[union-attr]

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model),
        name="desk",
        output_type=[str, DeferredToolRequests],
        capabilities=[StepstoneDurability()],
    )

    @agent.tool_plain
    def inspect_parcel(parcel: str) -> str:
        asked.append(parcel)
        raise CallDeferred  # a person in the warehouse answers, some day

    @workflow(store=Store(db=db), key="parcel-9")
    async def handle(ticket: str) -> str:
        result = await agent.run(ticket)
        while isinstance(result.output, DeferredToolRequests):
            answers = {
                call.tool_call_id: await stepstone.recv(f"tool-result:{call.tool_call_id}")
                for call in result.output.calls
            }
            result = await agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=DeferredToolResults(calls=answers),
            )
        return str(result.output)

    async def scenario() -> str:
        running = asyncio.create_task(handle.run("where is parcel p-9?"))
        with Store(db=db) as store:
            while not any(
                s["op"] == "recv" for s in (store.read("parcel-9") or {}).get("steps", [])
            ):
                await asyncio.sleep(0.05)
        sent = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "stepstone.cli",
                "send",
                "--db",
                str(db),
                "parcel-9",
                "tool-result:d-1",
                '"it left on Monday"',
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert sent.returncode == 0, sent.stderr
        return await asyncio.wait_for(running, 120)

    assert asyncio.run(scenario()) == "the warehouse says: it left on Monday"
    assert asked == ["p-9"]
    # run again: everything replays (the message is not received twice)
    assert handle.run_sync("where is parcel p-9?") == "the warehouse says: it left on Monday"
    assert asked == ["p-9"]


def test_two_agent_runs_in_parallel_replay_their_own_answers(tmp_path: Path) -> None:
    # guarantee 549: concurrent runs (asyncio.gather) each replay what they recorded
    asked: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
        asked.append(prompt)
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("size", {"city": prompt})])
        last = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"{prompt}: {last.content}")])  # type: ignore[union-attr]

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="atlas", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    async def size(city: str) -> str:
        await asyncio.sleep(0.05 if city == "Lima" else 0)  # finish in another order
        return f"{len(city)} letters"

    after = _failing_once()

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="gather")
    async def handle(a: str, b: str) -> list[str]:
        runs = await asyncio.gather(agent.run(a), agent.run(b))
        return list(await after([r.output for r in runs]))

    with pytest.raises(ConnectionError):
        handle.run_sync("Lima", "Berlin")
    assert len(asked) == 4
    assert handle.run_sync("Lima", "Berlin") == ["Lima: 4 letters", "Berlin: 6 letters"]
    assert len(asked) == 4  # each run replayed its own answers


def _journal_rows(db: Path) -> int:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM stepstone_journal").fetchone()[0])
    finally:
        conn.close()


def test_a_tool_loop_commits_once_per_turn(tmp_path: Path, monkeypatch: Any) -> None:
    # guarantee 551: a tool's outcome waits for the next turn's commit; no lazy commit
    # armed before a commit fires alone in the middle of the next turn
    from stepstone.durable import _operations

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(0.2)  # the model thinks
        n = sum(1 for m in messages if m.kind == "response")
        if n < 4:
            return ModelResponse(parts=[ToolCallPart("work", {"n": n})])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="loop", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    async def work(n: int) -> str:
        await asyncio.sleep(0.3)  # the tool works
        return f"did {n}"

    def rows(delay: float, db: Path) -> int:
        monkeypatch.setattr(_operations, "LAZY_COMMIT_DELAY", delay)

        @workflow(store=Store(db=db), key="loop")
        async def handle(text: str) -> str:
            return (await agent.run(text)).output

        assert handle.run_sync("go") == "done"
        return _journal_rows(db)

    floor = rows(3600.0, tmp_path / "never.sqlite")  # no lazy commit can fire
    # a lazy commit waits 0.4 s: longer than the model takes, shorter than a whole turn
    assert rows(0.4, tmp_path / "lazy.sqlite") == floor
