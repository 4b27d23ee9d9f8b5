"""examples/sync_calls.py: an asyncio limiter reused by the sync calls of each thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sync_calls.py"


def test_sync_calls_example(tmp_path: Path) -> None:
    # guarantee 327
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "main thread: 9 quotes in 3 sync calls, e.g. M0A: quoted",
        "4 threads: 36 quotes, all quoted: True",
        "at most 2 requests at once per thread",
        "durable runs recorded: 45, all done: True",
    ]
