"""A workflow run for the crash tests: started as a subprocess and killed with SIGKILL.

Usage: python crash_worker.py DB LOG N [KILL_AT]. Prints ``ready`` once the store is open,
then runs (or resumes) the workflow ``order`` under the key ``crash-run`` and prints its
result as JSON. Every step appends its label and the pid to LOG (fsynced) before it
returns. ``KILL_AT`` (``inside:LABEL``, ``between:LABEL``) makes the process SIGKILL itself
at that point: inside the step, once it logged; or in the body right after the step
returned, before the next one.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time

from stepstone import Store, step, workflow

LOG = sys.argv[2] if len(sys.argv) > 2 else ""
KILL_AT = sys.argv[4] if len(sys.argv) > 4 else ""


def _die_at(where: str, label: str) -> None:
    if f"{where}:{label}" == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


@step
def work(label: str) -> dict[str, str]:
    time.sleep(random.uniform(0.002, 0.02))
    with open(LOG, "a", encoding="ascii") as fh:
        fh.write(f"{label} {os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())
    _die_at("inside", label)
    return {"label": label}


async def _step(label: str) -> str:
    out = await work(label)
    _die_at("between", label)
    return out["label"]


@workflow
async def part(i: int) -> list[str]:
    return [await _step(f"c{i}.{j}") for j in range(3)]


@workflow
async def order(n: int) -> list[str]:
    out: list[str] = []
    for i in range(n):
        out.append(await _step(f"s{i}"))
        if i % 4 == 1:
            out.extend(await asyncio.gather(_step(f"g{i}a"), _step(f"g{i}b")))
        if i % 5 == 3:
            out.extend(await part(i))
    return out


def expected(n: int) -> list[str]:
    out: list[str] = []
    for i in range(n):
        out.append(f"s{i}")
        if i % 4 == 1:
            out.extend([f"g{i}a", f"g{i}b"])
        if i % 5 == 3:
            out.extend(f"c{i}.{j}" for j in range(3))
    return out


def main() -> None:
    db, n = sys.argv[1], int(sys.argv[3])
    store = Store(db=db)
    print("ready", flush=True)
    result = order.using(store=store, key="crash-run").run_sync(n)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
