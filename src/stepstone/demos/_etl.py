"""The `stepstone demo` ETL story: crash, inspect, resume, cached result, fork fan-out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.rule import Rule

from stepstone import Agent, Plan, Step, Store
from stepstone.cli._render import render_entry

__all__ = ["run_etl_demo"]

KEY = "etl-2026-04-30"


class ValidationReport(BaseModel):
    """What the validate step decided."""

    rejected_rows: list[int]
    accepted_rows: int


class _Story:
    """The ETL functions, with a switch that makes validate crash the first time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.crash = True

    def _say(self, step: str, what: str) -> None:
        self.console.print(f"    [cyan]▶ {step}[/] {what}")

    def extract(self, task: str) -> str:
        self._say("extract", f"pulls rows for {task!r} (the slow, expensive step)")
        return "id,amount\n1,10\n2,-5\n3,7\n4,12"

    def transform(self, raw: str) -> str:
        self._say("transform", "normalises the rows")
        return raw.replace(",", ";")

    def validate(self, clean: str) -> ValidationReport:
        if self.crash:
            self._say("validate", "[red]process crashes (simulated KeyboardInterrupt)[/]")
            raise KeyboardInterrupt("simulated crash during validate")
        rows = clean.splitlines()[1:]
        rejected = [i for i, row in enumerate(rows, 1) if "-" in row]
        self._say("validate", f"rejects rows {rejected}")
        return ValidationReport(rejected_rows=rejected, accepted_rows=len(rows) - len(rejected))

    def load(self, report: ValidationReport) -> str:
        self._say("load", f"loads {report.accepted_rows} rows into the warehouse")
        return f"loaded {report.accepted_rows} rows"

    def agent(self, store: Store) -> Agent:
        return Agent(
            engine=Plan(
                Step(self.extract, name="extract", writes="raw"),
                Step(self.transform, name="transform", writes="clean"),
                Step(self.validate, name="validate", writes="verdict", output=ValidationReport),
                Step(self.load, name="load", writes="loaded"),
                store=store,
                checkpoint_key=KEY,
                resume=True,
            )
        )


def _score(ticker: str) -> dict[str, Any]:
    prices = {"AAPL": (190, 195), "GOOG": (140, 145), "MSFT": (410, 420)}[ticker]
    return {"ticker": ticker, "return_pct": round(100 * (prices[1] - prices[0]) / prices[0], 2)}


def run_etl_demo(console: Console, db: Path) -> None:
    """Narrate the ETL crash/resume story on the SQLite file ``db``."""
    store = Store(db=db)
    story = _Story(console)
    try:
        # A second demo on the same file starts the story over instead of resuming the
        # finished run (which would skip the crash it narrates).
        old = [k for k in (KEY, *store.keys(prefix="backtest:")) if store.read_entry(k)]
        for key in old:
            store.delete(key)
        if old:
            console.print(f"  (this file holds an earlier demo; removed its runs {old})\n")
        console.print(Rule("Run 1: the pipeline crashes during validate"))
        try:
            story.agent(store)("today's batch")
        except KeyboardInterrupt:
            console.print("  [red]crashed[/] — but every finished step was committed first:")
        entry = store.read_entry(KEY)
        assert entry is not None
        render_entry(console, entry, history=False)
        console.print(f"  store.read('clean') = {store.read('clean')!r}  (sidecar readers agree)")

        console.print(Rule("Run 2: resume=True picks up at validate"))
        story.crash = False
        result = story.agent(store)("today's batch")
        console.print(
            f"  [green]done[/]: {result.payload!r}  (extract and transform did not re-run)"
        )

        console.print(Rule("Run 3: the plan is done; resume short-circuits to the cached kv"))
        result = story.agent(store)("today's batch")
        console.print(f"  no step ran; payload keys: {sorted(result.payload)}")
        console.print(f"  verdict: {result.payload['verdict']}")
        entry = store.read_entry(KEY)
        assert entry is not None
        render_entry(console, entry)

        console.print(Rule("Fan-out: three backtests at once with on_concurrent='fork'"))
        plan = Plan(
            Step(_score, name="score", writes="score"),
            store=store,
            checkpoint_key="backtest",
            on_concurrent="fork",
        )
        for env in plan.run_many(["AAPL", "GOOG", "MSFT"]):
            console.print(f"  {env.payload}  → checkpoint {env.metadata['checkpoint_key']}")
        console.print(f"  pruned {plan.prune_forks()} finished fork checkpoints")
    finally:
        store.close()
