"""Timers, messages, events and streams: what a run keeps beside its journal, on every
backend (``store/_extras.py``)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from stepstone.durable import claim_run
from stepstone.durable._kernel import OwnedRun
from stepstone.exceptions import CorruptRecordError
from stepstone.store._changes import run_topic
from stepstone.store._extras import ExtraWrites, Timer
from stepstone.testing.store_conformance._spec import StoreSpec


def _key(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:10]}"  # a database shared by several tests


def _claim(store_spec: StoreSpec, key: str) -> OwnedRun:
    claimed = claim_run(store_spec.open(), key, kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    return claimed.run


def test_messages_are_kept_in_send_order_and_consumed_once_with_a_commit(
    store_spec: StoreSpec,
) -> None:
    """guarantee 500: a message sent to a run that does not exist yet is kept for it;
    messages of a topic come in send order; a commit consumes one in its own transaction,
    once: consuming it again (or another run's) writes nothing of the commit."""
    store = store_spec.open()
    backend = store.backend
    key, other = _key("mail"), _key("mail-other")
    first = backend.message_send(key, "approval", '{"n":1}', refuse=("done",))
    second = backend.message_send(key, "approval", '{"n":2}', refuse=("done",))
    noise = backend.message_send(key, "other", '"x"', refuse=("done",))
    theirs = backend.message_send(other, "approval", '"theirs"', refuse=("done",))
    assert first is not None and second is not None and noise is not None and theirs
    assert first < second < noise  # ids follow send order
    found = backend.message_next(key, "approval")
    assert found is not None and (found.id, found.data, found.topic) == (
        first,
        '{"n":1}',
        "approval",
    )
    assert found.consumed_at is None and found.run_key == key
    run = _claim(store_spec, key)
    try:
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("recv", "0", {"id": first})],
            extras=ExtraWrites(consume=(first,)),
        )
        after = backend.message_next(key, "approval")
        assert after is not None and after.id == second
        assert [m.consumed_at is not None for m in backend.messages(key)] == [True, False, False]
        version = run.head.version
        for bad in (first, theirs):  # consumed already; another run's
            with pytest.raises(CorruptRecordError, match=str(bad)):
                run.commit_sync(
                    status="running",
                    next_step="c",
                    rows=[("recv", "1", {"id": bad})],
                    extras=ExtraWrites(consume=(bad,), events=(("e", "1"),)),
                )
            head = backend.run_get(key)
            assert head is not None and head.version == version  # nothing was written
            assert backend.event_get(key, "e") is None
            assert len(backend.run_journal(key)) == 1
        other_next = backend.message_next(other, "approval")
        assert other_next is not None and other_next.id == theirs
        run.commit_sync(status="done", next_step=None)
    finally:
        run.release()
    # guarantee 501: a run that finished is refused (None), and nothing is stored
    assert backend.message_send(key, "approval", '"late"', refuse=("done",)) is None
    assert [m.id for m in backend.messages(key)] == [first, second, noise]


def test_events_keep_the_last_value_and_streams_append_at_the_next_offset(
    store_spec: StoreSpec,
) -> None:
    """guarantee 502: an event keeps its last value (set directly or with a commit);
    stream values get offsets 0, 1, 2... per stream, whether appended directly (with the
    writer's attempt) or with a commit (attempt None), and read back in order from any
    offset."""
    store = store_spec.open()
    backend = store.backend
    key = _key("ev")
    assert backend.event_get(key, "stage") is None and backend.events(key) == []
    backend.event_set(key, "stage", '"start"')
    backend.event_set(key, "stage", '"charged"')
    backend.event_set(key, "a", "1")
    stage = backend.event_get(key, "stage")
    assert stage is not None and stage.data == '"charged"'
    assert [(e.name, e.data) for e in backend.events(key)] == [("a", "1"), ("stage", '"charged"')]
    assert backend.stream_append(key, "progress", '{"pct":10}', 1) == 0
    assert backend.stream_append(key, "progress", '{"pct":20}', 2) == 1
    assert backend.stream_append(key, "log", '"x"', None) == 0
    run = _claim(store_spec, key)
    try:
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("w", None, {})],
            extras=ExtraWrites(
                events=(("stage", '"shipped"'),),
                stream=(("progress", '{"pct":30}'), ("progress", '{"pct":40}')),
            ),
        )
    finally:
        run.release()
    stage = backend.event_get(key, "stage")
    assert stage is not None and stage.data == '"shipped"'
    items = backend.stream_read(key, "progress", 0, 100)
    assert [(i.offset, i.data, i.attempt) for i in items] == [
        (0, '{"pct":10}', 1),
        (1, '{"pct":20}', 2),
        (2, '{"pct":30}', None),
        (3, '{"pct":40}', None),
    ]
    assert [i.offset for i in backend.stream_read(key, "progress", 2, 1)] == [2]
    assert backend.stream_read(key, "progress", 9, 10) == []
    assert backend.stream_read(key, "missing", 0, 10) == []
    assert backend.streams(key) == [("log", 1), ("progress", 4)]


def test_concurrent_appends_take_distinct_offsets(store_spec: StoreSpec) -> None:
    """guarantee 502: writers appending to one stream at once (threads, and for shared
    stores other store objects) never take the same offset and leave no gap."""
    key = _key("race")
    stores = [store_spec.open() for _ in range(4)]
    got: list[int] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        for i in range(15):
            offset = stores[n].backend.stream_append(key, "s", str(n * 100 + i), n)
            with lock:
                got.append(offset)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(60))
    values = stores[0].backend.stream_read(key, "s", 0, 100)
    assert [v.offset for v in values] == list(range(60))
    for n in range(4):  # each writer's values in its own order
        mine = [int(v.data) for v in values if v.attempt == n]
        assert mine == [n * 100 + i for i in range(15)]
    for store in stores:
        if store is not store_spec.shared:
            store.close()


def test_timers_are_set_and_cleared_with_commits(store_spec: StoreSpec) -> None:
    """guarantee 503: a run's timers (what it waits for, until when) are set and cleared
    in its step commits and listed by run or for every run."""
    store = store_spec.open()
    backend = store.backend
    key = _key("timer")
    run = _claim(store_spec, key)
    try:
        now = backend.clock()
        sleep = Timer(run_key=key, name="0", wake_at=now + 60.0, topic=None, since=now)
        recv = Timer(run_key=key, name="1", wake_at=None, topic="approval", since=now)
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("t", "0", {})],
            extras=ExtraWrites(timers=(sleep, recv)),
        )
        assert backend.timers(key) == [sleep, recv]
        assert {t.run_key for t in backend.timers(None)} >= {key}
        run.commit_sync(
            status="running",
            next_step="c",
            rows=[("t", "1", {})],
            extras=ExtraWrites(clear_timers=("0",)),
        )
        assert backend.timers(key) == [recv]
    finally:
        run.release()


def test_a_stale_commit_writes_none_of_its_records(store_spec: StoreSpec) -> None:
    """guarantee 503: a commit whose version no longer matches writes none of its records
    (no message consumed, no event, no stream value, no timer)."""
    store = store_spec.open()
    backend = store.backend
    key = _key("stale")
    mid = backend.message_send(key, "t", "1", refuse=())
    assert mid is not None
    run = _claim(store_spec, key)
    try:
        head = run.head
        new = head.replace(version=head.version + 1, status="running")
        now = backend.clock()
        timer = Timer(run_key=key, name="0", wake_at=now, topic="t", since=now)
        extras = ExtraWrites(
            consume=(mid,), events=(("e", "1"),), stream=(("s", "1"),), timers=(timer,)
        )
        assert not backend.run_commit_extras(new, head.version + 5, [], [], extras)
        pending = backend.message_next(key, "t")
        assert pending is not None and pending.id == mid
        assert backend.events(key) == [] and backend.streams(key) == []
        assert backend.timers(key) == []
    finally:
        run.release()


def test_deleting_a_run_deletes_its_records_and_a_fresh_start_keeps_its_mail(
    store_spec: StoreSpec,
) -> None:
    """guarantee 504: deleting a run deletes its timers, messages, events and streams; a
    fresh start under its key (the journal reset) drops its timers, events and streams
    and keeps the messages waiting for it."""
    store = store_spec.open()
    backend = store.backend
    key = _key("del")
    run = _claim(store_spec, key)
    now = backend.clock()
    try:
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("t", None, {})],
            extras=ExtraWrites(
                events=(("e", "1"),),
                stream=(("s", "1"),),
                timers=(Timer(run_key=key, name="0", wake_at=now, topic=None, since=now),),
            ),
        )
    finally:
        run.release()
    mid = backend.message_send(key, "t", '"waiting"', refuse=("done",))
    fresh = claim_run(store, key, kind="test", resume=False, first_step="a")
    assert fresh.run is not None
    fresh.run.release()
    assert backend.events(key) == [] and backend.streams(key) == [] and backend.timers(key) == []
    pending = backend.message_next(key, "t")
    assert pending is not None and pending.id == mid
    assert store.delete(key)
    assert backend.messages(key) == [] and backend.message_next(key, "t") is None


def test_a_waiter_is_woken_by_a_message_an_event_or_a_stream_value(
    store_spec: StoreSpec,
) -> None:
    """guarantee 505: a subscription to a run's records wakes when a message, an event or
    a stream value of that run is stored (from another thread here), well before its
    poll interval when the store notifies; the change is then there to read."""
    store = store_spec.open()
    backend = store.backend
    feed = backend.changes()
    for what in ("message", "event", "stream"):
        key = _key(f"wake-{what}")
        with feed.subscribe([run_topic(key)]) as sub:
            time.sleep(0.05)  # a listener connecting meanwhile wakes the waiter once
            sub.wait(0)

            def write(what: str = what, key: str = key) -> None:
                time.sleep(0.05)
                if what == "message":
                    backend.message_send(key, "t", "1", refuse=())
                elif what == "event":
                    backend.event_set(key, "e", "1")
                else:
                    backend.stream_append(key, "s", "1", None)

            writer = threading.Thread(target=write)
            start = time.monotonic()
            writer.start()
            deadline = start + 10
            while time.monotonic() < deadline:
                sub.wait(deadline - time.monotonic())
                if backend.messages(key) or backend.events(key) or backend.streams(key):
                    break
            writer.join()
            waited = time.monotonic() - start
            assert backend.messages(key) or backend.events(key) or backend.streams(key)
            # a store that notifies (memory, PostgreSQL: poll 1 s) wakes the waiter
            # before its poll interval; one that polls (SQLite) within it
            assert waited < (0.9 * feed.poll if feed.poll >= 1.0 else feed.poll + 1.0), (
                what,
                waited,
            )


def test_notify_run_wakes_the_runs_waiters(store_spec: StoreSpec) -> None:
    """guarantee 513: ``notify_run(key)`` (what an operator's cancel calls) wakes a
    subscription to the run's records, from another store object too (on PostgreSQL a
    ``NOTIFY`` between connections), well before the feed's poll interval."""
    store = store_spec.open()
    other = store_spec.open()
    feed = store.backend.changes()
    key = _key("notified")
    with feed.subscribe([run_topic(key)]) as sub:
        time.sleep(0.05)  # a listener connecting meanwhile wakes the waiter once
        sub.wait(0)

        def notify() -> None:
            time.sleep(0.05)
            other.backend.notify_run(key)

        thread = threading.Thread(target=notify)
        start = time.monotonic()
        thread.start()
        woke = False
        while not woke and time.monotonic() < start + 10:
            woke = sub.wait(10)
        thread.join()
        waited = time.monotonic() - start
    if other is not store_spec.shared:
        other.close()
    assert woke, "notify_run did not wake the run's waiter"
    assert waited < 0.9 * max(feed.poll, 1.0), waited
