"""examples/custom_engine.py: an engine taking the run context, a keyword engine, and a
Plan recorded where the caller says."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_custom_engine_example(tmp_path: Path) -> None:
    # guarantee 300
    # guarantee 301
    # guarantee 304
    assert example_lines("custom_engine.py", tmp_path=tmp_path, timeout=120) == [
        "loud HELLO THERE",
        "counter 2",
        "counter has no tool 'shout' (tools: ['count'])",
        "echo (1 tools): hi",
        "run 1: RuntimeError",
        "recorded: failed",
        "run 2: stored BATCH",
        "run 3: cached True attempts 2",
    ]
