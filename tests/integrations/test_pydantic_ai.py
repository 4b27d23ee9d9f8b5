"""``StepstoneDurability`` in-process: transparent outside a workflow, names pinned, a
failed run resumed without asking the model again, usage counted once, tool calls that
need approval decided from another process, event-stream handler calls journaled, model
turns shown per turn (guarantees 530-538, 545, 546)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, FunctionToolset, RunContext
from pydantic_ai.durable_exec import (
    EventStreamHandlerId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from typer.testing import CliRunner

from stepstone import ApprovalPendingError, RunHandle, Store, step, workflow
from stepstone.cli import app
from stepstone.durable._inspect import run_detail
from stepstone.integrations.pydantic_ai import StepstoneDurability, approval_results
from stepstone.testing import LoopbackServer, OpenAIDialect
from tests.integrations.pai_shop import EXPECTED, reply

ROOT = Path(__file__).resolve().parents[2]


def _turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Two turns with a tool call each, then an answer."""
    n = sum(1 for m in messages if m.kind == "response")
    if n < 2:
        return ModelResponse(
            parts=[ToolCallPart("refund", {"order": 40 + n}, tool_call_id=f"c{n}")]
        )
    return ModelResponse(parts=[TextPart("refunded 40 and 41")])


class Counted:
    """A FunctionModel that counts its requests, and an agent with a refund tool that
    counts its calls."""

    def __init__(self, name: str = "support", **capability: Any) -> None:
        self.requests = 0
        self.refunds: list[int] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            self.requests += 1
            return _turns(messages, info)

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
            self.requests += 1
            for part in _turns(messages, info).parts:
                if isinstance(part, ToolCallPart):
                    call = DeltaToolCall(
                        part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id
                    )
                    yield {0: call}
                else:
                    assert isinstance(part, TextPart)
                    yield part.content

        self.agent: Agent[None, str] = Agent(
            FunctionModel(model, stream_function=stream),
            name=name,
            capabilities=[StepstoneDurability(**capability)],
        )

        @self.agent.tool_plain
        def refund(order: int) -> str:
            self.refunds.append(order)
            return f"refunded {order}"


def test_outside_a_workflow_the_agent_runs_as_without_the_capability(tmp_path: Path) -> None:
    # guarantee 531
    shop = Counted()
    assert asyncio.run(shop.agent.run("refund please")).output == "refunded 40 and 41"
    assert shop.requests == 3 and shop.refunds == [40, 41]
    assert asyncio.run(shop.agent.run("again")).output == "refunded 40 and 41"
    assert shop.requests == 6 and shop.refunds == [40, 41, 40, 41]  # nothing replayed
    bound = StepstoneDurability.from_agent(shop.agent)
    assert bound is not None and not bound.in_durable_context


def test_a_failed_run_resumes_without_asking_the_model_or_running_tools_again(
    tmp_path: Path,
) -> None:
    # guarantee 530, 533
    shop = Counted()
    flaky = {"left": 1}

    @step
    def send_email(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("mail server down")
        return f"sent: {text}"

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="ticket-7")
    async def handle(ticket: str) -> dict[str, Any]:
        result = await shop.agent.run(ticket)
        sent = await send_email(result.output)
        usage = result.usage
        return {"sent": sent, "requests": usage.requests, "tokens": usage.total_tokens}

    with pytest.raises(ConnectionError):
        handle.run_sync("refund please")
    assert shop.requests == 3 and shop.refunds == [40, 41]
    out = handle.run_sync("refund please")
    assert out["sent"] == "sent: refunded 40 and 41"
    assert shop.requests == 3 and shop.refunds == [40, 41]  # replayed, not asked again
    assert out["requests"] == 3  # each request counted once
    fresh = Counted()
    assert asyncio.run(fresh.agent.run("refund please")).usage.total_tokens == out["tokens"]


def test_persisted_operation_names_are_pinned(tmp_path: Path) -> None:
    # guarantee 532: these names are stored in run journals; changing one strands runs in
    # flight. Never update this test for a rename.
    billing = FunctionToolset(id="billing")

    @billing.tool_plain
    def charge(cents: int) -> str:
        return f"charged {cents}"

    shop = Counted(models={"fast": FunctionModel(_turns)})
    agent = Agent(
        shop.agent.model,
        name="support",
        toolsets=[billing],
        capabilities=[StepstoneDurability(models={"fast": FunctionModel(_turns)})],
    )
    bound = StepstoneDurability.from_agent(agent)
    assert bound is not None
    namer = bound.namer
    ids = [
        ModelRequestId(None, streaming=False, model_name="default"),
        ModelRequestId(None, streaming=True, model_name="default"),
        ModelRequestId("fast", streaming=False, model_name="fast"),
        EventStreamHandlerId(),
        ToolsetCallToolId("function", toolset_id="billing"),
        ToolsetValidateToolArgumentsId("function", toolset_id="billing"),
        ToolsetGetToolsId("mcp", toolset_id="docs"),
        ToolsetGetInstructionsId(toolset_id="docs"),
        ToolsetCallToolId("mcp", toolset_id="docs"),
    ]
    names = [namer.invocation_name(i, label="charge").operation_name for i in ids]
    assert names == [
        "support__model.request",
        "support__model.request_stream",
        "support__model.request.fast",
        "support__event_stream_handler",
        "support__function_toolset__billing.call_tool:charge",
        "support__function_toolset__billing.validate_args",
        "support__mcp_server__docs.get_tools",
        "support__mcp_server__docs.get_instructions",
        "support__mcp_server__docs.call_tool",
    ]

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="names")
    async def handle(ticket: str) -> str:
        return (await shop.agent.run(ticket)).output

    handle.run_sync("refund please")
    steps = Store(db=tmp_path / "wf.sqlite").read("names")["steps"]
    assert [(s["op"], s["name"]) for s in steps] == [
        ("agent", "support"),
        ("model", "support__model.request"),
        ("tool", "support__function_toolset__<agent>.call_tool:refund"),
        ("model", "support__model.request"),
        ("tool", "support__function_toolset__<agent>.call_tool:refund"),
        ("model", "support__model.request"),
    ]


def test_a_tool_call_that_needs_approval_waits_for_a_decision_from_another_process(
    tmp_path: Path,
) -> None:
    # guarantee 537
    db = tmp_path / "wf.sqlite"
    refunds: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("refund", {"order": 42}, tool_call_id="r-42")])
        last = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"the tool said: {last.content}")])  # type: ignore[union-attr]

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model),
        name="support",
        output_type=[str, DeferredToolRequests],
        capabilities=[StepstoneDurability()],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order: int) -> str:
        refunds.append(order)
        return f"refunded {order}"

    @workflow(store=Store(db=db), key="ticket-42")
    async def handle(ticket: str) -> str:
        result = await agent.run(ticket)
        if isinstance(result.output, DeferredToolRequests):
            result = await agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=approval_results(result.output),
            )
        assert isinstance(result.output, str)
        return result.output

    with pytest.raises(ApprovalPendingError) as err:
        handle.run_sync("refund order 42")
    assert err.value.calls == [{"call_id": "r-42", "tool": "refund", "arguments": {"order": 42}}]
    with Store(db=db) as store:
        assert store.read("ticket-42")["status"] == "paused"  # waits, durably
        assert [c["call_id"] for c in run_detail(store, "ticket-42")["pending_approvals"]] == [
            "r-42"
        ]
    with pytest.raises(ApprovalPendingError):  # still waiting: nothing ran
        handle.run_sync("refund order 42")
    assert refunds == []
    approved = subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "approve", "--db", str(db), "ticket-42", "r-42"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert approved.returncode == 0, approved.stderr
    assert handle.run_sync("refund order 42") == "the tool said: refunded 42"
    assert refunds == [42]


def test_a_denied_tool_call_gives_the_model_the_reason(tmp_path: Path) -> None:
    # guarantee 537
    db = tmp_path / "wf.sqlite"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("refund", {"order": 9}, tool_call_id="r-9")])
        last = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"the tool said: {last.content}")])  # type: ignore[union-attr]

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model),
        name="support",
        output_type=[str, DeferredToolRequests],
        capabilities=[StepstoneDurability()],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order: int) -> str:
        raise AssertionError("a denied call never runs")

    @workflow(store=Store(db=db), key="ticket-9")
    async def handle(ticket: str) -> str:
        result = await agent.run(ticket)
        if isinstance(result.output, DeferredToolRequests):
            decisions = approval_results(result.output)
            result = await agent.run(
                message_history=result.all_messages(), deferred_tool_results=decisions
            )
        assert isinstance(result.output, str)
        return result.output

    with pytest.raises(ApprovalPendingError):
        handle.run_sync("refund order 9")
    denied = CliRunner().invoke(
        app, ["approve", "--db", str(db), "ticket-9", "r-9", "--deny", "order 9 was never paid"]
    )
    assert denied.exit_code == 0, denied.output
    assert handle.run_sync("refund order 9") == "the tool said: order 9 was never paid"


def test_event_stream_handler_calls_are_journaled_and_replayed(tmp_path: Path) -> None:
    # guarantee 535, 536
    seen: list[str] = []
    flaky = {"left": 1}

    async def handler(ctx: RunContext[None], events: Any) -> None:
        async for event in events:
            seen.append(event.event_kind)

    shop = Counted(event_stream_handler=handler)

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="events")
    async def handle(ticket: str) -> str:
        return await after((await shop.agent.run(ticket)).output)

    with pytest.raises(ConnectionError):
        handle.run_sync("refund please")
    first = list(seen)
    assert "function_tool_call" in first and "function_tool_result" in first
    steps = Store(db=tmp_path / "wf.sqlite").read("events")["steps"]
    assert any(s["op"] == "event" and s["name"] == "support__event_stream_handler" for s in steps)
    assert handle.run_sync("refund please") == "refunded 40 and 41"
    handled = [s for s in steps if s["op"] == "event"]
    # tool events were handled once: the resume replayed their recorded handling
    assert (
        seen.count("function_tool_result")
        == first.count("function_tool_result")
        == len([s for s in handled if s["args"]["event"] == "function_tool_result"])
    )


def test_show_and_the_run_view_list_model_turns_with_tokens_and_cost(tmp_path: Path) -> None:
    # guarantee 538
    db = tmp_path / "wf.sqlite"
    with LoopbackServer(OpenAIDialect(), respond=reply, model="gpt-4o-mini") as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        agent: Agent[None, str] = Agent(
            OpenAIChatModel("gpt-4o-mini", provider=provider),
            name="shop",
            capabilities=[StepstoneDurability()],
        )
        for name in ("reserve", "charge", "notify"):
            agent.tool_plain(name=name)(lambda **kwargs: "ok")

        @workflow(store=Store(db=db), key="shown")
        async def handle(ticket: str) -> str:
            async with agent:
                return (await agent.run(ticket)).output

        assert handle.run_sync("order 42").startswith("done: ok")
    with Store(db=db) as store:
        ops = run_detail(store, "shown")["operations"]
    turns = [op["summary"] for op in ops if op["op"] == "model"]
    assert len(turns) == 4
    assert all(t["model"] == "gpt-4o-mini" and t["input_tokens"] > 0 for t in turns)
    assert all(t["cost_usd"] is not None and t["cost_usd"] > 0 for t in turns)
    assert [c["name"] for c in turns[0]["tool_calls"]] == ["reserve", "reserve"]
    assert turns[1]["tool_calls"] == [{"name": "charge", "args": '{"cents": 1299}'}]
    tools = [op for op in ops if op["op"] == "tool"]
    assert [op["args"]["tool"] for op in tools] == [
        "reserve",
        "reserve",
        "charge",
        "notify",
        "notify",
    ]
    assert tools[2]["args"]["args"] == {"cents": 1299}
    shown = CliRunner().invoke(app, ["show", "--db", str(db), "shown"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "gpt-4o-mini" in shown.output and " out · $" in shown.output
    assert 'charge({"cents": 1299})' in shown.output
    assert EXPECTED.startswith("done: ")


def test_mcp_tool_calls_are_journaled_with_one_session_per_run(tmp_path: Path) -> None:
    # guarantee 530, 545
    from fastmcp.client.transports import PythonStdioTransport
    from pydantic_ai.mcp import MCPToolset

    log = tmp_path / "mcp.log"
    server = Path(__file__).with_name("mcp_docs_server.py")
    docs = MCPToolset(PythonStdioTransport(server, args=[str(log)]), id="docs", init_timeout=60)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages if m.kind == "response")
        if n < 2:
            query = ["refunds", "returns"][n]
            call = ToolCallPart("search_docs", {"query": query}, tool_call_id=f"m{n}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("read the docs")])

    agent: Agent[None, str] = Agent(
        FunctionModel(model), name="support", toolsets=[docs], capabilities=[StepstoneDurability()]
    )
    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="mcp")
    async def handle(ticket: str) -> str:
        return await after((await agent.run(ticket)).output)

    with pytest.raises(ConnectionError):
        handle.run_sync("how do refunds work?")
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines].count("session") == 1  # one session per run
    assert [line for line in lines if line.startswith("call")] == ["call refunds", "call returns"]
    steps = Store(db=tmp_path / "wf.sqlite").read("mcp")["steps"]
    calls = [s for s in steps if s["name"] == "support__mcp_server__docs.call_tool"]
    assert [s["args"]["args"] for s in calls] == [{"query": "refunds"}, {"query": "returns"}]
    assert handle.run_sync("how do refunds work?") == "read the docs"
    assert log.read_text().splitlines() == lines  # replayed: no session, no call


def test_run_stream_in_a_workflow_streams_then_replays(tmp_path: Path) -> None:
    # guarantee 546
    shop = Counted()
    flaky = {"left": 1}
    chunks: list[str] = []

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="streamed")
    async def handle(ticket: str) -> str:
        async with shop.agent.run_stream(ticket) as streamed:
            async for text in streamed.stream_output(debounce_by=None):
                chunks.append(text)
            output = await streamed.get_output()
        return await after(output)

    with pytest.raises(ConnectionError):
        handle.run_sync("refund please")
    assert chunks[-1] == "refunded 40 and 41"
    assert shop.requests == 3 and shop.refunds == [40, 41]
    assert handle.run_sync("refund please") == "refunded 40 and 41"
    assert shop.requests == 3 and shop.refunds == [40, 41]  # replayed, not asked again
    steps = Store(db=tmp_path / "wf.sqlite").read("streamed")["steps"]
    assert [s["name"] for s in steps if s["op"] == "model"] == ["support__model.request_stream"] * 3


@pytest.mark.slow
def test_the_inspector_page_shows_each_model_turn(tmp_path: Path, chromium: Any) -> None:
    # guarantee 538
    from stepstone.ui import InspectorServer

    db = tmp_path / "wf.sqlite"
    with LoopbackServer(OpenAIDialect(), respond=reply, model="gpt-4o-mini") as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        agent: Agent[None, str] = Agent(
            OpenAIChatModel("gpt-4o-mini", provider=provider),
            name="shop",
            capabilities=[StepstoneDurability()],
        )
        for name in ("reserve", "charge", "notify"):
            agent.tool_plain(name=name)(lambda **kwargs: "ok")

        @workflow(store=Store(db=db), key="page")
        async def handle(ticket: str) -> str:
            async with agent:
                return (await agent.run(ticket)).output

        worker = threading.Thread(target=lambda: handle.run_sync("order 42"))
        worker.start()  # (the browser's event loop runs on this thread)
        worker.join(120)
    with Store(db=db) as store, InspectorServer(store, port=0).start() as inspector:
        context = chromium.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(inspector.url + "#run=page")
            page.wait_for_selector("#operations tbody tr")
            rows = [
                r for r in page.locator("#operations tbody tr").all_inner_texts() if "model" in r
            ]
            assert len(rows) == 4
            assert all("gpt-4o-mini" in r and " in / " in r and "$0.0000" in r for r in rows)
            assert 'charge({"cents": 1299})' in rows[1]
        finally:
            context.close()


def test_stream_events_to_feeds_a_run_stream_live_and_once(tmp_path: Path) -> None:
    # guarantee 548
    from stepstone.durable._messages import read_stream
    from stepstone.integrations.pydantic_ai import stream_events_to

    db = tmp_path / "wf.sqlite"
    seen_live: list[list[Any]] = []

    def written() -> list[Any]:
        with Store(db=db) as store:
            return [v for _, v in read_stream(store, "live", "events", follow=False)]

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        if not any(m.kind == "response" for m in messages):
            yield {0: DeltaToolCall("refund", '{"order": 40}', tool_call_id="c0")}
            return
        for piece in ["refunded ", "40 ", "for you"]:
            seen_live.append(written())
            yield piece

    agent: Agent[None, str] = Agent(
        FunctionModel(stream_function=stream),
        name="support",
        capabilities=[StepstoneDurability(event_stream_handler=stream_events_to("events"))],
    )
    refunds: list[int] = []

    @agent.tool_plain
    def refund(order: int) -> str:
        refunds.append(order)
        return f"refunded {order}"

    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=db), key="live")
    async def handle(ticket: str) -> str:
        return await after((await agent.run(ticket)).output)

    with pytest.raises(ConnectionError):
        handle.run_sync("refund 40")
    first = written()
    kinds = [e["event_kind"] for e in first]
    assert kinds.count("function_tool_call") == kinds.count("function_tool_result") == 1
    deltas = [e["delta"]["content_delta"] for e in first if e["event_kind"] == "part_delta"]
    assert "".join(deltas) in ("40 for you", "refunded 40 for you")
    # written live: the model's first text was in the run stream before it sent the rest
    assert any(
        e.get("part", {}).get("content") == "refunded " for e in seen_live[-1] if "part" in e
    )
    assert handle.run_sync("refund 40") == "refunded 40 for you"
    assert written() == first and refunds == [40]  # the resume wrote nothing again


def test_a_tool_can_write_the_workflows_streams_and_events(tmp_path: Path) -> None:
    # guarantee 548: a tool call's body is a step body of the workflow
    import stepstone
    from stepstone.durable._messages import read_stream

    agent: Agent[None, str] = Agent(
        FunctionModel(_turns), name="support", capabilities=[StepstoneDurability()]
    )

    @agent.tool_plain
    async def refund(order: int) -> str:
        await stepstone.write_stream("progress", f"refunding {order}")
        stepstone.set_event("last_refund", order)
        return f"refunded {order}"

    @workflow(store=Store(db=tmp_path / "wf.sqlite"), key="tools")
    async def handle(ticket: str) -> str:
        return (await agent.run(ticket)).output

    assert handle.run_sync("refund") == "refunded 40 and 41"
    with Store(db=tmp_path / "wf.sqlite") as store:
        values = [v for _, v in read_stream(store, "tools", "progress", follow=False)]
        assert values == ["refunding 40", "refunding 41"]
        assert RunHandle(store, key="tools").get_event("last_refund") == 41


def test_the_openai_responses_model_streams_through_the_journal(tmp_path: Path) -> None:
    # guarantee 530, 546, 548: pydantic-ai's OpenAI Responses model ("openai:..."), streamed
    from pydantic_ai.models.openai import OpenAIResponsesModel

    from stepstone.durable._messages import read_stream
    from stepstone.integrations.pydantic_ai import stream_events_to
    from stepstone.testing import call

    db = tmp_path / "wf.sqlite"
    with LoopbackServer(OpenAIDialect(), model="gpt-4o-mini") as server:
        server.push(call("refund", order=40), "refunded order 40 for you")
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        durability = StepstoneDurability(event_stream_handler=stream_events_to("events"))
        agent: Agent[None, str] = Agent(
            OpenAIResponsesModel("gpt-4o-mini", provider=provider),
            name="support",
            capabilities=[durability],
        )
        refunds: list[int] = []

        @agent.tool_plain
        def refund(order: int) -> str:
            refunds.append(order)
            return f"refunded {order}"

        @workflow(store=Store(db=db), key="resp")
        async def handle(ticket: str) -> str:
            async with agent:
                return (await agent.run(ticket)).output

        assert handle.run_sync("refund 40") == "refunded order 40 for you"
        assert handle.run_sync("refund 40") == "refunded order 40 for you"  # recorded
        assert refunds == [40] and len(server.requests) == 2
        assert all(r.json().get("stream") for r in server.requests)
    with Store(db=db) as store:
        events = [v for _, v in read_stream(store, "resp", "events", follow=False)]
    deltas = [e["delta"].get("content_delta") for e in events if e["event_kind"] == "part_delta"]
    assert "".join(d for d in deltas if d) in ("order 40 for you", "refunded order 40 for you")
