"""A durable agent run in its own process, on the OpenAI SDK against the parent's loopback
server, for the SIGKILL tests of turn commits and approvals.

Usage: agent_worker.py MODE DB BASE_URL OPTIONS  (MODE: run | resume; OPTIONS: JSON)

OPTIONS: ``async_writes`` (bool, default true), ``approvals`` (for a resume),
``in_doubt`` (of ``refund``, default "rerun"), ``max_tool_calls_per_turn``,
``continue_on_length``, ``structured`` (the agent answers a ``Verdict``), ``hold_in`` (a
tool name: it waits forever once its side effect is done, for the parent to kill it).

Every side effect appends a line to ``DB.ledger`` (fsynced) before the tool returns
(``append:<x>``, ``refund:<order>:<idempotency key>``); a tool told to hold then writes
``DB.holding``. Prints the result as JSON, or the error
raised as ``{"raised": <class name>, "message": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stepstone import Agent, LLMEngine, Runner, RunnerConfig, Store, ToolContext, tool
from stepstone.exceptions import StepstoneError
from stepstone.providers import OpenAIProvider


class Verdict(BaseModel):
    """A structured answer."""

    ok: bool


def _effect(db: str, line: str, hold: bool) -> None:
    fd = os.open(db + ".ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if hold:
        Path(db + ".holding").write_text(str(os.getpid()))
        while True:  # the parent kills this process with SIGKILL
            time.sleep(1)


def build(db: str, base_url: str, opts: dict[str, Any]) -> Agent:
    hold = opts.get("hold_in")

    @tool
    def append(x: str) -> str:
        """Append a line."""
        _effect(db, f"append:{x}", hold == "append")
        return f"appended {x}"

    @tool(requires_approval=True, in_doubt=opts.get("in_doubt", "rerun"))
    def refund(order: str, ctx: ToolContext) -> str:
        """Refund an order (a person approves each refund)."""
        _effect(db, f"refund:{order}:{ctx.idempotency_key}", hold == "refund")
        return f"refunded {order}"

    engine = LLMEngine(
        "gpt-4o",
        provider=OpenAIProvider(base_url=base_url, api_key="test"),
        retry_delay=0.01,
        max_tool_calls_per_turn=opts.get("max_tool_calls_per_turn"),
        continue_on_length=opts.get("continue_on_length", 0),
    )
    output: type = Verdict if opts.get("structured") else str
    return Agent(engine=engine, name="worker", tools=[append, refund], output=output)


def main() -> None:
    mode, db, base_url, raw = sys.argv[1:5]
    opts: dict[str, Any] = json.loads(raw)
    config = RunnerConfig(checkpoint_async_writes=opts.get("async_writes", True))
    agent = build(db, base_url, opts)
    with Store(db=db) as store:
        runner = Runner(store=store, config=config)
        try:
            if mode == "run":
                result = runner.run_sync(agent, user_message="go", run_id="r", thread_id="t")
            else:
                result = runner.resume_sync(
                    agent, run_id="r", thread_id="t", approvals=opts.get("approvals")
                )
        except StepstoneError as exc:
            print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
            return
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
