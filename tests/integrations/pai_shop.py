"""A pydantic-ai support agent for the integration tests: four model turns, five tool
calls (two sequential, one alone, two in parallel), on pydantic-ai's OpenAI model pointed at
a loopback OpenAI-wire server whose answers are a function of the conversation so far
(:func:`reply`), so a request sent again gets the same answer.

Tools count their effects with :mod:`tests.integrations.effects`. ``SHOP_KILL_AT``
(``answer:charge``, ``inside:charge``, ``between:reserve-a``, ``inside:notify-seller``)
kills the process once at that point: after the model answered with the charge call,
before the tool ran; inside a tool after its effect; after one sequential tool returned,
before the next started; inside one of two tools run in parallel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition

from stepstone import workflow
from stepstone.integrations.pydantic_ai import StepstoneDurability
from stepstone.providers import ToolCall
from stepstone.testing import RecordedRequest, Reply
from tests.integrations.effects import die_at, effect


def reply(request: RecordedRequest) -> Any:
    """The loopback model: the answer to a Chat Completions request, from how many
    assistant turns its messages hold."""
    messages = request.json()["messages"]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return Reply(
            tool_calls=(
                ToolCall(id="r-a", name="reserve", arguments={"item": "a"}),
                ToolCall(id="r-b", name="reserve", arguments={"item": "b"}),
            )
        )
    if turn == 1:
        return Reply(tool_calls=(ToolCall(id="c-1", name="charge", arguments={"cents": 1299}),))
    if turn == 2:
        return Reply(
            tool_calls=(
                ToolCall(id="n-b", name="notify", arguments={"who": "buyer"}),
                ToolCall(id="n-s", name="notify", arguments={"who": "seller"}),
            )
        )
    results = [m["content"] for m in messages if m["role"] == "tool"]
    return Reply(text="done: " + ", ".join(results))


#: The output of an uninterrupted run.
EXPECTED = "done: reserved a, reserved b, receipt-1299, told buyer, told seller"
#: Model requests of an uninterrupted run.
REQUESTS = 4
EFFECTS = ["reserve-a", "reserve-b", "charge-1299", "notify-buyer", "notify-seller"]


class _Killer(AbstractCapability[Any]):
    """Kills the process once at ``answer:charge`` / ``between:reserve-a`` (workflow side)."""

    def __init__(self, shop: Shop) -> None:
        self.shop = shop

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        if any(isinstance(p, ToolCallPart) and p.tool_name == "charge" for p in response.parts):
            die_at(self.shop.logs, "answer:charge")
        return response

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        result: Any,
    ) -> Any:
        if call.tool_call_id == "r-a":
            die_at(self.shop.logs, "between:reserve-a")
        return result


class Shop:
    """The agent and its logs (see the module docstring)."""

    def __init__(self, base_url: str, logs: Path) -> None:
        self.logs = logs
        provider = OpenAIProvider(base_url=base_url, api_key="test")
        model = OpenAIChatModel("gpt-4o-mini", provider=provider)
        self.agent: Agent[None, str] = Agent(
            model, name="shop", capabilities=[StepstoneDurability(), _Killer(self)]
        )
        self.agent.tool_plain(sequential=True)(self.reserve)
        self.agent.tool_plain(self.charge)
        self.agent.tool_plain(self.notify)

    def reserve(self, item: str) -> str:
        """Reserve one item."""
        effect(self.logs, f"reserve-{item}", f"reserve-{item}")
        return f"reserved {item}"

    def charge(self, cents: int) -> str:
        """Charge the customer."""
        effect(self.logs, f"charge-{cents}", "charge")
        return f"receipt-{cents}"

    async def notify(self, who: str) -> str:
        """Tell someone."""
        effect(self.logs, f"notify-{who}", f"notify-{who}")
        return f"told {who}"


@workflow
async def handle_ticket(base_url: str, logs: str, ticket: str) -> dict[str, Any]:
    """The workflow the tests run, submit and kill: one agent run, its outcome as JSON
    (output, and the model requests and tokens ``result.usage`` counted)."""
    agent = Shop(base_url, Path(logs)).agent
    async with agent:  # closes the model's HTTP client when the run is over
        result = await agent.run(ticket)
    usage = result.usage
    return {
        "output": result.output,
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }
