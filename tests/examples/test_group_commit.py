"""examples/group_commit.py: 100 runs one by one and 8 at a time on one SQLite file."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_group_commit_example(tmp_path: Path) -> None:
    # guarantee 255, 257
    db = str(tmp_path / "group.sqlite")
    for _ in range(2):  # the same file twice: the forks of the first run are pruned
        lines = example_lines("group_commit.py", db, tmp_path=tmp_path)
        assert lines[0] == "WAL preallocated: 0.5 MB"
        assert lines[1] == "100 concurrent runs, all done: True"
        assert lines[2].startswith("one after another: ") and " 8 at a time: " in lines[2]
