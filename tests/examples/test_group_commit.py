"""examples/group_commit.py: 100 runs one by one and 8 at a time on one SQLite file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "group_commit.py"


def test_group_commit_example(tmp_path: Path) -> None:
    # guarantee 255, 257
    db = tmp_path / "group.sqlite"
    for _ in range(2):  # the same file twice: the forks of the first run are pruned
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), str(db)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == "WAL preallocated: 0.5 MB"
        assert lines[1] == "100 concurrent runs, all done: True"
        assert lines[2].startswith("one after another: ") and " 8 at a time: " in lines[2]
