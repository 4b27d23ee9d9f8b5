"""Step commits on PostgreSQL from async code: sent on async connections awaited on the
event loop, and exactly once whatever happens to the connection or the awaiting task."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from stepstone import Agent, Plan, Step
from stepstone.durable._kernel import aclaim_run, claim_run
from stepstone.exceptions import ConcurrentRunError, StoreKeyConflictError
from stepstone.store import Store
from stepstone.store._postgres import PostgresBackend
from stepstone.store._postgres_schema import KEY_LOCK_CLASS, lock_id
from tests.pgserver import CutProxy
from tests.store.test_postgres_commit import claimed_once

pytestmark = pytest.mark.postgres


def counted_plan(store: Store, key: str, n: int, calls: list[str], **step_kw: Any) -> Plan:
    def step(i: int) -> Callable[[Any], Any]:
        def fn(payload: Any) -> Any:
            calls.append(f"s{i}")
            return {"i": i}

        fn.__name__ = f"s{i}"
        return fn

    return Plan(*[Step(step(i), **step_kw) for i in range(n)], store=store, checkpoint_key=key)


def journal_names(store: Store, key: str) -> list[str | None]:
    """The names of the steps the run's journal records, in order."""
    return [row.name for row in store.backend.run_journal(key) if row.kind == "step"]


def async_conns(store: Store) -> Any:
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    return backend._async


def test_async_runs_commit_on_async_connections_and_sync_calls_do_not(pg_url: str) -> None:
    """guarantee 346: steps of a run awaited on an event loop (``await agent.run(...)``)
    are committed on the backend's async connections; a sync call (its own private loop)
    commits through the pool from its thread, as before. Both record every step once."""
    with Store(url=pg_url) as store:
        calls: list[str] = []
        plan = counted_plan(store, "sync-call", 3, calls)
        assert Agent(engine=plan)("go").ok
        assert async_conns(store).open_connections == 0

        async def main() -> None:
            plan = counted_plan(store, "awaited", 4, calls)
            out = await Agent(engine=plan).run("go")
            assert out.ok

        asyncio.run(main())
        assert async_conns(store).open_connections == 1
        assert calls == ["s0", "s1", "s2", "s0", "s1", "s2", "s3"]
        assert journal_names(store, "awaited") == ["s0", "s1", "s2", "s3"]
        # a second loop reuses the idle connection (they are not tied to a loop)
        asyncio.run(Agent(engine=counted_plan(store, "again", 2, calls)).run("go"))
        assert async_conns(store).open_connections == 1


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_commit_whose_connection_is_cut_lands_exactly_once(
    cut_proxy: CutProxy, pg_url: str, mode: str
) -> None:
    """guarantee 346: the connection of an async step commit is cut before the server got
    the statement, or after it ran it (no answer comes back): the commit learns the truth
    from the stored head and sends it again only when it did not land. The run finishes,
    every step ran once, and the journal has every step once."""
    key = f"cut-async-{mode}"
    calls: list[str] = []
    with Store(url=cut_proxy.url_for(pg_url)) as store:

        def arm_then_return(payload: Any) -> Any:
            calls.append("arm")
            cut_proxy.arm(b"WITH upd AS", mode)  # the commit of this very step
            return "armed"

        plan = Plan(
            Step(lambda p: calls.append("first") or 1, name="first"),
            Step(arm_then_return),
            Step(lambda p: calls.append("last") or 3, name="last"),
            store=store,
            checkpoint_key=key,
        )
        out = asyncio.run(Agent(engine=plan).run("go"))
        assert out.ok, out.error
        assert cut_proxy.cuts == 1
        assert calls == ["first", "arm", "last"]
        assert journal_names(store, key) == ["first", "arm_then_return", "last"]
        head = store.backend.run_get(key)
        assert head is not None and head.status == "done"


def test_a_commit_in_flight_when_its_run_is_cancelled_still_lands(pg_url: str) -> None:
    """guarantee 346: a run cancelled while its step's commit is in flight (here held up by
    a lock on the run's head) stops, but that commit lands, as a commit handed to a thread
    would; a resume does not run the step again. The connection goes back idle."""
    key = "cancelled-mid-commit"
    calls: list[str] = []
    with Store(url=pg_url) as store, psycopg.connect(pg_url) as blocker:
        locked = threading.Event()

        def lock_head(payload: Any) -> Any:
            calls.append("lock_head")
            # hold the run's head: this step's commit now waits for the lock
            blocker.execute("SELECT 1 FROM stepstone_runs WHERE key = %s FOR UPDATE", (key,))
            locked.set()
            return "held"

        plan = Plan(
            Step(lock_head),
            Step(lambda p: calls.append("after") or 2, name="after"),
            store=store,
            checkpoint_key=key,
        )

        async def main() -> None:
            task = asyncio.ensure_future(Agent(engine=plan).run("go"))
            while not locked.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the commit is sent and waits on the lock
            task.cancel()
            # the lock goes soon (the cancelled run's release waits for it too)
            threading.Timer(0.3, blocker.commit).start()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):  # the commit landed, and its sending task is done
                if journal_names(store, key) == ["lock_head"] and len(asyncio.all_tasks()) == 1:
                    break
                await asyncio.sleep(0.02)

        asyncio.run(main())
        assert journal_names(store, key) == ["lock_head"]
        assert async_conns(store).open_connections == 1
        resumed = Plan(
            Step(lock_head),
            Step(lambda p: calls.append("after") or 2, name="after"),
            store=store,
            checkpoint_key=key,
            resume=True,
        )
        assert asyncio.run(Agent(engine=resumed).run("go")).ok
        assert calls == ["lock_head", "after"]


def test_a_refused_async_commit_says_why_as_a_sync_one_does(pg_url: str) -> None:
    """guarantee 346: an async step commit whose writes= key holds a run writes nothing and
    raises StoreKeyConflictError naming the key, as on the sync path."""
    with Store(url=pg_url) as store:
        asyncio.run(Agent(engine=counted_plan(store, "taken", 1, [])).run("go"))
        plan = counted_plan(store, "writer", 2, [], writes="taken")
        with pytest.raises(StoreKeyConflictError, match="key 'taken' holds a durable run"):
            asyncio.run(Agent(engine=plan).run("go"))
        assert journal_names(store, "writer") == []
        assert journal_names(store, "taken") == ["s0"]


def test_busy_async_connections_send_the_rest_through_the_pool(pg_url: str) -> None:
    """guarantee 346: at most max_size async connections are open; commits that find them
    all busy go through the pool instead, and every run lands every step once."""
    calls: list[str] = []
    with Store(backend=PostgresBackend(pg_url, max_size=2)) as store:

        async def main() -> None:
            plans = [counted_plan(store, f"busy-{i}", 5, calls) for i in range(8)]
            outs = await asyncio.gather(*(Agent(engine=p).run("go") for p in plans))
            assert all(out.ok for out in outs)

        asyncio.run(main())
        assert async_conns(store).open_connections <= 2
        assert len(calls) == 40
        for i in range(8):
            assert journal_names(store, f"busy-{i}") == [f"s{j}" for j in range(5)]


def test_closing_the_store_closes_its_async_connections(pg_url: str) -> None:
    """guarantee 346: Store.close() ends the sessions of the idle async connections on the
    server; nothing is left to warn about at garbage collection."""

    def alive(pids: set[int]) -> set[int]:
        """Which of the server sessions ``pids`` still run (the store's own: another
        test's store collected meanwhile must not count)."""
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
            ).fetchall()
            return {int(row[0]) for row in rows}

    store = Store(url=pg_url)
    asyncio.run(Agent(engine=counted_plan(store, "closing", 2, [])).run("go"))
    assert async_conns(store).open_connections == 1
    pids = {conn.info.backend_pid for conn in async_conns(store)._idle}
    assert len(pids) == 1 and alive(pids) == pids
    store.close()
    gc.collect()
    for _ in range(50):
        if not alive(pids):
            break
        threading.Event().wait(0.05)
    assert alive(pids) == set()


def test_async_commits_follow_prepare_false(pg_url: str) -> None:
    """guarantee 346: behind a pooler without prepared statements
    (``PostgresBackend(prepare=False)``), the async connections never prepare either."""
    with Store(backend=PostgresBackend(pg_url, prepare=False)) as store:
        plan = counted_plan(store, "unprepared", 12, [])  # past psycopg's threshold of 5
        assert asyncio.run(Agent(engine=plan).run("go")).ok
        assert journal_names(store, "unprepared") == [f"s{i}" for i in range(12)]
        conns = async_conns(store)._idle
        assert len(conns) == 1 and conns[0].prepare_threshold is None
        # the server side: the connection holds no prepared statement
        assert asyncio.run(_prepared_count(conns[0])) == 0


async def _prepared_count(conn: Any) -> int:
    cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
    row = await cur.fetchone()
    return int(row[0])


def test_a_commit_cancelled_while_its_connection_opens_frees_that_slot() -> None:
    """guarantee 346: a run cancelled while the first async connection is still being
    opened (here a server that accepts and never answers) leaves no slot counted as open,
    so later commits are not sent through the pool for want of one."""
    from stepstone.store._base import RunHead
    from stepstone.store._postgres_async import AsyncCommits

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    commits = AsyncCommits(
        f"postgresql://nobody@127.0.0.1:{port}/none", {"autocommit": True}, max_size=1, prepare=True
    )
    backend = PostgresBackend(f"postgresql://nobody@127.0.0.1:{port}/none")
    head = RunHead(
        key="k",
        kind="plan",
        status="running",
        next_step=None,
        run_uid="uid",
        version=2,
        iteration=0,
        journal_len=0,
        host="h",
        pid=1,
        pid_start=None,
        lease_until=0.0,
        meta={},
        created_at=0.0,
        updated_at=0.0,
    )

    async def main() -> None:
        task = asyncio.ensure_future(commits.commit(backend, head, 1, [], []))
        await asyncio.sleep(0.3)  # connecting: the server never answers
        assert commits.open_connections == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        assert commits.open_connections == 0
    finally:
        commits.close()
        backend.close()
        silent.close()


@pytest.mark.parametrize("mode", ["before", "after"])
def test_an_async_claim_whose_answer_is_lost_is_applied_once(
    cut_proxy: CutProxy, pg_url: str, mode: str
) -> None:
    """guarantee 396: a new run's claim awaited on an event loop goes on an async
    connection; cut before the server gets it, or after it ran it (sent unprepared, so the
    cut message is the claim itself), the claim finds its own run stamp under the key or
    claims again, and the run is claimed exactly once, by this call."""
    key = f"cut-aclaim-{mode}"
    with Store(backend=PostgresBackend(cut_proxy.url_for(pg_url), prepare=False)) as via:
        warm = asyncio.run(
            aclaim_run(via, f"{key}-warm", kind="test", resume=False, first_step="a")
        )
        assert warm.run is not None and async_conns(via).open_connections == 1
        warm.run.release()
        cut_proxy.arm(b"claim_fresh", mode)
        claimed = asyncio.run(aclaim_run(via, key, kind="test", resume=False, first_step="a"))
        assert cut_proxy.cuts == 1
        via.delete(f"{key}-warm")
        claimed_once(pg_url, key, claimed)


def test_an_async_claim_of_a_taken_key_decides_as_a_sync_one(pg_url: str) -> None:
    """guarantee 396: from async code, a key whose run is done is answered done by a resume
    and started over by a fresh claim; a key a live run owns is refused."""
    with Store(url=pg_url) as store:
        first = asyncio.run(
            aclaim_run(store, "aclaim-taken", kind="test", resume=False, first_step="a")
        )
        assert first.run is not None
        with pytest.raises(ConcurrentRunError):
            asyncio.run(
                aclaim_run(store, "aclaim-taken", kind="test", resume=False, first_step="a")
            )
        first.run.commit_sync(status="done", next_step=None, rows=[("step", "a", 1)])
        first.run.release()
        done = asyncio.run(
            aclaim_run(store, "aclaim-taken", kind="test", resume=True, first_step="a")
        )
        assert done.outcome == "done" and done.run is None
        again = asyncio.run(
            aclaim_run(store, "aclaim-taken", kind="test", resume=False, first_step="a")
        )
        assert again.outcome == "fresh" and again.run is not None
        assert store.backend.run_journal("aclaim-taken") == []
        again.run.release()
        store.delete("aclaim-taken")


@pytest.mark.parametrize("awaited", [False, True])
def test_a_claim_whose_session_still_runs_it_waits_for_that_session(
    cut_proxy: CutProxy, pg_url: str, awaited: bool
) -> None:
    """guarantees 254, 396: a claim's connection (sync, or awaited on an async
    connection) is cut while the server still waits to run it (a lock on the key holds it
    back); the server session goes on and commits it later. The claim waits for that
    session to end before it looks for its run stamp, so it finds its own claim rather
    than claiming again (which would find the key owned, by itself)."""
    key = f"cut-claim-held-{awaited}"
    with Store(backend=PostgresBackend(cut_proxy.url_for(pg_url), prepare=False)) as via:
        warm = asyncio.run(
            aclaim_run(via, f"{key}-warm", kind="test", resume=False, first_step="a")
        )
        assert warm.run is not None
        warm.run.release()
        with psycopg.connect(pg_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id(key)))
            timer = threading.Timer(1.0, holder.execute, ("SELECT pg_advisory_unlock_all()",))
            timer.start()
            cut_proxy.arm(b"claim_fresh", "after")
            try:
                if awaited:
                    claimed = asyncio.run(
                        aclaim_run(via, key, kind="test", resume=False, first_step="a")
                    )
                else:
                    claimed = claim_run(via, key, kind="test", resume=False, first_step="a")
            finally:
                timer.join()
        assert cut_proxy.cuts == 1
        assert claimed.outcome == "fresh" and claimed.run is not None
        head = via.backend.run_get(key)
        assert head is not None and head.run_uid == claimed.head.run_uid
        claimed.run.release()
        via.delete(key)
        via.delete(f"{key}-warm")
