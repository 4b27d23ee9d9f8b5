"""examples/replan_research.py runs offline: a planner agent, crashed mid-round, resumed."""

from __future__ import annotations

from pathlib import Path

from stepstone import Store
from tests.examples._run import run_example


def test_runs_offline_crashes_in_round_2_and_resumes(tmp_path: Path) -> None:
    # guarantee 190, 191
    db = tmp_path / "replan.sqlite"
    proc = run_example("replan_research.py", str(db), tmp_path=tmp_path)
    out = proc.stdout.splitlines()
    assert out[0].startswith("run 1 (pid ") and out[0].endswith("killed with SIGKILL in round 2")
    assert out[1] == "  record: status running, round 2 tasks ['done', 'pending']"
    assert out[2] == "run 2 (resume=True): status done after 3 rounds"
    assert out[4].startswith("  round 2: ") and out[4].endswith("[researcher, coder]")
    assert out[6].startswith("final answer: Yes: retry with backoff")
    # Only the coder (in flight at the kill) ran again; round 2 was not re-planned.
    assert out[7] == "model calls in run 2: coder, planner"
    assert out[8] == "model calls in total: planner 3, researcher 3"
    with Store(db=db) as store:
        record = store.read("replan-research")
    assert record["status"] == "done"
    assert record["rounds"][1]["tasks"][1]["result"].startswith("for attempt in range(5)")
