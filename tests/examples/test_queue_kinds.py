"""examples/queue_kinds.py: a graph and a replanning agent through the queue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "queue_kinds.py"


def test_the_graph_and_the_agent_come_back_through_their_handles() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "graph: {'claim_id': 'c-1', 'amount': 750, 'decision': 'approve'}",
        "agent: claim c-7: 420 EUR",
        "pruned: 2",
    ]
