"""examples/workers_fanout.py: two worker processes take submitted runs from one queue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workers_fanout.py"


def test_two_workers_run_the_submitted_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--runs", "12", "--db", str(tmp_path / "q.sqlite")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("12 runs done in ")
    counts = [int(line.split(": ")[1].split()[0]) for line in lines if line.startswith("worker ")]
    assert sum(counts) == 12 and 1 <= len(counts) <= 2
    assert lines[-1] == "workers exited: [0, 0]"  # SIGTERM: a graceful exit
