"""Two LLM agents in a durable Plan: a researcher (tool use + structured output) feeds a writer.

    Plan(Step(researcher, writes="research", output=ResearchNotes),
         Step(writer, writes="draft"))

The researcher calls a local ``search_notes`` tool and returns validated ``ResearchNotes``;
the writer turns them into a short article. Each step is committed to a SQLite store before
the next starts, so re-running with the same checkpoint key after a crash skips the
research already paid for.

Offline by default when no API key is set: both agents run on ``stepstone.testing.FakeModel``
scripts. With ``ANTHROPIC_API_KEY`` (or ``OPENAI_API_KEY``, ``GOOGLE_API_KEY``) set, real
models are used; ``STEPSTONE_MODEL=<model id>`` picks one, ``--offline`` forces the scripts.

    python examples/research_and_write.py [--offline] [DB_PATH]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from stepstone import Agent, LLMEngine, Plan, Step, Store, from_prev
from stepstone.testing import FakeModel, call

TOPIC = "Why durable pipelines matter for LLM agents"

NOTES = {
    "durable": "A durable pipeline commits each step before the next starts, so a crash "
    "costs one step, not the whole run.",
    "cost": "LLM calls are slow and billed per token; re-running finished steps after a "
    "failure wastes both money and time.",
    "rate limits": "Provider rate limits (HTTP 429) are routine; a retried step should not "
    "repeat the steps before it.",
    "approval": "Pipelines that wait for human approval must survive deploys and restarts "
    "while they wait.",
}


def search_notes(query: str) -> list[str]:
    """Search the team's research notes.

    Args:
        query: Keywords to look for (e.g. "cost", "rate limits").
    """
    words = {w.strip(",.").lower() for w in query.split()}
    hits = [text for key, text in NOTES.items() if any(w in key or key in w for w in words)]
    return hits or list(NOTES.values())


class ResearchNotes(BaseModel):
    """What the researcher hands to the writer."""

    topic: str
    facts: list[str] = Field(min_length=1)
    angle: str


def pick_model(offline: bool) -> str | None:
    """A real model id when a key is set (and not --offline), else None."""
    if offline:
        return None
    if os.environ.get("STEPSTONE_MODEL"):
        return os.environ["STEPSTONE_MODEL"]
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "claude-haiku-4-5"
    if os.environ.get("OPENAI_API_KEY"):
        return "gpt-5-mini"
    if os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY"):
        return "gemini-2.5-flash"
    return None


def build_agents(model: str | None) -> tuple[Agent, Agent]:
    """The researcher and the writer, on a real model or on scripts."""
    if model is None:
        researcher_model: object = FakeModel(
            [
                call("search_notes", query="durable cost"),
                call("search_notes", query="rate limits approval"),
                ResearchNotes(
                    topic=TOPIC,
                    facts=[NOTES["durable"], NOTES["cost"], NOTES["rate limits"]],
                    angle="Failures are normal; paying for work twice should not be.",
                ),
            ],
            model_name="scripted-researcher",
        )
        writer_model: object = FakeModel(
            [
                "Failures are normal in LLM pipelines: rate limits, timeouts and deploys "
                "happen every day. A durable pipeline commits each step before starting the "
                "next, so a crash costs one step instead of the whole run, and the tokens "
                "already paid for are never bought twice."
            ],
            model_name="scripted-writer",
        )
    else:
        researcher_model = writer_model = model
    researcher = Agent(
        engine=LLMEngine(
            researcher_model,  # type: ignore[arg-type]
            system="You are a careful researcher. Use search_notes, then answer with notes.",
            max_turns=6,
        ),
        tools=[search_notes],
        name="researcher",
    )
    writer = Agent(
        engine=LLMEngine(
            writer_model,  # type: ignore[arg-type]
            system="You write one tight paragraph (under 120 words) from research notes.",
        ),
        name="writer",
    )
    return researcher, writer


def build_plan(store: Store, researcher: Agent, writer: Agent) -> Plan:
    """researcher -> writer; the writer gets the notes as context (``from_prev``)."""
    return Plan(
        Step(researcher, writes="research", output=ResearchNotes),
        Step(
            writer,
            task="Write the paragraph from the research notes in your context.",
            context=from_prev,
            writes="draft",
        ),
        store=store,
        checkpoint_key="research-and-write",
        resume=True,
    )


def main(argv: list[str]) -> int:
    offline = "--offline" in argv
    args = [a for a in argv if a != "--offline"]
    if not args:
        with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
            return main([*argv, str(Path(tmp) / "research.sqlite")])
    db = Path(args[0])
    model = pick_model(offline)
    print(f"mode: {'real model ' + model if model else 'offline (scripted models)'}")

    store = Store(db=str(db))
    plan = build_plan(store, *build_agents(model))
    env = Agent(engine=plan)(TOPIC)
    if not env.ok:
        assert env.error is not None
        print(f"failed: {env.error.type}: {env.error.message}")
        return 1

    research = store.read("research")
    print(f"research: {len(research['facts'])} facts, angle: {research['angle']}")
    print("draft:")
    print(f"  {env.payload}")
    print(f"store keys: {sorted(k for k in store.keys() if k in ('research', 'draft'))}")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
