"""examples/workers_fanout.py: two worker processes take submitted runs from one queue."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_two_workers_run_the_submitted_runs(tmp_path: Path) -> None:
    # without --db: a store in a temp dir, removed afterwards (run_example checks it)
    lines = example_lines("workers_fanout.py", "--runs", "12", tmp_path=tmp_path)
    assert lines[0].startswith("12 runs done in ")
    counts = [int(line.split(": ")[1].split()[0]) for line in lines if line.startswith("worker ")]
    assert sum(counts) == 12 and 1 <= len(counts) <= 2
    assert lines[-1] == "workers exited: [0, 0]"  # SIGTERM: a graceful exit
