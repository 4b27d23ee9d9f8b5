"""Workflows whose agent asks a person before it refunds, for the queued-approval tests:
one per framework, each importable by a worker. The model asks for ``refund(order=42)``
(call id ``r-42``), then answers with what the tool said. The refund tool appends to
``refunds.log`` in the logs folder, so a test sees how often it ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents import Agent as OAAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from stepstone import workflow
from stepstone.integrations.openai_agents import DurableRunner
from stepstone.integrations.pydantic_ai import StepstoneDurability, approval_results
from stepstone.providers import ToolCall
from stepstone.testing import RecordedRequest, Reply
from tests.integrations import oa_shop

assert oa_shop.EXPECTED  # importing it turns the SDK's trace export off

CALL_ID = "r-42"
EXPECTED = "the tool said: refunded 42"


def _refund(logs: str, order: int) -> str:
    with open(Path(logs) / "refunds.log", "a", encoding="ascii") as fh:
        fh.write(f"{order}\n")
    return f"refunded {order}"


def refunds(logs: Path) -> list[str]:
    path = logs / "refunds.log"
    return path.read_text().split() if path.exists() else []


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not any(m.kind == "response" for m in messages):
        return ModelResponse(parts=[ToolCallPart("refund", {"order": 42}, tool_call_id=CALL_ID)])
    last = messages[-1].parts[-1]
    return ModelResponse(parts=[TextPart(f"the tool said: {last.content}")])  # type: ignore[union-attr]


@workflow
async def pai_ticket(base_url: str, logs: str, ticket: str) -> str:
    """A pydantic-ai agent whose refund tool needs approval (``requires_approval=True``)."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_model),
        name="support",
        output_type=[str, DeferredToolRequests],
        capabilities=[StepstoneDurability()],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order: int) -> str:
        return _refund(logs, order)

    result = await agent.run(ticket)
    if isinstance(result.output, DeferredToolRequests):
        result = await agent.run(
            message_history=result.all_messages(),
            deferred_tool_results=approval_results(result.output),
        )
    assert isinstance(result.output, str)
    return result.output


def reply(request: RecordedRequest) -> Any:
    """The loopback model of the Agents SDK desk: the refund call, then what it said."""
    messages = request.json()["messages"]
    said = [m["content"] for m in messages if m["role"] == "tool"]
    if not said:
        return Reply(tool_calls=(ToolCall(id=CALL_ID, name="refund", arguments={"order": 42}),))
    return Reply(text=f"the tool said: {said[-1]}")


@workflow
async def oa_ticket(base_url: str, logs: str, ticket: str) -> str:
    """An OpenAI Agents SDK agent whose refund tool needs approval (``needs_approval``)."""

    @function_tool(needs_approval=True)
    def refund(order: int) -> str:
        """Refund an order."""
        return _refund(logs, order)

    async with AsyncOpenAI(base_url=base_url, api_key="test") as client:
        model = OpenAIChatCompletionsModel("gpt-4o-mini", client)
        agent = OAAgent(name="support", instructions="Help.", tools=[refund], model=model)
        result = await DurableRunner.run(agent, ticket)
    return str(result.final_output)
