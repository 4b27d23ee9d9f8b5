"""Holds many Plan runs mid-step, to be SIGKILLed by the ownership tests.

Usage: python ownership_worker.py STORE_URL PREFIX N. Starts N threads, each running
:func:`build_plan` on key ``f"{PREFIX}{i}"``; their first step blocks forever, so every run
stays claimed by this process. Prints ``READY`` once all N runs are claimed, then waits to
be killed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stepstone import Agent, Plan, Step, Store


def build_plan(store: Store, key: str, first: Callable[[Any], Any], *, resume: bool = True) -> Plan:
    """The plan both the worker and the racing threads run (same steps, same shape)."""

    def first_step(payload: Any) -> Any:
        return first(payload)

    def second_step(payload: Any) -> Any:
        return {"done": payload}

    return Plan(
        Step(first_step, writes="first"),
        Step(second_step),
        store=store,
        checkpoint_key=key,
        resume=resume,
    )


def _block(payload: Any) -> Any:
    threading.Event().wait()  # until SIGKILL
    return payload


def main() -> None:
    url, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store(url=url)
    keys = [f"{prefix}{i}" for i in range(n)]
    for key in keys:
        plan = build_plan(store, key, _block, resume=False)
        threading.Thread(target=Agent(engine=plan), args=("go",), daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        heads = [store.backend.run_get(k) for k in keys]
        if all(h is not None and h.status == "claimed" for h in heads):
            print("READY", flush=True)
            threading.Event().wait()
        time.sleep(0.05)
    print("TIMEOUT", flush=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
