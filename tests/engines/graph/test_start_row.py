"""A graph invocation's record is claimed together with its start row: a process killed
right after the claim leaves a record `stepstone check` passes and a resume continues."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.graph import CheckpointFilter, StoreCheckpointer
from stepstone.store import check_store

ROOT = Path(__file__).resolve().parents[3]

# Invokes a two-node graph; with "die" the process SIGKILLs itself the moment the
# invocation's record is claimed, before any node runs.
_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from stepstone import Store
from stepstone.engines.graph import _sink
from stepstone.graph import CheckpointFilter, StoreCheckpointer
from tests.engines.graph._graphs import Counter, loop_graph

claim_run = _sink.claim_run

def claim_then_die(*args, **kwargs):
    claimed = claim_run(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return claimed

if sys.argv[2] == "die":
    _sink.claim_run = claim_then_die
with Store(db=sys.argv[1]) as store:
    cp = StoreCheckpointer(store)
    graph = loop_graph(cp)
    attempts = cp.list(CheckpointFilter(correlation_id="c"))
    if attempts:
        final = graph.invoke(resume_invocation=attempts[-1].invocation_id)
    else:
        final = graph.invoke(Counter(limit=2), correlation_id="c")
    print("DONE", final.n, ",".join(final.trace))
"""


def _child(db: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(db), mode, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.crash
def test_a_process_killed_right_after_claiming_an_invocation_leaves_a_sound_record(
    tmp_path: Path,
) -> None:
    db = tmp_path / "g.sqlite"
    died = _child(db, "die")
    assert died.returncode == -signal.SIGKILL, died.stderr
    with Store(db=db, read_only=True) as store:
        report = check_store(store)
        assert report.ok, report.problems  # guarantee 157: a crash is not damage
        attempts = StoreCheckpointer(store).list(CheckpointFilter(correlation_id="c"))
        assert [a.status for a in attempts] == ["running"]  # its owner is dead
        assert attempts[0].completed_positions == ()  # guarantee 109: nothing ran
    done = _child(db, "resume")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["DONE", "2", "start,tick1,tick2,finish"]  # guarantee 110
    with Store(db=db, read_only=True) as store:
        assert check_store(store).ok
