"""examples/kept_connections.py: a thread's sync calls share one connection to the model."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_kept_connections_example(tmp_path: Path) -> None:
    # guarantee 334, guarantee 337, guarantee 338
    assert example_lines("kept_connections.py", tmp_path=tmp_path) == [
        "main thread: 50 calls over 1 connection",
        "4 threads x 25 calls: 4 more connections",
        "after the server dropped the idle connection: connection #6",
        "after provider.close(): connection #7",
    ]
