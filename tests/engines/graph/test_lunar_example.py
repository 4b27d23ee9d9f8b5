"""The lunar-mission walkthrough: examples/lunar_mission.py run as a user runs it, line by line.

Every claim docs/graph.md makes about the printed output is checked here, on the printed
output (guarantee 108-120), and the same story is replayed through the API in
test_walkthrough_through_the_api.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone.graph import CheckpointFilter, NodeException, SQLiteCheckpointer

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "lunar_mission.py"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def output() -> list[str]:
    env = {**os.environ, "STEPSTONE_BLOCK_MODEL_REQUESTS": "1"}
    env.pop("STEPSTONE_MODEL", None)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--offline"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout.splitlines()


def _value(lines: list[str], label: str, start: int = 0) -> tuple[int, str]:
    for i in range(start, len(lines)):
        if lines[i].strip().startswith(f"{label}: "):
            return i, lines[i].strip()[len(label) + 2 :]
    raise AssertionError(f"no {label!r} line after line {start}")


def test_phase_headers_and_setup(output: list[str]) -> None:
    assert output[0] == "=" * 72
    assert output[1] == "Phase 1 - invoke v1 graph; size_crew crashes; resume picks up"
    assert output[3] == "destination: Lunar South Pole"
    assert re.fullmatch(r"checkpoint db: .+/checkpoints\.sqlite", output[4])
    i = output.index("Phase 2 - invoke v2 graph with resume; v1->v2 migration runs")
    assert output[i - 1] == output[i + 1] == "=" * 72
    assert output[i + 2] == "v2 adds: risk_assessment field + assess_risks node"
    assert output[i + 3] == "migration: backfills risk_assessment='' for v1 records"
    assert output[i + 4] == "v2 result after resume:"


def test_first_attempt_surfaces_node_exception(output: list[str]) -> None:
    # guarantee 108: "NodeException at node 'size_crew': ..." at the invoke() boundary
    i = output.index("first attempt:")
    assert output[i + 1].strip() == (
        "NodeException at node 'size_crew': "
        "simulated transient mid-pipeline crash before size_crew completed"
    )


def test_completed_nodes_of_the_saved_record(output: list[str]) -> None:
    # guarantee 109, 114: the record on disk holds define_objective before size_crew started
    _, saved = _value(output, "saved invocation_id")
    assert re.fullmatch(UUID, saved)
    _, completed = _value(output, "completed nodes")
    assert completed == "['define_objective']"


def test_resume_finishes_with_each_node_once(output: list[str]) -> None:
    # guarantee 110, 111, 115: trace: ['define_objective', 'size_crew', 'draft_timeline']
    i = output.index("second attempt (resume from saved invocation):")
    _, objective = _value(output, "objective", i)
    _, crew = _value(output, "crew_size", i)
    _, timeline = _value(output, "timeline", i)
    _, trace = _value(output, "trace", i)
    assert objective.endswith(".") and len(objective) > 20
    assert crew == "4"
    assert timeline.endswith(".") and timeline != objective
    assert trace == "['define_objective', 'size_crew', 'draft_timeline']"


def test_resumed_invocation_id_differs(output: list[str]) -> None:
    # guarantee 112: saved invocation_id and resumed invocation_id are different uuids
    _, saved = _value(output, "saved invocation_id")
    _, resumed = _value(output, "resumed invocation_id")
    assert re.fullmatch(UUID, resumed)
    assert resumed != saved


def test_v2_result_after_migration(output: list[str]) -> None:
    # guarantee 117, 118, 120: v1 fields preserved, assess_risks the only new work
    i = output.index("second attempt (resume from saved invocation):")
    _, objective = _value(output, "objective", i)
    _, timeline = _value(output, "timeline", i)
    j = output.index("v2 result after resume:")
    assert _value(output, "objective", j)[1] == objective  # same objective sentence
    assert _value(output, "crew_size", j)[1] == "4"
    assert _value(output, "timeline", j)[1] == timeline
    risk = _value(output, "risk_assessment", j)[1]
    assert risk and risk not in (objective, timeline)
    assert _value(output, "trace", j)[1] == (
        "['define_objective', 'size_crew', 'draft_timeline', 'assess_risks']"
    )


def test_walkthrough_through_the_api(tmp_path: Path) -> None:
    # The same story without printing: which nodes ran, which records exist, what they hold.
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import lunar_mission as lm
    finally:
        sys.path.remove(str(ROOT / "examples"))
    nodes = lm.MissionNodes(offline=True)
    ran: list[str] = []
    for name in ("define_objective", "size_crew", "draft_timeline", "assess_risks"):
        fn = getattr(nodes, name)

        async def counted(state: object, fn: object = fn, name: str = name) -> object:
            ran.append(name)
            return await fn(state)  # type: ignore[operator]

        setattr(nodes, name, counted)
    cp = SQLiteCheckpointer(tmp_path / "checkpoints.sqlite")
    v1 = lm.build_v1(cp, nodes)
    with pytest.raises(NodeException) as info:
        v1.invoke(lm.MissionPlanState(destination=lm.DESTINATION), correlation_id=lm.RUN_ID)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.recoverable_state.trace == ["define_objective"]
    (saved,) = cp.list(CheckpointFilter(correlation_id=lm.RUN_ID))
    v1.invoke(resume_invocation=saved.invocation_id)
    resumed = cp.list(CheckpointFilter(correlation_id=lm.RUN_ID))[-1]
    # resuming the original (pre-crash) id would redo size_crew + draft_timeline: phase 2
    # must target the resumed attempt's id, found through the correlation_id
    assert resumed.invocation_id != saved.invocation_id
    assert resumed.status == "done"
    final = lm.build_v2(cp, nodes).invoke(resume_invocation=resumed.invocation_id)
    assert ran == [
        "define_objective",
        "size_crew",  # raised before returning an update
        "size_crew",
        "draft_timeline",
        "assess_risks",
    ]
    assert final.trace == ["define_objective", "size_crew", "draft_timeline", "assess_risks"]
    attempts = cp.list(CheckpointFilter(correlation_id=lm.RUN_ID))
    assert [a.schema_version for a in attempts] == ["v1", "v1", "v2"]
    assert [a.attempt_index for a in attempts] == [0, 1, 2]
    cp.close()
