"""examples/durable_checkout.py: a workflow killed mid-run resumes; nothing committed reruns."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_durable_checkout_example(tmp_path: Path) -> None:
    # guarantee 471, 477, 478
    lines = example_lines("durable_checkout.py", tmp_path=tmp_path)
    assert lines[0] == "first process: killed by signal 9 while shipping"
    assert lines[1].startswith("result: {'receipt': 'receipt-o-42-1299', 'stock': 3")
    assert lines[2:7] == [
        "charge: ran 1 time(s)",
        "reserve: ran 1 time(s)",
        "score: ran 1 time(s)",
        "credit: ran 1 time(s)",
        "ship: ran 2 time(s)",  # cut short by the kill: in doubt, run again
    ]
    assert lines[7] == "run done: 5 steps, child run order-o-42/1 done"
