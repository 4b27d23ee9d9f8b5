"""An OpenAI Agents SDK support desk for the integration tests: a triage agent hands off
to a billing agent, which makes five tool calls over three turns (two reserve calls and
two notify calls run in parallel), on the SDK's Chat Completions model pointed at a
loopback OpenAI-wire server whose answers are a function of the conversation so far
(:func:`reply`). Tools count their effects with :mod:`tests.integrations.effects`;
``SHOP_KILL_AT`` (``answer:charge``, ``inside:charge``, ``between:reserve-a``,
``inside:notify-seller``) kills the process once at that point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunHooks,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ModelResponse
from openai import AsyncOpenAI

from stepstone import workflow
from stepstone.integrations.openai_agents import DurableRunner
from stepstone.providers import ToolCall
from stepstone.testing import RecordedRequest, Reply
from tests.integrations.effects import die_at, effect

set_tracing_disabled(True)  # the SDK's traces would go to the OpenAI platform


def reply(request: RecordedRequest) -> Any:
    """The loopback model: the answer to a Chat Completions request, from how many
    assistant turns its messages hold."""
    messages = request.json()["messages"]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return Reply(tool_calls=(ToolCall(id="h-1", name="transfer_to_billing", arguments={}),))
    if turn == 1:
        return Reply(
            tool_calls=(
                ToolCall(id="r-a", name="reserve", arguments={"item": "a"}),
                ToolCall(id="r-b", name="reserve", arguments={"item": "b"}),
            )
        )
    if turn == 2:
        return Reply(tool_calls=(ToolCall(id="c-1", name="charge", arguments={"cents": 1299}),))
    if turn == 3:
        return Reply(
            tool_calls=(
                ToolCall(id="n-b", name="notify", arguments={"who": "buyer"}),
                ToolCall(id="n-s", name="notify", arguments={"who": "seller"}),
            )
        )
    results = [
        m["content"] for m in messages if m["role"] == "tool" and m.get("tool_call_id") != "h-1"
    ]
    return Reply(text="done: " + ", ".join(results))


EXPECTED = "done: reserved a, reserved b, receipt-1299, told buyer, told seller"
REQUESTS = 5
EFFECTS = ["reserve-a", "reserve-b", "charge-1299", "notify-buyer", "notify-seller"]


class _Killer(RunHooks[Any]):
    def __init__(self, logs: Path) -> None:
        self.logs = logs

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        if any(getattr(item, "name", None) == "charge" for item in response.output):
            die_at(self.logs, "answer:charge")

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        if getattr(context, "tool_call_id", None) == "r-a":
            die_at(self.logs, "between:reserve-a")


def desk(base_url: str, logs: Path) -> tuple[Agent[Any], AsyncOpenAI]:
    """The triage agent (and the client its models use, to close after the run)."""
    client = AsyncOpenAI(base_url=base_url, api_key="test")
    model = OpenAIChatCompletionsModel("gpt-4o-mini", client)

    @function_tool
    def reserve(item: str) -> str:
        """Reserve one item."""
        effect(logs, f"reserve-{item}", f"reserve-{item}")
        return f"reserved {item}"

    @function_tool
    def charge(cents: int) -> str:
        """Charge the customer."""
        effect(logs, f"charge-{cents}", "charge")
        return f"receipt-{cents}"

    @function_tool
    async def notify(who: str) -> str:
        """Tell someone."""
        effect(logs, f"notify-{who}", f"notify-{who}")
        return f"told {who}"

    billing = Agent(
        name="billing", instructions="Bill.", tools=[reserve, charge, notify], model=model
    )
    triage = Agent(name="triage", instructions="Route.", handoffs=[billing], model=model)
    return triage, client


@workflow
async def handle_ticket(base_url: str, logs: str, ticket: str) -> dict[str, Any]:
    """The workflow the tests run, submit and kill: one durable agent run."""
    triage, client = desk(base_url, Path(logs))
    async with client:
        result = await DurableRunner.run(triage, ticket, hooks=_Killer(Path(logs)))
    usage = result.context_wrapper.usage
    return {
        "output": result.final_output,
        "agent": result.last_agent.name,
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


def keyed_run(base_url: str, logs: str, store: Any, key: str) -> str:
    """The same desk run by ``DurableRunner.run_sync(..., store=, key=)`` (its own run)."""
    triage, _client = desk(base_url, Path(logs))
    result = DurableRunner.run_sync(
        triage, "order 42 please", store=store, key=key, hooks=_Killer(Path(logs))
    )
    return json.dumps(result.final_output)
