"""Handling stepstone's errors by what they mean, whichever engine raised them.

Every error stepstone raises derives from ``StepstoneError``; below it, a few bases say what
to do about it (the whole tree is drawn in ``stepstone/exceptions.py``):

* ``UserError``: the call is wrong. Fix the code; retrying cannot help. A bad argument value
  is a ``ConfigurationError``, which is also a ``ValueError``.
* ``ConcurrentRunError``: another live run owns the record. Wait and retry, or use another
  key. A Plan raises it as ``ConcurrentPlanRunError``, a graph resume as
  ``ConcurrentGraphResumeError``; both are ``ConcurrentRunError`` (and ``RuntimeError``).
* ``CorruptRecordError``: a stored record cannot be read (each engine has its subclass).

    python examples/handle_errors.py [DB_PATH]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from stepstone import (
    Agent,
    ConcurrentPlanRunError,
    ConcurrentRunError,
    ConfigurationError,
    LLMEngine,
    Plan,
    Step,
    StepstoneError,
    Store,
    UserError,
)


def misuse() -> None:
    try:
        LLMEngine("claude-sonnet-4-6", max_turns=0)
    except UserError as exc:  # fix the call; never retry
        kind = "ConfigurationError" if isinstance(exc, ConfigurationError) else "UserError"
        print(f"misuse ({kind}, a ValueError: {isinstance(exc, ValueError)}): {exc}")


async def busy_key(db: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_load(rows: str) -> str:
        started.set()
        await release.wait()  # a long step: the run owns its key meanwhile
        return f"loaded {rows}"

    with Store(db=db) as store:
        plan = Plan(Step(slow_load), store=store, checkpoint_key="nightly-load")
        first = asyncio.create_task(Agent(engine=plan).run("rows"))
        await started.wait()
        second = Plan(Step(slow_load), store=store, checkpoint_key="nightly-load", resume=True)
        try:
            await Agent(engine=second).run("rows")
        except ConcurrentRunError as exc:  # whatever the engine: someone else is running it
            plan_facing = isinstance(exc, ConcurrentPlanRunError)
            print(f"busy (ConcurrentPlanRunError: {plan_facing}): {str(exc).split('.')[0]}")
        release.set()
        env = await first
        print(f"first run finished: {env.payload!r}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "errors.sqlite"
        try:
            misuse()
            asyncio.run(busy_key(db))
        except StepstoneError as exc:  # anything else stepstone raises
            print(f"unexpected stepstone error: {exc!r}")
            raise


if __name__ == "__main__":
    main()
