"""examples/handle_errors.py run as a user runs it: errors handled by their meaning."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_handle_errors_example(tmp_path: Path) -> None:
    out = example_lines("handle_errors.py", tmp_path=tmp_path, timeout=120)
    assert (
        out[0] == "misuse (ConfigurationError, a ValueError: True): max_turns must be >= 1, got 0"
    )
    assert out[1].startswith(
        "busy (ConcurrentPlanRunError: True): checkpoint_key 'nightly-load' is owned by live run "
    )
    assert out[2] == "first run finished: 'loaded rows'"
    assert len(out) == 3
