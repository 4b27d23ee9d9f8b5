"""examples/custom_engine.py: an engine taking the run context, a keyword engine, and a
Plan recorded where the caller says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_engine.py"


def test_custom_engine_example() -> None:
    # guarantee 300
    # guarantee 301
    # guarantee 304
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "loud HELLO THERE",
        "counter 2",
        "counter has no tool 'shout' (tools: ['count'])",
        "echo (1 tools): hi",
        "run 1: RuntimeError",
        "recorded: failed",
        "run 2: stored BATCH",
        "run 3: cached True attempts 2",
    ]
