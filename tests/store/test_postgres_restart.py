"""The PostgreSQL server restarts under a running run: nothing is lost, nothing doubles.

These tests own their server (restarting the session's would disturb other modules).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.durable import claim_run
from tests.pgserver import PgServer

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_during_a_long_step_then_commit(
    own_pg_server: PgServer, own_pg_url: str, mode: str
) -> None:
    """guarantee 39/40: the server restarts (cleanly, or crashing: ``immediate``) while a step
    runs; the step's commit reconnects and lands, exactly once, with its writes."""
    with Store(url=own_pg_url) as store:
        claimed = claim_run(store, "long", kind="test", resume=False, first_step="a")
        run = claimed.run
        assert run is not None
        try:
            run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)])
            # the "long step": the server goes down and comes back while it runs
            own_pg_server.restart(down_for=1.0, mode=mode)
            run.commit_sync(
                status="running", next_step="c", rows=[("step", "b", 2)], writes=[("wb", "B")]
            )
            run.commit_sync(status="done", next_step=None, rows=[("step", "c", 3)])
        finally:
            run.release()
        head = store.backend.run_get("long")
        assert head is not None and head.status == "done" and head.version == 4
        assert [r.name for r in store.backend.run_journal("long")] == ["a", "b", "c"]
        assert store.read("wb") == "B"


def test_commits_keep_landing_while_the_server_is_down(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    """Steps commit back to back while the server stops for 1.5 s: the commits that hit
    the outage wait, reconnect and land. Journal seqs stay contiguous (no step lost or
    written twice) and each step's write is there."""
    with Store(url=own_pg_url) as store:
        claimed = claim_run(store, "busy", kind="test", resume=False, first_step="s0")
        run = claimed.run
        assert run is not None
        restarter = threading.Thread(target=own_pg_server.restart, kwargs={"down_for": 1.5})
        n = 0
        try:
            started = time.monotonic()
            restarter.start()
            while restarter.is_alive() or time.monotonic() - started < 0.5 or n < 20:
                run.commit_sync(
                    status="running",
                    next_step=f"s{n + 1}",
                    rows=[("step", f"s{n}", n)],
                    writes=[(f"w{n}", n)],
                )
                n += 1
                time.sleep(0.02)
        finally:
            restarter.join()
            run.release()
        rows = store.backend.run_journal("busy")
        assert [r.seq for r in rows] == list(range(n))
        assert [r.name for r in rows] == [f"s{i}" for i in range(n)]
        assert dict(store.items(prefix="w")) == {f"w{i}": i for i in range(n)}
        head = store.backend.run_get("busy")
        assert head is not None and head.version == n + 1


def test_plan_survives_a_server_restart_mid_run(own_pg_server: PgServer, own_pg_url: str) -> None:
    """A Plan on PostgreSQL: a step restarts the server under it; the Plan commits that
    step after the restart and finishes, every step run exactly once."""
    calls: dict[str, int] = {}

    def step(name: str, restart: bool = False) -> Any:
        def fn(payload: Any) -> str:
            calls[name] = calls.get(name, 0) + 1
            if restart:
                own_pg_server.restart(down_for=1.0)
            return f"{name}({payload})"

        fn.__name__ = name
        return fn

    with Store(url=own_pg_url) as store:
        plan = Plan(
            Step(step("extract"), writes="raw"),
            Step(step("transform", restart=True), writes="clean"),
            Step(step("load"), writes="loaded"),
            store=store,
            checkpoint_key="etl",
        )
        env = Agent(engine=plan)("batch")
        assert env.ok, env.error
        assert calls == {"extract": 1, "transform": 1, "load": 1}
        state = store.read("etl")
        assert state["status"] == "done"
        assert state["completed_steps"] == ["extract", "transform", "load"]
        assert store.read("clean") == "transform(extract(batch))"
        assert store.read("loaded") == "load(transform(extract(batch)))"


def test_a_call_made_during_an_outage_answers_once_the_server_is_back(
    own_pg_server: PgServer, own_pg_url: str
) -> None:
    """guarantee 159: the server is down longer than the pool's one reconnect attempt
    (2 s); a read made during the outage waits and answers once the server is back.
    Before, the pool never tried again for a caller already waiting: the read waited out
    the whole reconnect_timeout and then failed, though the server was back."""
    from stepstone.store._postgres import PostgresBackend

    with Store(backend=PostgresBackend(own_pg_url, reconnect_timeout=30.0)) as store:
        store.write("k", "before")
        own_pg_server.stop()
        back = threading.Timer(4.0, own_pg_server.start)
        back.start()
        try:
            assert store.read("k") == "before"  # asked while the server is down
        finally:
            back.join()
