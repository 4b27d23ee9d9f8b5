"""Deterministic durable agent runs and every view of them, to compare journal formats.

``write_runs(db)`` runs the scenarios below into a SQLite store (the crash scenario in a
child process that dies inside a tool call); ``views(store)`` computes what a user or an
operator sees of every agent run in the store: ``runner.checkpoints()``,
``runner.snapshot()``, ``runner.runs()``, ``store.read()`` of each run's key, the
``stepstone history`` timeline and the ``stepstone show`` detail (phases, effects,
pending approvals). ``freeze(db)`` adds the runs' heads and journal rows.

``tests/durable/fixtures/agent_journal_v1.json.gz`` holds what the stepstone of the first
journal format wrote and showed for these runs; ``test_agent_format.py`` checks that the
same rows still show the same views, and that the current format shows the same views
for the same runs (times and random ids aside).

    python -m tests.durable.agent_runs OUT.json.gz COMMIT   # never over a frozen format
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stepstone import Agent, Plan, Runner, RunnerConfig, Step, Store, tool
from stepstone.durable import run_detail
from stepstone.durable._inspect import salvaged_timeline
from stepstone.providers import ModelRequest, Usage
from stepstone.store._base import read_salvaged
from stepstone.testing import FunctionModel, Reply, call

ROOT = Path(__file__).resolve().parents[2]
USAGE = Usage(input_tokens=120, output_tokens=30, cache_read_tokens=4)

#: Every tool call that ran in this process, as ``"tool arguments"`` (what must not run twice).
RAN: list[str] = []


@tool
async def lookup(n: int) -> str:
    """Look a number up."""
    RAN.append(f"lookup {n}")
    return f"value {n}: " + "v" * 200


@tool
def note(text: str, tags: list[str]) -> str:
    """Write a note."""
    return f"noted {text} {sorted(tags)}"


@tool
async def broken(why: str) -> str:
    """Always fails."""
    raise ValueError(f"broken: {why}")


@tool(requires_approval=True)
async def refund(order: str, amount: int) -> str:
    """Refund an order."""
    RAN.append(f"refund {order}")
    return f"refunded {amount} on {order}"


@tool
def explode(n: int) -> str:
    """Dies in the crash scenario's child process (nothing is recorded after its intent)."""
    if os.environ.get("STEPSTONE_TEST_DIE") == "1":
        os._exit(0)
    RAN.append(f"explode {n}")
    return f"exploded {n}"


class Verdict(BaseModel):
    ok: bool
    reason: str


def _replies(turns: dict[int, Any]) -> FunctionModel:
    def script(request: ModelRequest) -> Any:
        return turns[request.turn]

    return FunctionModel(script)


def tools_agent() -> Agent:
    """Three turns: two tools at once, a failing tool, then the answer."""
    turns = {
        0: Reply(
            tool_calls=[call("lookup", n=1), call("note", text="hi", tags=["b", "a"])],
            usage=USAGE,
        ),
        1: Reply(text="thinking aloud", tool_calls=[call("broken", why="x")], usage=USAGE),
        2: Reply(text="all done", usage=USAGE, thinking="done thinking"),
    }
    return Agent(name="helper", model=_replies(turns), tools=[lookup, note, broken])


def approval_agent() -> Agent:
    turns = {
        0: Reply(tool_calls=[call("lookup", n=2), call("refund", order="o-1", amount=5)]),
        1: Reply(text="refund handled"),
    }
    return Agent(name="support", model=_replies(turns), tools=[lookup, refund])


def structured_agent() -> Agent:
    turns = {
        0: Reply(tool_calls=[call("lookup", n=3)]),
        1: Reply(text='{"ok": true, "reason": "fine"}'),
    }
    return Agent(name="judge", model=_replies(turns), tools=[lookup], output=Verdict)


def parent_agent() -> Agent:
    child_turns = {0: Reply(tool_calls=[call("lookup", n=4)]), 1: Reply(text="child answer")}
    child = Agent(name="child", model=_replies(child_turns), tools=[lookup])
    turns = {0: Reply(tool_calls=[call("child", task="go")]), 1: Reply(text="parent done")}
    return Agent(name="parent", model=_replies(turns), tools=[child])


def crash_agent() -> Agent:
    turns = {
        0: Reply(tool_calls=[call("lookup", n=5)]),
        1: Reply(tool_calls=[call("explode", n=6)]),
    }
    turns[2] = Reply(text="survived")
    return Agent(name="crasher", model=_replies(turns), tools=[lookup, explode])


def long_agent(n_turns: int) -> Agent:
    def script(request: ModelRequest) -> Any:
        if request.turn < n_turns - 1:
            return Reply(tool_calls=[call("lookup", n=request.turn)], usage=USAGE)
        return Reply(text="long done", usage=USAGE)

    return Agent(name="long", model=FunctionModel(script), tools=[lookup], max_turns=n_turns + 1)


def plan_agent() -> Agent:
    llm = Agent(
        name="stepper",
        model=_replies({0: Reply(tool_calls=[call("lookup", n=7)]), 1: Reply(text="step text")}),
        tools=[lookup],
    )
    return llm


def _config(async_writes: bool, coalesce: bool = True) -> RunnerConfig:
    # No background flush: commits fall where the loop puts them, however slow the machine.
    return RunnerConfig(
        checkpoint_async_writes=async_writes,
        checkpoint_coalesce_runtime_state=coalesce,
        checkpoint_flush_interval_s=600.0,
    )


async def _runs(store: Store) -> None:
    behind, sync = (
        Runner(store=store, config=_config(True)),
        Runner(store=store, config=_config(False)),
    )
    every = Runner(store=store, config=_config(True, coalesce=False))
    ctx = {"customer": "c-9", "tier": 2}
    await behind.run(
        tools_agent(), user_message="do it", run_id="tools", thread_id="t1", context=ctx
    )
    await sync.run(tools_agent(), user_message="do it", run_id="tools-sync", thread_id="t1")
    await every.run(tools_agent(), user_message="do it", run_id="tools-every", thread_id="t2")
    paused = await behind.run(
        approval_agent(), user_message="refund o-1", run_id="approval", thread_id="t3"
    )
    assert paused.state == "paused", paused
    held = await sync.run(
        approval_agent(), user_message="refund o-1", run_id="approval-held", thread_id="t3"
    )
    assert held.state == "paused", held
    call_id = paused.pending_approvals[0]["call_id"]
    done = await behind.resume(
        approval_agent(), run_id="approval", thread_id="t3", approvals={call_id: True}
    )
    assert done.state == "completed", done
    denied = await sync.run(
        approval_agent(), user_message="refund o-1", run_id="approval-denied", thread_id="t3"
    )
    await sync.resume(
        approval_agent(),
        run_id="approval-denied",
        thread_id="t3",
        approvals={denied.pending_approvals[0]["call_id"]: "too late"},
    )
    await behind.run(structured_agent(), user_message="judge", run_id="structured", thread_id="t4")
    await behind.run(parent_agent(), user_message="delegate", run_id="parent", thread_id="t5")
    await behind.run(long_agent(8), user_message="go long", run_id="long", thread_id="t6")
    env = await Agent(
        name="planner",
        engine=Plan(Step(plan_agent(), name="llm"), store=store, checkpoint_key="plan"),
    ).run("plan task")
    assert env.ok, env.error


CRASH = """
import asyncio, sys
from stepstone import Runner, Store
from tests.durable.agent_runs import _config, crash_agent
with Store(db=sys.argv[1]) as store:
    runner = Runner(store=store, config=_config(True))
    asyncio.run(runner.run(crash_agent(), user_message="crash", run_id="crash", thread_id="t7"))
"""


def write_runs(db: Path) -> None:
    """Run every scenario into the SQLite store ``db`` (the crash one in a child process that
    dies inside its second tool call, leaving it in doubt)."""
    with Store(db=db) as store:
        asyncio.run(_runs(store))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STEPSTONE_TEST_DIE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CRASH, str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr


RUN_IDS = (
    "tools",
    "tools-sync",
    "tools-every",
    "approval",
    "approval-held",
    "approval-denied",
    "structured",
    "parent",
    "long",
    "crash",
)


def _detail(store: Store, key: str) -> dict[str, Any]:
    found = run_detail(store, key, now=0.0)
    assert found is not None
    return {k: found[k] for k in ("agent", "pending_approvals", "steps")}


def views(store: Store) -> dict[str, Any]:
    """Every view of every agent run in ``store``, JSON-ready."""
    runner = Runner(store=store)
    out: dict[str, Any] = {"runs": runner.runs()}
    keys = sorted(h.key for h in store.backend.run_list(None) if h.kind == "agent")
    for key in keys:
        entry: dict[str, Any] = {"read": store.read(key), "show": _detail(store, key)}
        found = read_salvaged(store.backend, key)
        assert found is not None
        entry["history"] = salvaged_timeline(found)
        run_id = key.removeprefix("agent:").removesuffix(":checkpoint:latest")
        if run_id in RUN_IDS:
            entry["checkpoints"] = runner.checkpoints(run_id)
            entry["snapshot"] = runner.snapshot(run_id)
        out[key] = entry
    return json.loads(json.dumps(out))


def freeze(db: Path) -> dict[str, Any]:
    """The heads and journal rows of every run in ``db``, with their views."""
    with Store(db=db) as store:
        runs = []
        for head in store.backend.run_list(None):
            rows = store.backend.run_journal(head.key)
            runs.append(
                {
                    "head": dataclasses.asdict(head),
                    "rows": [[r.seq, r.kind, r.name, r.data] for r in rows],
                }
            )
        return {"runs": runs, "views": views(store)}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.sqlite"
        write_runs(db)
        frozen = freeze(db)
    frozen = {
        "comment": (
            "Durable agent runs journaled in the first agent journal format (one journal row "
            "per phase record, message, runtime snapshot, intent and outcome), with every "
            "view of them as that stepstone showed them. Generated by tests/durable/"
            "agent_runs.py with the code of commit " + sys.argv[2] + "; never edit."
        ),
        **frozen,
    }
    text = json.dumps(frozen, indent=1, sort_keys=True) + "\n"
    Path(sys.argv[1]).write_bytes(gzip.compress(text.encode(), mtime=0))


if __name__ == "__main__":
    main()
