"""Schedules: cron ticks turned into queued runs by the workers, exactly once per tick."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from stepstone import Schedule, Store, UserError, Worker, list_schedules, schedule
from stepstone.cli import app
from stepstone.durable._queue import queue_backend
from stepstone.durable._schedules import fire_due, next_tick, ticks_to_fire
from stepstone.exceptions import ConfigurationError
from stepstone.store._queue_base import ScheduleRow

T = "tests.messages.targets:noop_plan"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "sched.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        s = Store(url=url)
        s.setup()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_schedules")
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _row(cron: str, next_at: float, catch_up: str = "one", grace: float = 60.0) -> ScheduleRow:
    return ScheduleRow(
        name="s",
        target=T,
        cron=cron,
        timezone="UTC",
        queue="default",
        task="{}",
        priority=0,
        max_attempts=3,
        catch_up=catch_up,
        grace=grace,
        paused=False,
        next_tick=next_at,
        last_tick=None,
        created_at=0.0,
        updated_at=0.0,
    )


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_ticks_missed_while_no_worker_ran_follow_catch_up() -> None:
    # guarantee 510: on-time ticks always run; missed ones become one run, all, or none
    first = _at("2026-05-01T03:00:00")
    now = _at("2026-05-05T03:00:30")  # four days later: 03:00 on the 5th is on time
    days = [_at(f"2026-05-0{d}T03:00:00") for d in (1, 2, 3, 4, 5)]
    after = _at("2026-05-06T03:00:00")
    assert ticks_to_fire(_row("0 3 * * *", first, "all"), now) == (days, after)
    assert ticks_to_fire(_row("0 3 * * *", first, "one"), now) == ([days[3], days[4]], after)
    assert ticks_to_fire(_row("0 3 * * *", first, "none"), now) == ([days[4]], after)
    late = now + 3600  # nothing on time: "none" queues nothing, "one" the latest
    assert ticks_to_fire(_row("0 3 * * *", first, "none"), late) == ([], after)
    assert ticks_to_fire(_row("0 3 * * *", first, "one"), late) == ([days[4]], after)
    assert ticks_to_fire(_row("0 3 * * *", after, "one"), now) == ([], after)  # not due
    # six fields: a leading seconds field
    start = _at("2026-05-01T00:00:00")
    fired, nxt = ticks_to_fire(_row("*/10 * * * * *", start, "all"), start + 35)
    assert fired == [start, start + 10, start + 20, start + 30] and nxt == start + 40
    assert next_tick("*/10 * * * * *", "UTC", start + 1) == start + 10
    # a time zone: 03:00 in Paris is 01:00 UTC in May
    assert next_tick("0 3 * * *", "Europe/Paris", first) == _at("2026-05-02T01:00:00")


def test_schedule_is_stored_listed_paused_resumed_and_deleted(store: Store) -> None:
    # guarantee 509
    handle = schedule(store, T, cron="0 3 * * *", name="nightly", queue="etl", task="go")
    assert handle == Schedule(store, "nightly") or handle.name == "nightly"
    (info,) = list_schedules(store)
    assert (info.name, info.cron, info.target, info.queue, info.catch_up) == (
        "nightly",
        "0 3 * * *",
        T,
        "etl",
        "one",
    )
    assert info.next_tick.hour == 3 and info.next_tick.minute == 0 and not info.paused
    assert info.next_tick.timestamp() > time.time()
    nxt = info.next_tick
    schedule(store, T, cron="0 3 * * *", name="nightly", queue="etl", catch_up="all")
    assert Schedule(store, "nightly").info().next_tick == nxt  # same clock: tick kept
    assert Schedule(store, "nightly").info().catch_up == "all"
    handle.pause()
    assert handle.info().paused
    handle.resume()
    assert not handle.info().paused and handle.info().next_tick == nxt
    assert handle.delete() and not handle.delete()
    assert list_schedules(store) == []
    with pytest.raises(UserError, match="no schedule 'nightly'"):
        handle.pause()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cron": "0 3 * *"}, "5 fields"),
        ({"cron": "0 25 * * *"}, "cannot be read"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "not a time zone"),
        ({"cron": "0 3 * * *", "catch_up": "some"}, "catch_up must be"),
        ({"cron": "0 3 * * *", "grace": -1}, "grace"),
    ],
)
def test_bad_schedules_are_refused_naming_the_value(
    tmp_path: Path, kwargs: dict[str, object], match: str
) -> None:
    # guarantee 509
    with Store(db=tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigurationError, match=match):
            schedule(store, T, name="bad", **kwargs)  # type: ignore[arg-type]
        assert list_schedules(store) == []
    with pytest.raises(UserError, match="work queue needs a store"):
        schedule(Store(), T, cron="0 3 * * *")


def test_a_worker_starts_one_run_per_tick(store: Store) -> None:
    # guarantee 510: a six-field cron, one run per tick, each done, keyed by its tick
    schedule(store, T, cron="* * * * * *", name="every-second", task="t")
    worker = Worker(store, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = [e for e in queue_backend(store).entries(None, "done")]
            if len(done) >= 3:
                break
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join()
    entries = queue_backend(store).entries(None, None)
    keys = [e.run_key for e in entries]
    assert len(keys) == len(set(keys)) >= 3
    assert all(k.startswith("every-second@") for k in keys)
    ticks = sorted(datetime.fromisoformat(k.split("@")[1].replace("Z", "+00:00")) for k in keys)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(ticks))
    task = json.loads(entries[0].task)
    assert task["metadata"]["schedule"] == "every-second" and task["metadata"]["tick"]
    info = Schedule(store, "every-second").info()
    assert info.last_tick is not None and info.last_tick == ticks[-1]


def _backlog(store: Store, catch_up: str, ticks: int, grace: float = 0.0) -> float:
    """A per-second schedule whose next tick lies ``ticks`` seconds in the past (the workers
    were away); returns that first missed tick."""
    schedule(store, T, cron="* * * * * *", name="s", catch_up=catch_up, grace=grace)  # type: ignore[arg-type]
    qb = queue_backend(store)
    row = qb.schedule_get("s")
    assert row is not None
    first = float(int(qb.now())) - ticks
    qb.schedule_put(dataclasses.replace(row, next_tick=first))
    return first


def test_concurrent_firing_queues_each_tick_once(store: Store) -> None:
    # guarantee 511: workers racing on one schedule's backlog queue each tick exactly once
    first = _backlog(store, "all", 40)
    qb = queue_backend(store)
    counts: list[int] = []
    lock = threading.Lock()

    def racer() -> None:
        for _ in range(5):
            n = fire_due(qb, ["default"])
            with lock:
                counts.append(n)

    threads = [threading.Thread(target=racer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = qb.entries(None, None)
    keys = [e.run_key for e in entries]
    assert len(keys) == len(set(keys)) == sum(counts)
    ticks = sorted(datetime.fromisoformat(k.split("@")[1].replace("Z", "+00:00")) for k in keys)
    assert ticks[0].timestamp() == first and len(ticks) >= 40
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize("catch_up", ["one", "none", "all"])
def test_catch_up_after_the_workers_were_away(store: Store, catch_up: str) -> None:
    # guarantee 510: with grace=0 every tick of the backlog was missed
    first = _backlog(store, catch_up, 20)
    queued = fire_due(queue_backend(store), ["default"])
    keys = sorted(e.run_key for e in queue_backend(store).entries(None, None))
    assert queued == len(keys)
    if catch_up == "none":
        assert keys == []
    elif catch_up == "one":
        (key,) = keys  # the latest missed tick
        tick = datetime.fromisoformat(key.split("@")[1].replace("Z", "+00:00")).timestamp()
        assert tick >= first + 20
    else:
        ticks = [
            datetime.fromisoformat(k.split("@")[1].replace("Z", "+00:00")).timestamp() for k in keys
        ]
        assert ticks[0] == first and len(ticks) >= 21
        assert ticks == [first + i for i in range(len(ticks))]
    row = queue_backend(store).schedule_get("s")
    assert row is not None and row.next_tick > time.time() - 1  # past the backlog


def test_a_paused_schedule_queues_nothing(tmp_path: Path) -> None:
    # guarantee 509
    with Store(db=tmp_path / "s.sqlite") as store:
        _backlog(store, "all", 5)
        Schedule(store, "s").pause()
        assert fire_due(queue_backend(store), ["default"]) == 0
        Schedule(store, "s").resume()  # ticks while paused are skipped
        assert fire_due(queue_backend(store), ["default"]) <= 1
        assert fire_due(queue_backend(store), ["other-queue"]) == 0


def test_the_cli_lists_pauses_resumes_and_deletes(tmp_path: Path) -> None:
    # guarantee 509
    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        schedule(store, T, cron="0 3 * * *", name="nightly", queue="etl")
    runner = CliRunner()
    listed = runner.invoke(app, ["schedules", "--db", str(db)], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "nightly" in listed.stdout and "0 3 * * *" in listed.stdout
    paused = runner.invoke(app, ["schedules", "pause", "nightly", "--db", str(db)])
    assert paused.exit_code == 0 and "paused" in paused.stdout
    as_json = runner.invoke(app, ["schedules", "--db", str(db), "--json"])
    (row,) = json.loads(as_json.stdout)
    assert row["name"] == "nightly" and row["paused"] is True
    assert runner.invoke(app, ["schedules", "resume", "nightly", "--db", str(db)]).exit_code == 0
    assert runner.invoke(app, ["schedules", "delete", "nightly", "--db", str(db)]).exit_code == 0
    gone = runner.invoke(app, ["schedules", "delete", "nightly", "--db", str(db)])
    assert gone.exit_code == 1 and "no schedule 'nightly'" in gone.stderr
    empty = runner.invoke(app, ["schedules", "--db", str(db)])
    assert "no schedules" in empty.stdout


def test_a_scheduled_workflow_gets_its_arguments_every_tick(store: Store) -> None:
    # guarantee 509, 510
    from stepstone import RunHandle

    schedule(
        store,
        "tests.messages.targets:greet",
        cron="* * * * * *",
        name="greeting",
        args=("ana",),
        kwargs={"punct": "?"},
    )
    worker = Worker(store, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = queue_backend(store).entries(None, "done")
            if done:
                break
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join()
    first = queue_backend(store).entries(None, "done")[0]
    env = RunHandle(store, first.id).result(timeout=5)
    assert env.payload == "hello ana?"
    with pytest.raises(ConfigurationError, match="not one"):
        schedule(store, T, cron="0 3 * * *", name="plan-args", args=(1,))


@pytest.mark.parametrize("catch_up", ["one", "none", "all"])
def test_a_worker_back_after_an_outage_follows_catch_up(store: Store, catch_up: str) -> None:
    # guarantee 510: a real worker, started 30 s of per-second ticks after the last one
    # handled; ticks within grace (3 s) of its look are on time, the rest were missed
    first = _backlog(store, catch_up, 30, grace=3.0)
    before = queue_backend(store).now()  # the worker's first look comes after this
    Worker(store, poll_interval=0.05).run(until_idle=True)
    done = queue_backend(store).entries(None, "done")
    looked = min(e.created_at for e in done)  # ... and before it queued these
    ticks = sorted(
        datetime.fromisoformat(e.run_key.split("@")[1].replace("Z", "+00:00")).timestamp()
        for e in done
    )
    assert len(ticks) == len(set(ticks))
    # The look's own time lies between `before` and `looked`: a tick older than 3 s at
    # `before` was surely missed; one within 3 s of `before` may have been on time.
    assert len([t for t in ticks if t >= before - 3.0]) >= 3  # every on-time tick runs
    if catch_up == "all":
        assert ticks == [first + i for i in range(len(ticks))]  # every missed one too
        assert len([t for t in ticks if t < before - 3.0]) >= 26
    elif catch_up == "one":
        # the latest missed one, then the on-time ones: no gap, nothing older
        assert ticks == [ticks[0] + i for i in range(len(ticks))]
        assert before - 4.0 <= ticks[0] < looked - 3.0
    else:
        assert all(t >= before - 3.0 for t in ticks)  # no missed one
    assert all(e.run_key.startswith("s@") for e in done)
