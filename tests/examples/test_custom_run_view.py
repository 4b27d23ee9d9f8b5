"""examples/custom_run_view.py: an engine of one's own on the kernel, with its own view."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_custom_run_view_example(tmp_path: Path) -> None:
    # guarantee 313: store.read shows the countdown through the view its engine registered
    assert example_lines("custom_run_view.py", tmp_path=tmp_path, timeout=120) == [
        "lease: 6 s, renewed every 2 s",
        "first try: crashed before tick 1",
        "after the crash: {'status': 'running', 'ticks': [2], 'left': 2}",
        "second try: resumed: done",  # guarantee 122: released, so taken over at once
        "after the resume: {'status': 'done', 'ticks': [2, 1, 0], 'left': 0}",
        "third try: already done",
    ]
