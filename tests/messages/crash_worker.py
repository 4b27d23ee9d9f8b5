"""Workflows that wait, receive and write, run as subprocesses the crash tests SIGKILL.

Usage: python crash_worker.py MODE STORE MARKER [ARG]. STORE is a SQLite file or a
PostgreSQL URL; MARKER a path prefix for the files that say a SIGKILL already happened.
Prints ``ready`` once the store is open, then runs (or resumes) the mode's workflow and
prints its result as JSON:

* ``sleep STORE MARKER SECONDS``: ``dozer`` under key ``dozer``: a step notes the start,
  the body sleeps SECONDS, a step SIGKILLs the process the first time it runs (once the
  sleep is over: a resume must not sleep again), and the result is the start and the end
  time;
* ``recv STORE MARKER``: ``receiver`` under key ``receiver``: receives on ``in``, SIGKILLs
  itself the first time right after the receive returned (its outcome committed, the next
  step not started), then returns the message with a second one;
* ``stream STORE MARKER N``: ``streamer`` under key ``streamer``: writes 0..N-1 to the
  stream ``numbers`` from its body, a few milliseconds apart;
* ``patient STORE MARKER KEY TIMEOUT``: ``patient`` under KEY: receives on ``in`` with a
  TIMEOUT (the test kills it while it waits) and returns what came (None on timeout) and
  when the receive returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import stepstone
from stepstone import Store, step, workflow

MODE = sys.argv[1] if len(sys.argv) > 1 else ""
STORE = sys.argv[2] if len(sys.argv) > 2 else ""
MARKER = sys.argv[3] if len(sys.argv) > 3 else ""


def _once(what: str) -> None:
    """SIGKILL this process the first time ``what`` happens (a marker file)."""
    marker = f"{MARKER}.{what}"
    if not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.flush()
            os.fsync(fh.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


@step(name="now")
def now() -> float:
    return time.time()


@step(name="die_after_sleep")
def die_after_sleep() -> str:
    _once("slept")
    return "ok"


@workflow
async def dozer(seconds: float) -> dict[str, float]:
    start = await now()
    await stepstone.sleep(seconds)
    await die_after_sleep()
    return {"start": start, "end": time.time()}


@workflow
async def receiver() -> list[object]:
    first = await stepstone.recv("in")
    _once("received")
    second = await stepstone.recv("in")
    return [first, second]


@workflow
async def streamer(n: int) -> int:
    for i in range(n):
        await stepstone.write_stream("numbers", i)
        await asyncio.sleep(0.002)
    return n


@workflow
async def patient(timeout: float) -> dict[str, Any]:
    got = await stepstone.recv("in", timeout=timeout)
    return {"got": got, "returned": time.time()}


def main() -> None:
    store = Store(url=STORE) if "://" in STORE else Store(db=STORE)
    print("ready", flush=True)
    if MODE == "sleep":
        result: object = dozer.using(store=store, key="dozer").run_sync(float(sys.argv[4]))
    elif MODE == "recv":
        result = receiver.using(store=store, key="receiver").run_sync()
    elif MODE == "patient":
        result = patient.using(store=store, key=sys.argv[4]).run_sync(float(sys.argv[5]))
    else:
        result = streamer.using(store=store, key="streamer").run_sync(int(sys.argv[4]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
