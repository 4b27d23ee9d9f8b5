"""A pydantic-ai support agent made durable by stepstone: its process is killed inside a
tool, and the resumed run asks the model nothing twice and refunds once.

The agent (``StepstoneDurability``) runs inside a workflow. Its model is a pydantic-ai
``FunctionModel`` (offline): look the order up, refund it, then answer. The script runs the
workflow in a child process that kills itself (SIGKILL) inside the refund tool, right after
the refund was made; then it runs the same key again in this process. The resumed run
replays the model's answers and the lookup from the journal, runs the refund call again
(it was cut short: in doubt) with the same idempotency key, which the payment service
below uses to refund once, and finishes.

Usage: python examples/pydantic_ai_support.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepstone
from stepstone import Store, workflow
from stepstone.integrations.pydantic_ai import StepstoneDurability


def _log(line: str) -> None:
    with open(os.environ["SUPPORT_LOG"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _lines() -> list[str]:
    path = Path(os.environ["SUPPORT_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: look the order up, refund it, then say so."""
    _log("model request")
    turn = sum(1 for m in messages if m.kind == "response")
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"order_id": 42}, tool_call_id="l1")])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("refund", {"order_id": 42}, tool_call_id="r1")])
    return ModelResponse(parts=[TextPart("Order 42 is refunded.")])


agent = Agent(FunctionModel(answer), name="support", capabilities=[StepstoneDurability()])


@agent.tool_plain
def lookup(order_id: int) -> str:
    """Find an order."""
    _log("lookup")
    return f"order {order_id}: 12.99 USD, paid"


@agent.tool_plain
def refund(order_id: int) -> str:
    """Refund an order."""
    key = stepstone.step_context().idempotency_key  # the same when this call runs again
    if f"refunded {key}" not in _lines():  # the payment service refunds a key once
        _log(f"refunded {key}")
    _log("refund call")
    if os.environ.get("SUPPORT_DIE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies inside the tool
    return f"refunded order {order_id}"


@workflow(key="ticket-{ticket_id}")
async def handle_ticket(ticket_id: int, text: str) -> str:
    result = await agent.run(text)
    return result.output


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SUPPORT_LOG"] = str(Path(tmp) / "log")
        db = str(Path(tmp) / "support.sqlite")
        child = subprocess.run(
            [sys.executable, __file__, db],
            env={**os.environ, "SUPPORT_DIE": "1"},
            capture_output=True,
            text=True,
        )
        print(f"first process: killed by signal {-child.returncode} inside the refund tool")
        with Store(db=db) as store:
            print("result:", handle_ticket.using(store=store).run_sync(42, "please refund 42"))
        ran = Counter(line.split()[0] if line.startswith("refunded") else line for line in _lines())
        print(f"model requests: {ran['model request']} (3 answers, none asked twice)")
        print(f"lookup ran: {ran['lookup']} time(s)")
        print(f"refund tool ran: {ran['refund call']} time(s) (cut short, then run again)")
        print(f"refunds made: {ran['refunded']}")


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the child process: run until the kill
        with Store(db=sys.argv[1]) as child_store:
            handle_ticket.using(store=child_store).run_sync(42, "please refund 42")
    else:
        main()
