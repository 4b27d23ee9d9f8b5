"""A Plan run that advances one step each time the test says so (a real live run)."""

from __future__ import annotations

import threading
from typing import Any

from stepstone import Agent, Plan, Step, Store


class SteppedRun:
    """Runs ``steps`` steps under ``key`` in a thread; step i waits for :meth:`advance`."""

    def __init__(self, store: Store, key: str, steps: int = 4) -> None:
        self.gates = [threading.Event() for _ in range(steps)]
        self.started = [threading.Event() for _ in range(steps)]
        self.error: BaseException | None = None

        def make(i: int) -> Any:
            def step(payload: Any) -> str:
                self.started[i].set()
                if not self.gates[i].wait(120):
                    raise TimeoutError(f"step {i} was never released")
                return f"{payload}+{i}"

            step.__name__ = f"step_{i}"
            return step

        plan = Plan(
            *(Step(make(i), name=f"step_{i}") for i in range(steps)),
            store=store,
            checkpoint_key=key,
        )
        self.thread = threading.Thread(target=self._run, args=(plan,), daemon=True)

    def _run(self, plan: Plan) -> None:
        try:
            Agent(engine=plan)("go")
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def start(self) -> SteppedRun:
        self.thread.start()
        return self

    def advance(self, i: int) -> None:
        """Let step ``i`` finish, and wait until step ``i + 1`` started (or the run ended)."""
        self.gates[i].set()
        if i + 1 < len(self.gates):
            assert self.started[i + 1].wait(60)

    def finish(self) -> None:
        for gate in self.gates:
            gate.set()
        self.thread.join(60)
