"""The ETL crash/resume example with four LLM agents in a Plan.

    extract -> transform -> validate (structured output) -> load

Run 1 crashes during validate; run 2 resumes at validate (extract and transform are NOT
re-run, so their tokens are not paid twice); run 3 finds the plan done and returns the
cached kv. Offline by default (each agent runs on a ``stepstone.testing.FakeModel``
script); with ``ANTHROPIC_API_KEY`` set the agents use ``claude-sonnet-4-6``
(``STEPSTONE_MODEL`` picks another model, ``--offline`` forces the scripts).

    python examples/etl_llm_agents.py [--offline] [DB_PATH]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stepstone import Agent, Envelope, LLMEngine, Plan, RunContext, Step, Store
from stepstone.testing import FakeModel

ROWS = "id,amount\n1,10\n2,-5\n3,7"


class ValidationReport(BaseModel):
    rejected_rows: list[int]
    accepted_rows: int


class CrashOnce:
    """Wraps an engine; its first run raises KeyboardInterrupt (a stand-in for a crash)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.crashed = False

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        # ctx: what the Agent gives its engine (its name, tools, output type...), passed on
        if not self.crashed:
            self.crashed = True
            raise KeyboardInterrupt("simulated crash during validate")
        return await self.engine.run(env, ctx)


def engine(model: str | None, script: list[Any], system: str) -> LLMEngine:
    return LLMEngine(model or FakeModel(script), system=system)  # type: ignore[arg-type]


def build_agents(model: str | None) -> list[Agent]:
    extract = Agent(
        engine=engine(model, [ROWS], f"Return exactly this CSV and nothing else:\n{ROWS}"),
        name="extract",
    )
    transform = Agent(
        engine=engine(
            model,
            [ROWS.replace(",", ";")],
            "Replace every comma of the CSV you are given with a semicolon. Output only CSV.",
        ),
        name="transform",
    )
    validate = Agent(
        engine=CrashOnce(
            engine(
                model,
                [{"rejected_rows": [2], "accepted_rows": 2}],
                "Rows with a negative amount are rejected. Report the rejected row ids and "
                "how many rows were accepted.",
            )
        ),
        name="validate",
        output=ValidationReport,
    )
    load = Agent(
        engine=engine(
            model,
            ["loaded 2 rows"],
            "You load validated rows. Answer 'loaded N rows' with N = accepted_rows.",
        ),
        name="load",
    )
    return [extract, transform, validate, load]


def build_plan(store: Store, agents: list[Agent]) -> Agent:
    return Agent(
        engine=Plan(
            Step("extract", writes="raw"),
            Step("transform", writes="clean"),
            Step("validate", writes="verdict", output=ValidationReport),
            Step("load", writes="loaded"),
            store=store,
            checkpoint_key="etl-2026-04-30",
            resume=True,
        ),
        tools=agents,
    )


def main(argv: list[str]) -> int:
    offline = "--offline" in argv
    args = [a for a in argv if a != "--offline"]
    if not args:
        with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
            return main([*argv, str(Path(tmp) / "pipeline.sqlite")])
    model = None
    if not offline:
        model = os.environ.get("STEPSTONE_MODEL") or (
            "claude-sonnet-4-6" if os.environ.get("ANTHROPIC_API_KEY") else None
        )
    print(f"mode: {'real model ' + model if model else 'offline (scripted models)'}")
    db = Path(args[0])
    store = Store(db=db)
    agents = build_agents(model)

    # Run 1: crashes during validate. status="failed", next_step="validate".
    try:
        build_plan(store, agents)("today's batch")
    except KeyboardInterrupt:
        state = store.read("etl-2026-04-30")
        print(
            f"run 1 crashed: status={state['status']!r} next_step={state['next_step']!r} "
            f"completed={state['completed_steps']}"
        )

    # Run 2: resumes at validate. extract + transform are NOT re-run.
    result = build_plan(store, agents)("today's batch")
    print(f"run 2 resumed: ok={result.ok} payload={result.payload!r}")

    # Run 3: plan is "done"; short-circuits and returns cached kv.
    result = build_plan(store, agents)("today's batch")
    print(f"run 3 cached: kv keys {sorted(result.payload)}")
    print(f"  verdict: {result.payload['verdict']}")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
