"""An engine of your own on the durable kernel, with its own view in ``store.read``.

A countdown: each tick is one committed step (``claim_run`` + ``OwnedRun.commit_sync``), so
a countdown that crashes resumes at the next tick instead of starting over. The engine
registers how its runs read (``register_run_view``) once, where it is defined; a run of a
kind nobody registered would read as the generic record (head fields and raw journal).
The lease (``Store(lease_seconds=...)``) is the kernel's ``LeasePolicy``.

Usage: python examples/custom_run_view.py [DB]   (default: a temporary directory)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepstone import Store
from stepstone.durable import LeasePolicy, claim_run
from stepstone.store import JournalRow, RunHead, register_run_view

KIND = "countdown"


def countdown_view(head: RunHead, journal: list[JournalRow]) -> dict[str, Any]:
    """How ``store.read`` shows a countdown run."""
    ticks = [json.loads(row.data)["left"] for row in journal if row.kind == "tick"]
    return {"status": head.status, "ticks": ticks, "left": ticks[-1] if ticks else None}


register_run_view(KIND, countdown_view)


def countdown(store: Store, key: str, start: int, *, crash_at: int | None = None) -> str:
    """Count down from ``start`` under ``key``, one committed step per tick; resumes a
    countdown that stopped. ``crash_at`` simulates a crash before that tick is committed."""
    claim = claim_run(store, key, kind=KIND, resume=True, first_step=str(start))
    if claim.run is None:
        return "already done"
    run = claim.run
    try:
        left = int(run.head.next_step or start)
        while left > 0:
            left -= 1
            if left == crash_at:
                raise RuntimeError(f"crashed before tick {left}")
            status = "done" if left == 0 else "running"
            next_step = None if left == 0 else str(left)
            run.commit_sync(
                status=status, next_step=next_step, rows=[("tick", None, {"left": left})]
            )
        return f"{claim.outcome}: done"
    finally:
        run.release()  # a run released before it is done can be resumed at once


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        demo(Path(db))
        return
    with tempfile.TemporaryDirectory() as tmp:
        demo(Path(tmp) / "countdown.sqlite")


def demo(path: Path) -> None:
    with Store(db=path, lease_seconds=6) as store:
        lease = LeasePolicy.of(store)
        print(f"lease: {lease.seconds:g} s, renewed every {lease.renew_every:g} s")
        try:
            countdown(store, "launch", 3, crash_at=1)
        except RuntimeError as exc:
            print(f"first try: {exc}")
        print("after the crash:", store.read("launch"))
        print("second try:", countdown(store, "launch", 3))
        print("after the resume:", store.read("launch"))
        print("third try:", countdown(store, "launch", 3))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
