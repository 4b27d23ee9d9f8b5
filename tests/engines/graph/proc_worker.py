"""Subprocess worker for test_processes.py: runs or resumes the loop graph on a SQLite file.

Usage:
    proc_worker.py crash <db> <log> <limit>       resume the latest unfinished attempt of
                                                  correlation "crash", or start it (prints
                                                  READY first, DONE when finished)
    proc_worker.py resume <db> <log> <id> <sleep> resume invocation <id>; exit 3 when refused
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from stepstone.graph import (
    CheckpointFilter,
    ConcurrentGraphResumeError,
    SQLiteCheckpointer,
)
from tests.engines.graph._graphs import Counter, loop_graph


def main() -> int:
    mode, db, log = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cp = SQLiteCheckpointer(db)
    if mode == "crash":
        graph = loop_graph(cp, log=log, sleep=0.04)
        print("READY", flush=True)  # imported: the test's kill timer starts now
        attempts = cp.list(CheckpointFilter(correlation_id="crash"))
        if not attempts:
            graph.invoke(Counter(limit=int(sys.argv[4])), correlation_id="crash")
        elif attempts[-1].status != "done":
            graph.invoke(resume_invocation=attempts[-1].invocation_id)
        print("DONE", flush=True)
        return 0
    graph = loop_graph(cp, log=log, sleep=float(sys.argv[5]))
    try:
        final = graph.invoke(resume_invocation=sys.argv[4])
    except ConcurrentGraphResumeError as exc:
        print(f"REFUSED {exc}", flush=True)
        return 3
    print(f"DONE {final.n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
