"""Messages, events and streams from outside a run: ``send``, ``RunHandle.get_event``,
``RunHandle.read_stream`` and their async forms, on every store."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stepstone import RunFinishedError, RunHandle, Store, send
from stepstone.durable import claim_run
from stepstone.durable._kernel import OwnedRun
from stepstone.durable._messages import StreamItem, decode_value, encode_value, run_outcome
from stepstone.exceptions import ConfigurationError, SerializationError
from stepstone.store._extras import ExtraWrites


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        s = Store()
    elif request.param == "sqlite":
        s = Store(db=tmp_path / "m.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _run(store: Store, key: str) -> OwnedRun:
    claimed = claim_run(store, key, kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    return claimed.run


def _finish(run: OwnedRun, status: str = "done", **kw: object) -> None:
    run.commit_sync(status=status, next_step=None, **kw)  # type: ignore[arg-type]
    run.release()


def _later(seconds: float, fn: object) -> threading.Thread:
    def go() -> None:
        time.sleep(seconds)
        fn()  # type: ignore[operator]

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_send_stores_typed_values_in_order_and_refuses_a_finished_run(store: Store) -> None:
    # guarantee 500: kept for a run that does not exist yet, typed values come back as
    # themselves, ids in send order
    when = datetime(2026, 5, 1, 3, 0, tzinfo=UTC)
    first = send(store, "o-42", "approval", {"ok": True, "at": when})
    second = send(store, "o-42", "approval", {"ok": False})
    assert second > first
    msgs = store.backend.messages("o-42")
    assert [decode_value(m.data) for m in msgs] == [{"ok": True, "at": when}, {"ok": False}]
    # guarantee 501: a finished run refuses (nothing stored); a failed one still takes them
    run = _run(store, "o-42")
    _finish(run, "failed")
    send(store, "o-42", "approval", 3)
    run = _run(store, "done-run")
    _finish(run)
    with pytest.raises(RunFinishedError, match=r"done-run.*finished"):
        send(store, "done-run", "approval", 1)
    assert store.backend.messages("done-run") == []
    with pytest.raises(SerializationError, match="topic 'approval'"):
        send(store, "o-42", "approval", object())
    with pytest.raises(ConfigurationError, match="topic"):
        send(store, "o-42", "", 1)
    assert len(store.backend.messages("o-42")) == 3


def test_get_event_waits_for_a_value_and_answers_at_once_for_a_finished_run(
    store: Store,
) -> None:
    # guarantee 506
    handle = RunHandle(store, key="ev-run")
    run = _run(store, "ev-run")
    assert handle.get_event("stage", timeout=0) is None
    start = time.monotonic()
    assert handle.get_event("stage", timeout=0.3) is None  # None on timeout
    assert 0.25 <= time.monotonic() - start < 3
    setter = _later(
        0.2, lambda: store.backend.event_set("ev-run", "stage", encode_value("charged", "e"))
    )
    start = time.monotonic()
    assert handle.get_event("stage", timeout=30) == "charged"
    assert time.monotonic() - start < 5
    setter.join()
    run.commit_sync(
        status="running",
        next_step="b",
        rows=[("e", None, {})],
        extras=ExtraWrites(events=(("stage", encode_value({"n": 2}, "e")),)),
    )
    assert handle.get_event("stage", timeout=0) == {"n": 2}  # last write wins
    _finish(run)
    start = time.monotonic()
    assert handle.get_event("stage", timeout=30) == {"n": 2}  # the final value, at once
    assert handle.get_event("never-set", timeout=30) is None  # ended: no wait
    assert time.monotonic() - start < 2
    assert handle.events() == {"stage": {"n": 2}}


def test_read_stream_follows_until_the_run_ends_and_says_how(store: Store) -> None:
    # guarantee 507
    run = _run(store, "st-run")
    backend = store.backend
    backend.stream_append("st-run", "progress", encode_value({"pct": 0}, "s"), 1)

    def writer() -> None:
        for pct in (10, 20, 30):
            time.sleep(0.05)
            backend.stream_append("st-run", "progress", encode_value({"pct": pct}, "s"), 2)
        run.commit_sync(
            status="running",
            next_step="b",
            rows=[("s", None, {})],
            extras=ExtraWrites(stream=(("progress", encode_value({"pct": 100}, "s")),)),
        )
        _finish(run)

    thread = _later(0.1, writer)
    reader = RunHandle(store, key="st-run").read_stream("progress")
    got = list(reader)
    thread.join()
    assert [(o, v["pct"]) for o, v in got] == [(0, 0), (1, 10), (2, 20), (3, 30), (4, 100)]
    assert all(isinstance(i, StreamItem) for i in got)
    assert [i.attempt for i in got] == [1, 2, 2, 2, None]  # a body's write has none
    assert reader.outcome is not None and reader.outcome.status == "done"
    assert reader.next_offset == 5
    # a reader reconnects from any offset; a finished run's stream reads through at once
    again = RunHandle(store, key="st-run").read_stream("progress", start=3)
    assert [o for o, _ in again] == [3, 4] and again.outcome == reader.outcome
    assert run_outcome(store, "st-run") == reader.outcome


def test_read_stream_async_stop_and_reconnect_and_timeout(store: Store) -> None:
    # guarantee 507
    run = _run(store, "as-run")
    backend = store.backend
    for i in range(3):
        backend.stream_append("as-run", "log", encode_value(f"line {i}", "s"), None)
    handle = RunHandle(store, key="as-run")

    async def first_two() -> tuple[list[tuple[int, str]], int]:
        reader = handle.read_stream("log")
        got: list[tuple[int, str]] = []
        async for offset, value in reader:
            got.append((offset, value))
            if len(got) == 2:
                break
        return got, reader.next_offset

    got, next_offset = asyncio.run(first_two())
    assert got == [(0, "line 0"), (1, "line 1")] and next_offset == 2
    reader = handle.read_stream("log", start=next_offset, timeout=0.3)
    with pytest.raises(TimeoutError, match="offset 3"):
        for _ in reader:
            pass
    assert reader.next_offset == 3 and reader.outcome is None
    snapshot = handle.read_stream("log", follow=False)
    assert [o for o, _ in snapshot] == [0, 1, 2] and snapshot.outcome is None

    async def rest() -> list[int]:
        reader = handle.read_stream("log", start=3)
        _later(0.1, lambda: _finish(run, "failed"))
        offsets = [o async for o, _ in reader]
        assert reader.outcome is not None and reader.outcome.status == "failed"
        return offsets

    assert asyncio.run(rest()) == []


def test_a_handle_by_id_reads_the_events_of_its_queued_run(tmp_path: Path) -> None:
    # guarantee 506: a queued run's handle reads its events and streams by its key
    from stepstone import submit

    with Store(db=tmp_path / "q.sqlite") as store:
        handle = submit(store, "tests.workers.targets:plan", "hi", key="q-run")
        store.backend.event_set("q-run", "stage", encode_value("queued", "e"))
        assert handle.get_event("stage", timeout=0) == "queued"
        assert RunHandle(store, handle.id) == handle
        assert RunHandle(store, key="q-run").entry().id == handle.id
        assert handle.cancel()
        reader = handle.read_stream("none")
        assert list(reader) == []
        assert reader.outcome is not None and reader.outcome.status == "cancelled"
        with pytest.raises(ConfigurationError, match="id or a run's key"):
            RunHandle(store)


def test_bad_input_is_refused_naming_the_value_and_the_fix(tmp_path: Path) -> None:
    # guarantee 522
    import stepstone
    from stepstone import ConfigurationTypeError, list_schedules, schedule

    with pytest.raises(ConfigurationTypeError, match=r"Store\(db='app.sqlite'\).*'o.sqlite'"):
        send("o.sqlite", "o-42", "approval", 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationTypeError, match=r"work queue lives in a Store.*'o.sqlite'"):
        RunHandle("o.sqlite", key="o-42")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationTypeError, match="work queue lives in a Store"):
        schedule("o.sqlite", "a.b:c", cron="0 3 * * *")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationTypeError, match="work queue lives in a Store"):
        list_schedules("o.sqlite")  # type: ignore[arg-type]
    with Store(db=tmp_path / "b.sqlite") as store:
        handle = RunHandle(store, key="o-42")
        with pytest.raises(ConfigurationError, match=r"got -1 \(0: look once; None: wait"):
            handle.get_event("stage", timeout=-1)
        with pytest.raises(ConfigurationError, match=r"start must be an offset.*got -1"):
            handle.read_stream("progress", start=-1)
        with pytest.raises(ConfigurationTypeError, match="topic must be a non-empty str, got 3"):
            send(store, "o-42", 3, 1)  # type: ignore[arg-type]

    async def until_tomorrow() -> None:
        await stepstone.sleep_until("tomorrow")  # type: ignore[arg-type]

    with pytest.raises(ConfigurationTypeError, match=r"aware datetime.*unix time.*'tomorrow'"):
        asyncio.run(until_tomorrow())
