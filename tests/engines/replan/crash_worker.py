"""A ReplanEngine run for the crash tests: started as a subprocess, killed with SIGKILL.

Usage: python crash_worker.py STORE LOG ATTEMPT. STORE is a SQLite path or a
postgresql:// URL. The planner logs ``plan <round> <attempt>`` and every task logs
``start <id> <attempt>`` / ``end <id> <attempt>`` (each line fsynced), so the parent can
tell which side effects ran in which process. Exit 0 when the run is done.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

from stepstone import Agent, PlanRound, ReplanEngine, Store, Task

ROUNDS = 3  # working rounds; round ROUNDS + 1 answers done
PARALLEL = 4


def log(path: str, line: str) -> None:
    with open(path, "a", encoding="ascii") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def main() -> None:
    where, log_path, attempt = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(f"{attempt}-{os.getpid()}")

    def planner(round: int, history: list[dict[str, Any]]) -> PlanRound:
        log(log_path, f"plan {round} {attempt}")
        if round > ROUNDS:
            results = [t["result"] for r in history for t in r["tasks"]]
            return PlanRound(reasoning="all done", done=True, final_answer=",".join(results))
        tasks = [Task(tool="work", kwargs={"item": f"{round}.{i}"}) for i in range(PARALLEL)]
        tasks.append(Task(tool="work", kwargs={"item": f"{round}.s"}, parallel=False))
        return PlanRound(reasoning=f"round {round}", tasks=tasks)

    def work(item: str) -> str:
        """One unit of work with a side effect."""
        log(log_path, f"start {item} {attempt}")
        time.sleep(rng.uniform(0.02, 0.3))
        log(log_path, f"end {item} {attempt}")
        return f"R{item}"

    store = Store(url=where) if "://" in where else Store(db=where)
    engine = ReplanEngine(store=store, checkpoint_key="crash-replan", resume=True)
    env = Agent(engine=engine, tools=[planner, work])("process every item")
    if not env.ok:
        print(f"run failed: {env.error}", file=sys.stderr)
        sys.exit(3)
    print(env.payload)


if __name__ == "__main__":
    main()
