"""ETL crash and resume with plain Python functions.

Run 1 crashes during ``validate`` (a KeyboardInterrupt stands in for a crash); the checkpoint
says ``status="failed", next_step="validate"``. Run 2 resumes at ``validate``: ``extract``
and ``transform`` are NOT re-run. Run 3 finds the plan done and returns the cached ``kv``.

    python examples/etl_crash_resume.py [path/to/pipeline.sqlite]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel

from stepstone import Agent, Plan, Step, Store


class ValidationReport(BaseModel):
    rejected_rows: list[int]
    accepted_rows: int


calls: list[str] = []
crash_during_validate = True


def extract(task: str) -> str:
    """Pull today's rows (the slow, expensive step)."""
    calls.append("extract")
    return "id,amount\n1,10\n2,-5\n3,7"


def transform(raw: str) -> str:
    """Normalise the rows."""
    calls.append("transform")
    return raw.replace(",", ";")


def validate(clean: str) -> ValidationReport:
    """Reject rows with negative amounts."""
    calls.append("validate")
    if crash_during_validate:
        raise KeyboardInterrupt("simulated crash during validate")
    rows = clean.splitlines()[1:]
    rejected = [i for i, row in enumerate(rows, 1) if "-" in row]
    return ValidationReport(rejected_rows=rejected, accepted_rows=len(rows) - len(rejected))


def load(report: ValidationReport) -> str:
    """Write the accepted rows to the warehouse."""
    calls.append("load")
    return f"loaded {report.accepted_rows} rows"


def build_plan(store: Store) -> Agent:
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
        tools=[extract, transform, validate, load],
    )


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        run(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        run(Path(tmp) / "pipeline.sqlite")


def run(path: Path) -> None:
    global crash_during_validate
    store = Store(db=path)
    print(f"store: {path}")

    # Run 1: crashes during validate.
    try:
        build_plan(store)("today's batch")
    except KeyboardInterrupt:
        state = store.read("etl-2026-04-30")
        print(f"run 1 crashed: status={state['status']!r} next_step={state['next_step']!r}")
        print(f"  completed: {state['completed_steps']}  ran: {calls}")

    # Run 2: resumes at validate; extract and transform are not re-run.
    crash_during_validate = False
    calls.clear()
    result = build_plan(store)("today's batch")
    print(f"run 2 resumed: ran {calls} -> {result.payload!r}")

    # Run 3: the plan is done; short-circuits and returns the cached kv.
    calls.clear()
    result = build_plan(store)("today's batch")
    print(f"run 3 cached: ran {calls}, kv keys {sorted(result.payload)}")
    print(f"  verdict: {result.payload['verdict']}")
    store.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
