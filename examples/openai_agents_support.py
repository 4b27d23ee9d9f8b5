"""An OpenAI Agents SDK support desk made durable by stepstone's ``DurableRunner``: its
process is killed inside a tool, and the resumed run sends no model request twice and
refunds once.

A triage agent hands off to a billing agent, which looks the order up and refunds it. The
model is the SDK's Chat Completions model talking to a loopback OpenAI-wire server
(``stepstone.testing.LoopbackServer``, offline) that answers from the conversation so far.
The script runs the desk under the key ``ticket-42`` in a child process that kills itself
(SIGKILL) inside the refund tool, right after the refund; then it runs the key again here.
The resumed run replays the committed answers and tool results, runs the refund call again
(it was cut short: in doubt) with the same idempotency key, which the payment service
below uses to refund once, and finishes.

Usage: python examples/openai_agents_support.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import stepstone
from stepstone import Store
from stepstone.integrations.openai_agents import DurableRunner
from stepstone.providers import ToolCall
from stepstone.testing import LoopbackServer, OpenAIDialect, RecordedRequest, Reply

set_tracing_disabled(True)  # offline: the SDK's traces would go to the OpenAI platform


def _log(line: str) -> None:
    with open(os.environ["DESK_LOG"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _lines() -> list[str]:
    path = Path(os.environ["DESK_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def reply(request: RecordedRequest) -> Any:
    """The model: hand off to billing, look the order up, refund it, then say so."""
    turn = sum(1 for m in request.json()["messages"] if m["role"] == "assistant")
    script = [
        ToolCall(id="h1", name="transfer_to_billing", arguments={}),
        ToolCall(id="l1", name="lookup", arguments={"order_id": 42}),
        ToolCall(id="r1", name="refund", arguments={"order_id": 42}),
    ]
    return Reply(tool_calls=(script[turn],)) if turn < 3 else "Order 42 is refunded."


@function_tool
def lookup(order_id: int) -> str:
    """Find an order."""
    _log("lookup")
    return f"order {order_id}: 12.99 USD, paid"


@function_tool
def refund(order_id: int) -> str:
    """Refund an order."""
    key = stepstone.step_context().idempotency_key  # the same when this call runs again
    if f"refunded {key}" not in _lines():  # the payment service refunds a key once
        _log(f"refunded {key}")
    _log("refund call")
    if os.environ.get("DESK_DIE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies inside the tool
    return f"refunded order {order_id}"


async def run_desk(db: str, base_url: str) -> Any:
    async with AsyncOpenAI(base_url=base_url, api_key="loopback") as client:
        model = OpenAIChatCompletionsModel("gpt-4o-mini", client)
        tools = [lookup, refund]
        billing = Agent(name="billing", instructions="Refund.", tools=tools, model=model)
        triage = Agent(name="triage", instructions="Route.", handoffs=[billing], model=model)
        with Store(db=db) as store:
            return await DurableRunner.run(triage, "please refund 42", store=store, key="ticket-42")


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        LoopbackServer(OpenAIDialect(), respond=reply) as server,
    ):
        os.environ["DESK_LOG"] = str(Path(tmp) / "log")
        db = str(Path(tmp) / "desk.sqlite")
        child = subprocess.run(
            [sys.executable, __file__, db, server.base_url],
            env={**os.environ, "DESK_DIE": "1"},
            capture_output=True,
            text=True,
        )
        print(f"first process: killed by signal {-child.returncode} inside the refund tool")
        sent = len(server.requests)
        result = asyncio.run(run_desk(db, server.base_url))
        print(f"result: {result.final_output} (answered by {result.last_agent.name})")
        print(f"model requests: {sent} before the kill, {len(server.requests) - sent} after")
        ran = Counter(line.split()[0] if line.startswith("refunded") else line for line in _lines())
        print(f"lookup ran: {ran['lookup']} time(s)")
        print(f"refund tool ran: {ran['refund call']} time(s) (cut short, then run again)")
        print(f"refunds made: {ran['refunded']}")


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the child process: run until the kill
        asyncio.run(run_desk(sys.argv[1], sys.argv[2]))
    else:
        main()
