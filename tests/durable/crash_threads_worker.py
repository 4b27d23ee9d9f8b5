"""Durable Plan runs called from a ThreadPoolExecutor, for the crash tests of commits
shared across threads: started as a subprocess and killed with SIGKILL.

Usage: python crash_threads_worker.py DB LOG N_RUNS N_STEPS [KILL_AT WHEN]. Prints
``ready`` once the store is open. Each run is one sync ``agent(...)`` call on a thread of
its own (its own private loop), so on SQLite the commits that the threads make at the same
moment share one transaction. Most steps are one quick function, every tenth a slow one
(40 ms), so a kill lands anywhere. Each step appends "<run> <index>" to LOG with one
``write`` (the page cache outlives a SIGKILL) before it returns.

With KILL_AT (a number >= 1) the process SIGKILLs itself in the KILL_AT-th shared
transaction (one that writes the items of more than one run), ``before`` its COMMIT or
``after`` it (the fsync done, no thread told). Exit 0 when every run is done.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from stepstone import Agent, Envelope, Plan, Step, Store
from stepstone.store._sqlite import SQLiteBackend

LOG_FD = -1


def quick(payload: dict[str, Any]) -> dict[str, Any]:
    os.write(LOG_FD, f"{payload['run']} {payload['i']}\n".encode())
    return {"run": payload["run"], "i": payload["i"] + 1}


def slow(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.04)
    return quick(payload)


class KillInSharedCommit(SQLiteBackend):
    """The real SQLite backend, SIGKILLing this process in its ``kill_at``-th transaction
    that changes at least four rows (a step commit changes two: its head and its journal
    row; a claim one), before or after the COMMIT."""

    def __init__(self, path: str, kill_at: int, when: str) -> None:
        self.kill_at, self.when = kill_at, when
        super().__init__(path)

    @contextmanager
    def _tx(self, *, flush: bool = True) -> Iterator[Any]:
        shared = False
        with super()._tx(flush=flush) as conn:
            before = conn.total_changes
            yield conn
            if conn.total_changes - before >= 4:
                shared = True
                self.kill_at -= 1
                if self.kill_at == 0 and self.when == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
        if shared and self.kill_at == 0 and self.when == "after":
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    global LOG_FD
    db, log_path, runs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    LOG_FD = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if len(sys.argv) > 5:
        store = Store(backend=KillInSharedCommit(db, int(sys.argv[5]), sys.argv[6]))
    else:
        store = Store(db=db)
    print("ready", flush=True)
    steps = [Step(slow if i % 10 == 9 else quick, name=f"s{i:03d}") for i in range(n)]
    agents = [
        Agent(
            engine=Plan(
                *steps, store=store, checkpoint_key=f"run-{r}", resume=True, max_iterations=n + 1
            )
        )
        for r in range(runs)
    ]

    def one(r: int) -> Any:
        return agents[r](Envelope(task="go", payload={"run": r, "i": 0}))

    with ThreadPoolExecutor(runs) as pool:
        envs = list(pool.map(one, range(runs)))
    failed = [env.error for env in envs if not env.ok]
    if failed:
        print(f"runs failed: {failed}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
