"""``DurableRunner`` in-process: keyed runs and runs inside a workflow, a streamed run
replayed, tools that need approval decided from another process, clear errors, model
turns shown per turn (guarantees 537, 538, 540, 542-545)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from typer.testing import CliRunner

from stepstone import ApprovalPendingError, ConfigurationError, Store, UserError, step, workflow
from stepstone.cli import app
from stepstone.durable._inspect import run_detail
from stepstone.integrations.openai_agents import DurableRunner, RecordedRunResult
from stepstone.testing import LoopbackServer, OpenAIDialect, call
from tests.integrations import oa_shop

assert oa_shop.EXPECTED  # importing it turns the SDK's trace export off

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(OpenAIDialect(), model="gpt-4o-mini") as srv:
        yield srv


@pytest.fixture
async def client(server: LoopbackServer) -> AsyncIterator[AsyncOpenAI]:
    """The SDK's client, closed on the test's event loop when the test ends."""
    async with AsyncOpenAI(base_url=server.base_url, api_key="test") as openai_client:
        yield openai_client


def _agent(client: AsyncOpenAI, refunds: list[int], *, approval: bool = False) -> Agent[Any]:
    @function_tool(needs_approval=approval)
    def refund(order: int) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    model = OpenAIChatCompletionsModel("gpt-4o-mini", client)
    return Agent(name="support", instructions="Help.", tools=[refund], model=model)


async def test_a_keyed_run_records_and_a_finished_key_returns_its_output(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 540, 542
    refunds: list[int] = []
    server.push(call("refund", order=42), "refunded order 42")
    with Store(db=tmp_path / "oa.sqlite") as store:
        agent = _agent(client, refunds)
        result = await DurableRunner.run(agent, "refund order 42", store=store, key="ticket-42")
        assert result.final_output == "refunded order 42" and refunds == [42]
        again = await DurableRunner.run(agent, "refund order 42", store=store, key="ticket-42")
        assert again == RecordedRunResult(
            key="ticket-42", final_output="refunded order 42", last_agent_name="support"
        )
        assert len(server.requests) == 2 and refunds == [42]  # nothing ran again
        ops = run_detail(store, "ticket-42")["operations"]
    turns = [op["summary"] for op in ops if op["op"] == "model"]
    # guarantee 538: model, tokens, cost, tool calls per turn
    assert [t["model"] for t in turns] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert all(t["cost_usd"] > 0 and t["input_tokens"] > 0 for t in turns)
    assert turns[0]["tool_calls"] == [{"name": "refund", "args": '{"order": 42}'}]
    assert [op["args"] for op in ops if op["op"] == "tool"] == [
        {"args": {"order": 42}, "call_id": "call_1_0"}
    ]
    shown = CliRunner().invoke(
        app, ["show", "--db", str(tmp_path / "oa.sqlite"), "ticket-42"], env={"COLUMNS": "250"}
    )
    assert shown.exit_code == 0, shown.output
    assert "gpt-4o-mini" in shown.output and " out · $" in shown.output
    assert 'refund({"order": 42})' in shown.output


async def test_a_failed_workflow_resumes_without_asking_the_model_again(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 540
    refunds: list[int] = []
    server.push(call("refund", order=7), "refunded order 7")
    flaky = {"left": 1}

    @step
    def notify(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("mail server down")
        return text

    @workflow(store=Store(db=tmp_path / "oa.sqlite"), key="ticket-7")
    async def handle(ticket: str) -> dict[str, Any]:
        result = await DurableRunner.run(_agent(client, refunds), ticket)
        usage = result.context_wrapper.usage
        return {"sent": await notify(result.final_output), "requests": usage.requests}

    with pytest.raises(ConnectionError):
        await handle.run("refund order 7")
    assert await handle.run("refund order 7") == {"sent": "refunded order 7", "requests": 2}
    assert len(server.requests) == 2 and refunds == [7]


async def test_a_streamed_run_in_a_workflow_streams_then_replays(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 543
    refunds: list[int] = []
    server.push(call("refund", order=5), "refunded order 5")
    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=tmp_path / "oa.sqlite"), key="streamed")
    async def handle(ticket: str) -> dict[str, Any]:
        streamed = DurableRunner.run_streamed(_agent(client, refunds), ticket)
        kinds = [event.type async for event in streamed.stream_events()]
        return {
            "out": await after(streamed.final_output),
            "events": "run_item_stream_event" in kinds,
        }

    with pytest.raises(ConnectionError):
        await handle.run("refund order 5")
    assert await handle.run("refund order 5") == {"out": "refunded order 5", "events": True}
    assert len(server.requests) == 2 and refunds == [5]
    steps = Store(db=tmp_path / "oa.sqlite").read("streamed")["steps"]
    assert [s["name"] for s in steps if s["op"] == "model"] == ["model.stream", "model.stream"]


async def test_a_tool_that_needs_approval_pauses_until_another_process_approves(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 537
    db = tmp_path / "oa.sqlite"
    refunds: list[int] = []
    server.push(call("refund", order=42), "refunded order 42")
    with Store(db=db) as store:
        agent = _agent(client, refunds, approval=True)
        with pytest.raises(ApprovalPendingError) as err:
            await DurableRunner.run(agent, "refund order 42", store=store, key="ticket-42")
        assert [c["call_id"] for c in err.value.calls] == ["call_1_0"]
        assert store.read("ticket-42")["status"] == "paused"
        assert refunds == []
        approved = subprocess.run(
            [
                sys.executable,
                "-m",
                "stepstone.cli",
                "approve",
                "--db",
                str(db),
                "ticket-42",
                "call_1_0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert approved.returncode == 0, approved.stderr
        result = await DurableRunner.run(agent, "refund order 42", store=store, key="ticket-42")
        assert not isinstance(result, RecordedRunResult)
        assert result.final_output == "refunded order 42" and refunds == [42]
        assert len(server.requests) == 2  # the first answer was replayed


async def test_a_denied_tool_call_is_not_run_and_the_model_reads_why(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 537
    db = tmp_path / "oa.sqlite"
    refunds: list[int] = []
    server.push(call("refund", order=9), "could not refund")
    with Store(db=db) as store:
        agent = _agent(client, refunds, approval=True)
        with pytest.raises(ApprovalPendingError):
            await DurableRunner.run(agent, "refund order 9", store=store, key="ticket-9")
        denied = CliRunner().invoke(
            app, ["approve", "--db", str(db), "ticket-9", "call_1_0", "--deny", "never paid"]
        )
        assert denied.exit_code == 0, denied.output
        result = await DurableRunner.run(agent, "refund order 9", store=store, key="ticket-9")
        assert result.final_output == "could not refund" and refunds == []
    tool_message = [m for m in server.requests[-1].json()["messages"] if m["role"] == "tool"]
    assert "never paid" in tool_message[0]["content"]


def test_without_a_workflow_or_a_key_the_runner_says_what_to_pass(server: LoopbackServer) -> None:
    # guarantee 544
    agent = _agent(AsyncOpenAI(base_url=server.base_url, api_key="test"), [])
    with pytest.raises(UserError, match="store=Store"):
        DurableRunner.run_sync(agent, "hi")
    with pytest.raises(UserError, match="together"):
        DurableRunner.run_sync(agent, "hi", key="k")
    with pytest.raises(UserError, match="inside a @workflow"):
        DurableRunner.run_streamed(agent, "hi")
    assert server.requests == []


async def test_mcp_server_tool_calls_are_journaled_and_replayed(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 545
    from agents.mcp import MCPServerStdio

    log = tmp_path / "mcp.log"
    script = Path(__file__).with_name("mcp_docs_server.py")
    server.push(call("search_docs", query="refunds"), "read the docs")
    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    params = {"command": sys.executable, "args": [str(script), str(log)]}
    async with MCPServerStdio(params=params, name="docs") as docs:  # type: ignore[arg-type]
        model = OpenAIChatCompletionsModel("gpt-4o-mini", client)
        agent = Agent(name="support", instructions="Help.", model=model, mcp_servers=[docs])

        @workflow(store=Store(db=tmp_path / "oa.sqlite"), key="mcp")
        async def handle(ticket: str) -> str:
            return await after(str((await DurableRunner.run(agent, ticket)).final_output))

        with pytest.raises(ConnectionError):
            await handle.run("how do refunds work?")
        calls = [line for line in log.read_text().splitlines() if line.startswith("call")]
        assert calls == ["call refunds"]
        assert await handle.run("how do refunds work?") == "read the docs"
    assert [line for line in log.read_text().splitlines() if line.startswith("call")] == calls
    steps = Store(db=tmp_path / "oa.sqlite").read("mcp")["steps"]
    assert [s["args"] for s in steps if s["name"] == "mcp:docs:search_docs"] == [
        {"args": {"query": "refunds"}}
    ]
    assert len(server.requests) == 2


async def test_run_streamed_feeds_a_run_stream_live_and_once(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 548
    from stepstone.durable._messages import read_stream

    refunds: list[int] = []
    server.push(call("refund", order=5), "refunded order 5")
    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    db = tmp_path / "oa.sqlite"

    @workflow(store=Store(db=db), key="fed")
    async def handle(ticket: str) -> str:
        streamed = DurableRunner.run_streamed(_agent(client, refunds), ticket, stream_to="tokens")
        items = [
            e.name async for e in streamed.stream_events() if e.type == "run_item_stream_event"
        ]
        assert "tool_output" in items
        return await after(str(streamed.final_output))

    def written() -> list[Any]:
        with Store(db=db) as store:
            return [v for _, v in read_stream(store, "fed", "tokens", follow=False)]

    with pytest.raises(ConnectionError):
        await handle.run("refund order 5")
    first = written()
    text = "".join(v["delta"] for v in first if v["type"] == "response.output_text.delta")
    assert text == "refunded order 5"
    assert any(v["type"] == "response.function_call_arguments.delta" for v in first)
    assert await handle.run("refund order 5") == "refunded order 5"
    assert written() == first  # the replayed answers wrote nothing again
    assert len(server.requests) == 2 and refunds == [5]
    with pytest.raises(ConfigurationError, match="stream name"):
        DurableRunner.run_streamed(_agent(client, refunds), "x", stream_to="")


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_sdks_default_responses_model_is_journaled_and_replayed(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI, streamed: bool
) -> None:
    # guarantee 540, 543: the SDK's default model (the Responses API), streamed or not
    from agents import OpenAIResponsesModel

    refunds: list[int] = []
    server.push(call("refund", order=3), "refunded order 3")
    flaky = {"left": 1}

    @function_tool
    def refund(order: int) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    model = OpenAIResponsesModel("gpt-4o-mini", client)
    agent = Agent(name="support", instructions="Help.", tools=[refund], model=model)

    @workflow(store=Store(db=tmp_path / "oa.sqlite"), key="responses")
    async def handle(ticket: str) -> str:
        if streamed:
            run = DurableRunner.run_streamed(agent, ticket, stream_to="tokens")
            async for _ in run.stream_events():
                pass
            return await after(str(run.final_output))
        result = await DurableRunner.run(agent, ticket)
        return await after(str(result.final_output))

    with pytest.raises(ConnectionError):
        await handle.run("refund order 3")
    assert await handle.run("refund order 3") == "refunded order 3"
    assert refunds == [3] and len(server.requests) == 2
    assert all(r.path.endswith("/responses") for r in server.requests)
    assert [bool(r.json().get("stream")) for r in server.requests] == [streamed, streamed]


async def test_an_agent_used_as_a_tool_is_one_journaled_call(
    tmp_path: Path, server: LoopbackServer, client: AsyncOpenAI
) -> None:
    # guarantee 540: an agent used as a tool (Agent.as_tool) is a tool call of the run
    refunds: list[int] = []
    billing = _agent(client, refunds)
    tool = billing.as_tool(tool_name="billing", tool_description="Ask billing.")
    model = OpenAIChatCompletionsModel("gpt-4o-mini", client)
    triage = Agent(name="triage", instructions="Route.", tools=[tool], model=model)
    server.push(
        call("billing", input="refund order 42"),  # triage asks billing
        call("refund", order=42),  # billing's own turn
        "billing refunded 42",
        "all done: billing refunded 42",  # triage's answer
    )
    flaky = {"left": 1}

    @step
    def after(text: str) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("down")
        return text

    @workflow(store=Store(db=tmp_path / "oa.sqlite"), key="as-tool")
    async def handle(ticket: str) -> str:
        return await after(str((await DurableRunner.run(triage, ticket)).final_output))

    with pytest.raises(ConnectionError):
        await handle.run("refund order 42")
    assert len(server.requests) == 4 and refunds == [42]
    assert await handle.run("refund order 42") == "all done: billing refunded 42"
    assert len(server.requests) == 4 and refunds == [42]  # replayed: billing not asked again
    steps = Store(db=tmp_path / "oa.sqlite").read("as-tool")["steps"]
    assert [(s["op"], s["name"]) for s in steps if s["op"] != "step"] == [
        ("model", "model"),
        ("tool", "billing"),
        ("model", "model"),
    ]
