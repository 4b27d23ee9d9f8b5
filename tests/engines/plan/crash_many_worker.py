"""Eight durable Plan runs sharing one event loop, for the crash tests: started as a
subprocess and killed with SIGKILL.

Usage: python crash_many_worker.py DB LOG N_RUNS N_STEPS. Prints ``ready`` once the store is
open. The runs share the loop, so on SQLite their commits go through the group commit; most
steps are one quick function (it runs on the loop's thread once proven quick), every tenth a
slow one (40 ms, in a worker thread), so a kill lands anywhere. Each step appends
"<run> <index>" to LOG with one ``write`` (the page cache outlives a SIGKILL) before it
returns. Exit 0 when every run is done.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from stepstone import Agent, Envelope, Plan, Step, Store

LOG_FD = -1


def quick(payload: dict[str, Any]) -> dict[str, Any]:
    os.write(LOG_FD, f"{payload['run']} {payload['i']}\n".encode())
    return {"run": payload["run"], "i": payload["i"] + 1}


def slow(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.04)
    return quick(payload)


async def main() -> None:
    global LOG_FD
    db, log_path, runs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    LOG_FD = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
    envs = await asyncio.gather(
        *(a.run(Envelope(task="go", payload={"run": r, "i": 0})) for r, a in enumerate(agents))
    )
    failed = [env.error for env in envs if not env.ok]
    if failed:
        print(f"runs failed: {failed}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    asyncio.run(main())
