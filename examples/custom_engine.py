"""An engine of your own, and where a caller records a run.

An Agent gives its engine one ``RunContext`` per call: the agent's name, tools, output
type and session, and an optional ``RunLocation`` (where a durable engine records the run
when the caller decides it). This example:

1. writes a small engine taking ``run(env, ctx)`` (a "tool router" that calls the tool the
   task names), shared by two agents that each see their own name;
2. keeps an engine written to the older keyword interface working unchanged;
3. runs a Plan under a key the caller chooses (as a worker does with its queue entry's
   key): a failed run continues there, a finished one returns its cached result.

    python examples/custom_engine.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from stepstone import Agent, Envelope, Plan, RunContext, RunLocation, Session, Step, Store


def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def count(text: str) -> int:
    """Count the words."""
    return len(text.split())


class ToolRouter:
    """Runs the tool named by the task's first word on the rest: ``"shout hello"``."""

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        name, _, rest = (env.task or "").partition(" ")
        tools = {t.name: t for t in ctx.tools}
        if name not in tools:
            error = LookupError(f"{ctx.agent_name} has no tool {name!r} (tools: {sorted(tools)})")
            return Envelope.error_envelope(error, task=env.task)
        result = await tools[name].run(text=rest)
        return Envelope(task=env.task, payload=result, metadata={"by": ctx.agent_name})


class LegacyEcho:
    """An engine written to the keyword interface: still called that way."""

    async def run(
        self,
        env: Envelope[Any],
        *,
        tools: list[Any],
        output_type: type,
        memory: Any,
        session: Session | None,
    ) -> Envelope[Any]:
        return Envelope(task=env.task, payload=f"echo ({len(tools)} tools): {env.task}")


def main() -> None:
    router = ToolRouter()  # one engine, two agents: the engine is never written to
    loud = Agent(engine=router, name="loud", tools=[shout])
    counter = Agent(engine=router, name="counter", tools=[count])
    env = loud("shout hello there")
    print(env.metadata["by"], env.payload)  # loud HELLO THERE
    env = counter("count hello there")
    print(env.metadata["by"], env.payload)  # counter 2
    print(counter("shout nope").error.message)  # type: ignore[union-attr]

    print(Agent(engine=LegacyEcho(), tools=[shout])("hi").payload)  # echo (1 tools): hi

    attempts: list[str] = []

    def flaky(text: str) -> str:
        attempts.append(text)
        if len(attempts) == 1:
            raise RuntimeError("the service is down")
        return f"stored {text}"

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(db=Path(tmp) / "runs.sqlite")
        agent = Agent(engine=Plan(Step(shout), Step(flaky)), name="etl")
        here = RunLocation(store=store, key="nightly-2026-04-30")
        first = agent("batch", location=here)
        print("run 1:", first.error.type if first.error else first.payload)  # RuntimeError
        print("recorded:", store.read("nightly-2026-04-30")["status"])  # failed
        second = agent("batch", location=here)  # continues at flaky; shout is not re-run
        print("run 2:", second.payload)  # stored BATCH
        third = agent("batch", location=here)  # done: the cached kv, nothing runs
        print("run 3: cached", third.metadata["cached"], "attempts", len(attempts))
        store.close()


if __name__ == "__main__":
    main()
