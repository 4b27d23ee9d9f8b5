"""examples/sync_calls.py: an asyncio limiter reused by the sync calls of each thread."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_sync_calls_example(tmp_path: Path) -> None:
    # guarantee 327
    assert example_lines("sync_calls.py", tmp_path=tmp_path) == [
        "main thread: 9 quotes in 3 sync calls, e.g. M0A: quoted",
        "4 threads: 36 quotes, all quoted: True",
        "at most 2 requests at once per thread",
        "durable runs recorded: 45, all done: True",
    ]
