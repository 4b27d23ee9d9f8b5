"""The lunar story of `stepstone demo` (src/stepstone/demos/_lunar.py), offline."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from stepstone.demos._lunar import RUN_ID, run_lunar_demo
from stepstone.graph import CheckpointFilter, SQLiteCheckpointer
from stepstone.testing import block_model_requests


def test_run_lunar_demo_narrates_both_phases(tmp_path: Path) -> None:
    # guarantee 108, 110, 112, 117, 120 as the demo tells them
    out = io.StringIO()
    with block_model_requests():
        run_lunar_demo(Console(file=out, width=400, color_system=None), tmp_path)
    text = out.getvalue()
    assert "NodeException at node 'size_crew': simulated transient" in text
    assert "completed ['define_objective']" in text
    assert "trace=['define_objective', 'size_crew', 'draft_timeline']" in text
    assert "trace=['define_objective', 'size_crew', 'draft_timeline', 'assess_risks']" in text
    assert text.count("▶ define_objective") == 1  # never re-run
    assert text.count("▶ assess_risks") == 1
    cp = SQLiteCheckpointer(tmp_path / "lunar-checkpoints.sqlite")
    attempts = cp.list(CheckpointFilter(correlation_id=RUN_ID))
    assert [(a.schema_version, a.status) for a in attempts] == [
        ("v1", "failed"),
        ("v1", "done"),
        ("v2", "done"),
    ]
    cp.close()
