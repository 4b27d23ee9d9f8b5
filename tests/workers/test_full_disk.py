"""A queued run whose store fills up is handed back, not failed: once there is room again
it resumes after its last committed step (guarantee 156).

The worker is a real process with a real file size limit (``RLIMIT_FSIZE``): SQLite's
writes past it fail as a full disk would, and the test lifts the limit from outside
(``prlimit``) while the worker keeps running.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stepstone import Store, submit
from tests.workers.targets import STEPS, executions, task

pytestmark = pytest.mark.skipif(
    not hasattr(resource, "prlimit"), reason="needs prlimit (Linux) to lift the limit"
)

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
from stepstone import Store, Worker
store = Store(db=sys.argv[1], lease_seconds=3)
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
print("ready", flush=True)
Worker(store, concurrency=1, poll_interval=0.1).run()
"""


def test_a_run_stopped_by_a_full_file_is_handed_back_and_resumes(tmp_path: Path) -> None:
    db, log = tmp_path / "q.sqlite", tmp_path / "log"
    with Store(db=db) as store:
        handle = submit(store, "tests.workers.targets:big_plan", task(str(log), "big"))
    room = db.stat().st_size + 300_000  # room for about four of the ten 64 KB steps
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), str(room)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
    )
    lines: list[str] = []
    handed_back = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "handed back" in line:
                handed_back.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # the run stops part-way: the store fails under a step's commit and the worker
        # hands the run back (to be tried again later), it does not fail it
        assert handed_back.wait(60), "".join(lines)[-2000:]
        reached = len(executions(str(log)))  # the steps begun; the last one never committed
        assert 0 < reached < STEPS, f"expected the run to stop part-way, it reached {reached}"
        assert handle.status() != "failed", handle.status()
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        result = handle.result(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    err = "".join(lines)
    assert result.ok, result.error
    assert "handed back, to be resumed" in err, err[-2000:]
    runs = executions(str(log))
    counts = [len(runs[("big", i)]) for i in range(STEPS)]
    # the steps committed before the disk filled ran once, and so did the ones after it
    # had room again; only the step whose commit failed ran again, once per try
    failed = reached - 1
    assert counts[:failed] == [1] * failed and counts[failed + 1 :] == [1] * (STEPS - reached)
    assert counts[failed] >= 2, counts
    assert err.count("handed back") == counts[failed] - 1, err[-2000:]
