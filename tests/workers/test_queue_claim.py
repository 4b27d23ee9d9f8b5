"""Taking queued runs on PostgreSQL: one statement per claim, and a claim whose answer is
lost on the network (a real connection cut by tests.pgserver.CutProxy); the same from
async code, on the store's async connections, as workers take runs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import psycopg
import pytest

from stepstone import Store, submit
from stepstone.durable._queue import queue_backend
from stepstone.store._postgres import PostgresBackend
from stepstone.store._queue_base import Owner
from tests.pgserver import CutProxy

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = Store(url=pg_url)
    s.setup()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
    try:
        yield s
    finally:
        s.close()


def _owner(name: str) -> Owner:
    return Owner(worker=name, host="test-host", pid=os.getpid(), pid_start=None)


def _running(pg_url: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT id, worker, attempts FROM stepstone_queue WHERE status = 'running'"
        ).fetchall()
    return {str(i): (str(w), int(a)) for i, w, a in rows}


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_claim_whose_answer_is_lost_hands_each_entry_out_once(
    store: Store, pg_url: str, cut_proxy: CutProxy, mode: str
) -> None:
    """guarantee 294: the connection is cut just before the server gets a claim, or just
    after it ran it (the answer never comes back). The claim reconnects and returns exactly
    the entries it holds in the database (taken once, one attempt each), never the entries
    the worker already ran before, and strands nothing."""
    handles = [submit(store, "tests.workers.targets:plan", "x", queue="cut") for _ in range(5)]
    with Store(url=cut_proxy.url_for(pg_url)) as via:
        queue = queue_backend(via)
        before = queue.claim("cut", _owner(f"w-held-{mode}"), 30.0, 2)
        assert [e.id for e in before] == [h.id for h in handles[:2]]
        me = _owner(f"w-cut-{mode}")
        held = queue.claim("cut", me, 30.0, 1)
        assert [e.id for e in held] == [handles[2].id]
        cut_proxy.arm(b"stepstone_queue_limits", mode)  # only the claim statement names it
        got = queue.claim("cut", me, 30.0, 2, held={e.id for e in held})
        assert cut_proxy.cuts == 1
    assert [e.id for e in got] == [h.id for h in handles[3:5]]
    assert all(e.worker == me.worker and e.attempts == 1 for e in got)
    running = _running(pg_url)
    assert running == {
        **{e.id: (f"w-held-{mode}", 1) for e in before},
        handles[2].id: (me.worker, 1),
        **{e.id: (me.worker, 1) for e in got},
    }


def test_one_claim_takes_expired_entries_before_queued_ones_and_fails_poison(
    store: Store, pg_url: str
) -> None:
    """guarantee 294: in the one-statement claim, an entry whose worker died is taken before
    queued ones, and one that used up its attempts is marked failed, not taken."""
    queue = queue_backend(store)
    dead = submit(store, "tests.workers.targets:plan", "x", queue="mix", max_attempts=2)
    poison = submit(store, "tests.workers.targets:plan", "x", queue="mix", max_attempts=1)
    waiting = submit(store, "tests.workers.targets:plan", "x", queue="mix")
    taken = queue.claim("mix", _owner("w-gone"), 30.0, 2)
    assert [e.id for e in taken] == [dead.id, poison.id]
    for e in taken:
        assert queue.expire(e.id, "w-gone")
    got = queue.claim("mix", _owner("w-next"), 30.0, 2)
    assert [e.id for e in got] == [dead.id, waiting.id]
    assert got[0].attempts == 2 and got[1].attempts == 1
    failed = queue.get(poison.id)
    assert failed is not None and failed.status == "failed"
    assert failed.error is not None and "max_attempts=1" in failed.error


def _async_open(store: Store) -> int:
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    return backend._async.open_connections


@pytest.mark.parametrize("mode", ["before", "after"])
def test_an_async_claim_whose_answer_is_lost_hands_each_entry_out_once(
    store: Store, pg_url: str, cut_proxy: CutProxy, mode: str
) -> None:
    """guarantee 396: a claim awaited on an event loop goes on an async connection; cut
    before the server gets it, or after it ran it (sent unprepared, so the cut message is
    the claim itself), it returns exactly the entries it holds in the database, taken once,
    never those the worker already runs, and strands nothing."""
    handles = [submit(store, "tests.workers.targets:plan", "x", queue="acut") for _ in range(4)]
    me = _owner(f"w-acut-{mode}")
    with Store(backend=PostgresBackend(cut_proxy.url_for(pg_url), prepare=False)) as via:
        queue = queue_backend(via)
        held = asyncio.run(queue.aclaim("acut", me, 30.0, 1))
        assert [e.id for e in held] == [handles[0].id]
        assert _async_open(via) == 1  # not through the pool in a thread
        cut_proxy.arm(b"stepstone_queue_limits", mode)  # only the claim statement names it
        got = asyncio.run(queue.aclaim("acut", me, 30.0, 2, held={e.id for e in held}))
        assert cut_proxy.cuts == 1
    assert [e.id for e in got] == [h.id for h in handles[1:3]]
    assert all(e.worker == me.worker and e.attempts == 1 for e in got)
    assert _running(pg_url) == {e.id: (me.worker, 1) for e in [*held, *got]}


def test_an_async_claim_takes_what_a_sync_claim_would(store: Store, pg_url: str) -> None:
    """guarantee 396: from async code, entries of dead workers come first, a poison run is
    marked failed, a queued entry whose cancel was requested is settled cancelled and the
    next one taken in its place, a queue with limits takes no more than its limit; each
    entry as stored, to the last field."""
    queue = queue_backend(store)
    target = "tests.workers.targets:plan"
    dead = submit(store, target, 'ü "q"\n\\ 😀', queue="amix", max_attempts=2)
    poison = submit(store, target, "x", queue="amix", max_attempts=1)
    taken = asyncio.run(queue.aclaim("amix", _owner("w-gone"), 30.0, 2))
    assert [e.id for e in taken] == [dead.id, poison.id]
    assert _async_open(store) == 1
    assert taken == [queue.get(e.id) for e in taken]
    for e in taken:
        assert queue.expire(e.id, "w-gone")
    called_off, waiting, later = (submit(store, target, "x", queue="amix") for _ in range(3))
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as an older stepstone left it
        conn.execute(
            "UPDATE stepstone_queue SET cancel_requested = true WHERE id = %s", (called_off.id,)
        )
    got = asyncio.run(queue.aclaim("amix", _owner("w-next"), 30.0, 3))
    assert [e.id for e in got] == [dead.id, waiting.id, later.id]
    assert [e.attempts for e in got] == [2, 1, 1]
    assert got == [queue.get(e.id) for e in got]
    assert [queue.get(h.id).status for h in (poison, called_off)] == ["failed", "cancelled"]  # type: ignore[union-attr]

    queue.set_limits("alim", concurrency=1, rate=None)
    first = submit(store, target, "x", queue="alim")
    submit(store, target, "x", queue="alim")
    assert [e.id for e in asyncio.run(queue.aclaim("alim", _owner("w-lim"), 30.0, 2))] == [first.id]
    assert asyncio.run(queue.aclaim("alim", _owner("w-lim2"), 30.0, 2)) == []


@pytest.mark.parametrize("mode", ["before", "after"])
def test_the_end_of_a_run_recorded_from_async_code_lands_once(
    store: Store, pg_url: str, cut_proxy: CutProxy, mode: str
) -> None:
    """guarantee 396: a worker's record of how a run ended, sent on an async connection and
    cut before or after the server ran it, is recorded once and reported as recorded; one
    for an entry the worker no longer holds records nothing and says so."""
    handle = submit(store, "tests.workers.targets:plan", "x", queue="afin")
    me = _owner(f"w-afin-{mode}")
    with Store(backend=PostgresBackend(cut_proxy.url_for(pg_url), prepare=False)) as via:
        queue = queue_backend(via)
        (entry,) = asyncio.run(queue.aclaim("afin", me, 30.0))
        cut_proxy.arm(b"RETURNING 1", mode)  # only the async update of the end says so
        assert asyncio.run(queue.afinish(entry.id, me.worker, "done", '{"r": 1}', None))
        assert cut_proxy.cuts == 1
        assert not asyncio.run(queue.afinish(entry.id, "w-other", "failed", None, "no"))
    stored = queue_backend(store).get(handle.id)
    assert stored is not None
    assert (stored.status, stored.result, stored.error, stored.worker, stored.attempts) == (
        "done",
        '{"r": 1}',
        None,
        me.worker,
        1,
    )
