"""Inspecting partial state after a failure.

A failed run leaves its state in the store: read it to see what the pipeline saw at the
failure point, before deciding to resume. (`stepstone inspect --db FILE KEY` prints the
same thing from the shell.)

    python examples/inspect_failure.py [path/to/pipeline.sqlite]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from stepstone import Agent, Plan, Step, Store


def extract(task: str) -> str:
    return "id,amount\n1,10\n2,oops"


def transform(raw: str) -> list[dict[str, str]]:
    header, *rows = raw.splitlines()
    keys = header.split(",")
    return [dict(zip(keys, row.split(","), strict=True)) for row in rows]


def validate(clean: list[dict[str, str]]) -> int:
    return sum(int(row["amount"]) for row in clean)  # "oops" is not a number


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        run(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        run(Path(tmp) / "pipeline.sqlite")


def run(path: Path) -> None:
    store = Store(db=path)
    plan = Plan(
        Step(extract, writes="raw"),
        Step(transform, writes="clean"),
        Step(validate, writes="verdict"),
        store=store,
        checkpoint_key="etl-2026-04-30",
    )
    result = Agent(engine=plan)("today's batch")
    assert result.error is not None
    print(f"run failed: {result.error.type}: {result.error.message}")

    state = store.read("etl-2026-04-30")
    print(state["status"])  # "failed"
    print(state["next_step"])  # "validate"
    print(state["completed_steps"])  # ["extract", "transform"]
    print(state["kv"]["clean"])  # the partial result
    print(state["error"])
    store.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
