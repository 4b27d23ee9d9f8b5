"""Taking queued runs on PostgreSQL: one statement per claim, and a claim whose answer is
lost on the network (a real connection cut by tests.pgserver.CutProxy)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from stepstone import Store, submit
from stepstone.durable._queue import queue_backend
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
