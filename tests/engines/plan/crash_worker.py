"""A Plan run for the crash tests: started as a subprocess and killed with SIGKILL.

Usage: python crash_worker.py DB LOG N_STEPS. Prints ``ready`` once imported and the store
is open. Each step appends "<index> <pid>" to LOG
(fsynced) before returning, then the Plan commits it. Exit 0 when the run is done.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

from stepstone import Agent, Plan, Step, Store


def make_step(i: int, log_path: str) -> Any:
    def step(payload: Any) -> dict[str, Any]:
        time.sleep(random.uniform(0.01, 0.06))
        with open(log_path, "a", encoding="ascii") as fh:
            fh.write(f"{i} {os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        time.sleep(random.uniform(0.0, 0.01))
        return {"step": i, "blob": "x" * 200}

    step.__name__ = f"s{i:02d}"
    return step


def main() -> None:
    db, log_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store(db=db)
    print("ready", flush=True)
    plan = Plan(
        *[Step(make_step(i, log_path), writes=f"w{i:02d}") for i in range(n)],
        store=store,
        checkpoint_key="crash-run",
        resume=True,
    )
    env = Agent(engine=plan)("go")
    if not env.ok:
        print(f"run failed: {env.error}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
