"""examples/queue_kinds.py: a graph and a replanning agent through the queue."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_the_graph_and_the_agent_come_back_through_their_handles(tmp_path: Path) -> None:
    assert example_lines("queue_kinds.py", tmp_path=tmp_path) == [
        "graph: {'claim_id': 'c-1', 'amount': 750, 'decision': 'approve'}",
        "agent: claim c-7: 420 EUR",
        "pruned: 2",
    ]
