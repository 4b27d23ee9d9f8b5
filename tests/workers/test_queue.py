"""The work queue, on a SQLite file and on PostgreSQL, served by in-process workers:
submit, status, results, dedupe, priorities, delays, cancellation, limits, bad targets."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import psycopg
import pytest

from stepstone import (
    Agent,
    Plan,
    PlanCompileError,
    QueuedRunError,
    RunHandle,
    Store,
    UserError,
    Worker,
    set_queue_limits,
    submit,
)
from stepstone.durable import cancel_run, requeue_run, retry_run
from stepstone.durable._queue import queue_backend
from stepstone.store._queue_base import Owner
from tests.workers import targets
from tests.workers.targets import executions, task

T = "tests.workers.targets:"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "q.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()  # creates the tables
        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _worker(store: Store, **kw: object) -> Worker:
    return Worker(store, poll_interval=0.05, **kw)  # type: ignore[arg-type]


def _stored_outcome(db: Path, entry_id: str) -> tuple[str, str]:
    """The status and error the SQLite queue in ``db`` holds for entry ``entry_id``."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        status, error = conn.execute(
            "SELECT status, error FROM stepstone_queue WHERE id = ?", (entry_id,)
        ).fetchone()
    finally:
        conn.close()
    return str(status), str(error)


def test_submitted_runs_are_run_by_a_worker_and_their_results_come_back(
    store: Store, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    handles = [targets.plan.submit(task(log, f"r{i}"), store=store) for i in range(5)]
    assert {h.status() for h in handles} == {"queued"}  # guarantee 230
    assert _worker(store, concurrency=3).run(until_idle=True) == 5
    for i, h in enumerate(handles):
        assert h.status() == "done"
        env = h.result(timeout=5)
        assert env.ok and env.payload["name"] == f"r{i}"  # guarantee 230
        assert store.read_entry(h.key).value["status"] == "done"  # a durable checkpoint
    runs = executions(log)
    assert sorted(runs) == sorted((f"r{i}", s) for i in range(5) for s in range(targets.STEPS))
    assert all(len(p) == 1 for p in runs.values())


def test_a_handle_can_be_rebuilt_from_its_id(store: Store, tmp_path: Path) -> None:
    h = submit(store, T + "make_plan", task(str(tmp_path / "log"), "f"))
    assert RunHandle(store, h.id) == h
    _worker(store).run(until_idle=True)
    assert RunHandle(store, h.id).result(timeout=5).payload["name"] == "f"  # factory target


def test_an_agent_over_a_plan_runs_with_its_tools(store: Store) -> None:
    h = submit(store, targets.tool_agent, "hello")
    _worker(store).run(until_idle=True)
    assert h.result(timeout=5).payload == "HELLO"  # guarantee 245


def test_a_run_already_done_under_its_key_returns_the_cached_result(
    store: Store, tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    h = submit(store, T + "make_plan", task(log, "once"), key="finished-elsewhere")
    # as if a worker had run it to the end and died before recording the result
    plan = targets.make_plan()
    durable = Plan(*plan.steps, store=store, checkpoint_key="finished-elsewhere", resume=True)
    finished = Agent(engine=durable)(task(log, "once"))
    assert finished.ok
    _worker(store).run(until_idle=True)
    env = h.result(timeout=5)
    assert env.ok and env.metadata["cached"] is True
    # guarantee 304: the run's result (its last step's output), not the writes= values
    assert env.payload == finished.payload
    assert len(executions(log)) == 2  # no step ran again


def test_a_rewound_queued_run_goes_back_to_its_queue(store: Store, tmp_path: Path) -> None:
    # guarantee 259: before, the rewound run stayed paused with no worker to resume it
    log = str(tmp_path / "log")
    Path(log + ".down").touch()
    h = submit(store, T + "flaky_plan", task(log, "f"), key="nightly")
    _worker(store).run(until_idle=True)
    assert h.status() == "failed" and "warehouse is down" in str(h.entry().error)
    assert requeue_run(store, "nightly") == h.id  # as it is: resumed at its failed step
    _worker(store).run(until_idle=True)
    assert h.status() == "failed" and h.entry().attempts == 1
    Path(log + ".down").unlink()
    retry_run(store, "nightly", from_step="flaky")
    assert requeue_run(store, "nightly") == h.id
    assert (h.status(), h.entry().attempts, h.entry().error) == ("queued", 0, None)
    assert requeue_run(store, "nightly") is None  # already queued
    _worker(store).run(until_idle=True)
    env = h.result(timeout=5)
    assert env.ok and store.read("nightly")["status"] == "done"
    assert executions(log) == {("f", 0): [os.getpid()], ("f", 2): [os.getpid()]}
    assert requeue_run(store, "never-queued") is None


def test_dedupe_key_returns_the_first_handle(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    first = targets.plan.submit(task(log, "a"), store=store, dedupe_key="daily-2026-11-23")
    again = targets.plan.submit(task(log, "b"), store=store, dedupe_key="daily-2026-11-23")
    assert again == first  # guarantee 231
    _worker(store).run(until_idle=True)
    assert first.result(timeout=5).payload["name"] == "a"
    assert {name for name, _ in executions(log)} == {"a"}


def test_a_key_is_refused_while_its_run_is_queued_and_continues_it_once_ended(
    store: Store, tmp_path: Path
) -> None:
    # guarantee 299: the second submit under a key used to be queued too, and its handle
    # got the first run's result
    log = str(tmp_path / "log")
    first = submit(store, T + "make_plan", task(log, "a"), key="nightly", dedupe_key="n-1")
    with pytest.raises(UserError, match=f"key 'nightly' belongs to queued run {first.id}"):
        submit(store, T + "make_plan", task(log, "b"), key="nightly")
    again = submit(store, T + "make_plan", task(log, "b"), key="nightly", dedupe_key="n-1")
    assert again == first  # the dedupe key answers first
    assert len(queue_backend(store).entries(None, None)) == 1
    _worker(store).run(until_idle=True)
    later = submit(store, T + "make_plan", task(log, "c"), key="nightly")  # it ended
    _worker(store).run(until_idle=True)
    env = later.result(timeout=5)
    assert env.ok and env.metadata["cached"] is True  # the run under the key, again
    assert env.payload == first.result(timeout=5).payload
    assert {name for name, _ in executions(log)} == {"a"}


def test_concurrent_submits_under_one_key_queue_one_run(store: Store) -> None:
    # guarantee 299: the check and the insert are one step (SQLite's write lock, a lock of
    # the key on PostgreSQL), so submits racing on one key cannot all find it free
    barrier = threading.Barrier(6)
    outcomes: list[object] = []

    def one() -> None:
        barrier.wait()
        try:
            outcomes.append(submit(store, T + "plan", "t", key="shared"))
        except UserError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    handles = [o for o in outcomes if isinstance(o, RunHandle)]
    assert len(handles) == 1 and len(outcomes) == 6
    assert [e.id for e in queue_backend(store).entries(None, None)] == [handles[0].id]


def test_higher_priority_runs_first_then_submission_order(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for name, prio in [("low1", 0), ("high", 5), ("low2", 0), ("mid", 2)]:
        submit(store, T + "make_plan", task(log, name), priority=prio)
    _worker(store, concurrency=1).run(until_idle=True)
    order = []
    for line in Path(log).read_text().splitlines():
        name = line.split()[0]
        if name not in order:
            order.append(name)
    assert order == ["high", "mid", "low1", "low2"]  # guarantee 232


def test_delayed_runs_wait_and_queues_are_separate(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    later = submit(store, T + "make_plan", task(log, "later"), delay=3600)
    other = submit(store, T + "make_plan", task(log, "other"), queue="etl")
    now = submit(store, T + "make_plan", task(log, "now"))
    _worker(store).run(until_idle=True)
    assert now.status() == "done"
    assert later.status() == "queued"  # guarantee 233
    assert other.status() == "queued"  # not a queue this worker serves
    _worker(store, queues=["etl"]).run(until_idle=True)
    assert other.status() == "done"
    with pytest.raises(TimeoutError, match="still queued"):
        later.result(timeout=0.2)


def test_a_failing_step_gives_a_failed_run_with_its_error_envelope(
    store: Store, tmp_path: Path
) -> None:
    h = targets.failing_plan.submit(task(str(tmp_path / "log"), "x"), store=store)
    _worker(store).run(until_idle=True)
    assert h.status() == "failed"
    env = h.result(timeout=5)
    assert not env.ok and env.error is not None and "bad input for run x" in env.error.message


def test_unknown_targets_fail_their_run_not_the_worker(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    bad = [
        submit(store, "tests.workers.no_such_module:plan", task(log, "a")),
        submit(store, T + "no_such_name", task(log, "b")),
        submit(store, T + "not_an_engine", task(log, "c")),
    ]
    good = submit(store, T + "plan", task(log, "ok"))
    assert _worker(store).run(until_idle=True) == 1
    assert good.status() == "done"  # guarantee 234
    for h, words in zip(
        bad, ["cannot import module", "has no attribute", "not a Plan"], strict=True
    ):
        assert h.status() == "failed"
        with pytest.raises(QueuedRunError, match=words):
            h.result(timeout=1)
    with pytest.raises(UserError, match="not an import path"):
        submit(store, "no-colon", "t")
    with pytest.raises(UserError, match="module level"):
        submit(store, lambda: None, "t")


def test_cancel_a_queued_run_and_a_running_one(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    queued = submit(store, T + "plan", task(log, "q"))
    assert queued.cancel() is True
    assert queued.status() == "cancelled"  # guarantee 235
    with pytest.raises(QueuedRunError, match="cancelled"):
        queued.result(timeout=1)
    running = submit(store, T + "long_plan", task(log, "r", sleep=0.05))
    worker = _worker(store, lease_seconds=0.6)
    thread = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    thread.start()
    deadline = time.monotonic() + 30
    while not executions(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.cancel() is True
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert running.status() == "cancelled"  # guarantee 235
    steps = [s for (name, s) in executions(log) if name == "r"]
    assert 0 < len(steps) < 40
    assert running.cancel() is False  # already ended


def test_a_cancel_that_reaches_a_run_in_its_last_step_leaves_the_entry_done(
    store: Store, tmp_path: Path
) -> None:
    """guarantee 268: the last step, cancelled while it runs, still commits and ends the
    run done; its queue entry says done too, with the run's result (it said 'cancelled
    while running' of a run that had finished)."""
    log = str(tmp_path / "log")
    handle = submit(store, T + "gated_plan", task(log, "g"))
    worker = _worker(store, lease_seconds=0.6)
    thread = threading.Thread(target=worker.run, kwargs={"until_idle": True})
    thread.start()
    deadline = time.monotonic() + 30
    while not os.path.exists(log + ".started") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.cancel() is True
    time.sleep(2.0)  # the worker's lease renewals (every 0.2 s) see the cancel
    open(log + ".go", "w").close()
    thread.join(timeout=60)
    assert not thread.is_alive()
    head = store.backend.run_get(handle.entry().run_key)
    assert head is not None and head.status == "done"
    assert handle.status() == "done"
    assert handle.result(timeout=1).ok
    assert sorted(s for (name, s) in executions(log) if name == "g") == [0, 1]


def test_a_cancel_requested_before_a_hand_back_ends_the_run_cancelled(store: Store) -> None:
    # guarantee 298: a worker stopping gracefully hands back the runs it still holds; one
    # whose cancel() had been acknowledged went back to the queue and ran to the end
    queue = queue_backend(store)
    handle = submit(store, T + "plan", "t")
    me = Owner(worker="w-stopping", host="test-host", pid=os.getpid(), pid_start=None)
    assert [e.id for e in queue.claim("default", me, 30.0)] == [handle.id]
    assert handle.cancel() is True and handle.status() == "running"
    assert queue.hand_back(handle.id, me.worker, 0.0)
    assert handle.status() == "cancelled"
    with pytest.raises(QueuedRunError, match="cancelled while running"):
        handle.result(timeout=1)
    assert queue.claim("default", me, 30.0) == []


@pytest.mark.parametrize("limited", [False, True])
def test_a_cancelled_run_whose_worker_died_is_never_taken_over(
    store: Store, tmp_path: Path, limited: bool
) -> None:
    # guarantee 298: the next worker used to take it over and run its remaining steps
    log = str(tmp_path / "log")
    if limited:  # on PostgreSQL the claim of a limited queue is another path
        set_queue_limits(store, "default", concurrency=5)
    queue = queue_backend(store)
    handle = submit(store, T + "plan", task(log, "cancelled"))
    other = submit(store, T + "plan", task(log, "other"))
    dead = Owner(worker="w-killed", host="elsewhere", pid=2**22 + 7, pid_start=1)
    assert [e.id for e in queue.claim("default", dead, 0.2)] == [handle.id]
    assert handle.cancel() is True
    lease_until = handle.entry().lease_until
    while lease_until is not None and queue.now() <= lease_until:  # the database's clock
        time.sleep(0.05)
    assert _worker(store).run(until_idle=True) == 1
    assert (handle.status(), handle.entry().error) == ("cancelled", "cancelled while running")
    assert other.status() == "done"
    assert {name for name, _ in executions(log)} == {"other"}


def test_a_queue_created_after_a_look_found_none_is_found(tmp_path: Path) -> None:
    # guarantee 268: a long-lived process (the inspector) that once found no queue in the
    # file still reaches the queue another store created since
    from stepstone.durable._queue import existing_queue

    db = tmp_path / "late.sqlite"
    with Store(db=db) as watching:
        assert existing_queue(watching) is None
        with Store(db=db) as other:
            handle = submit(other, T + "plan", task(str(tmp_path / "log"), "late"), key="late")
        found = existing_queue(watching)
        assert found is not None
        cancel_run(watching, "late", reason="no longer needed")
        assert RunHandle(watching, handle.id).status() == "cancelled"


def test_an_operator_cancel_reaches_the_queue_entry(store: Store, tmp_path: Path) -> None:
    # guarantee 268: before, `stepstone cancel` marked the checkpoint failed, the entry
    # stayed running, and the next worker took the run over and finished it
    log = str(tmp_path / "log")
    Path(log + ".down").touch()
    queue = queue_backend(store)
    handle = submit(store, T + "flaky_plan", task(log, "job"), key="job")
    waiting = submit(store, T + "plan", task(log, "waiting"), key="waiting")
    dead = Owner(worker="w-killed", host="elsewhere", pid=2**22 + 7, pid_start=1)
    assert [e.id for e in queue.claim("default", dead, 0.2)] == [handle.id]
    # what the dead worker left: its first step committed, the second failed
    flaky = targets.flaky_plan
    assert not Agent(engine=Plan(*flaky.steps, store=store, checkpoint_key="job"))(
        task(log, "job")
    ).ok
    Path(log + ".down").unlink()
    said = cancel_run(store, "job", reason="wrong input")
    assert said.startswith("cancelled (failed run, no live owner): marked failed")
    assert f"its queue entry {handle.id} is marked cancelled" in said
    said = cancel_run(store, "waiting")  # queued, no checkpoint yet
    assert said == (
        f"no run under 'waiting' yet; its queue entry {waiting.id} is cancelled: "
        "no worker starts it"
    )
    with pytest.raises(KeyError, match="no run under key 'nothing'"):
        cancel_run(store, "nothing")
    lease_until = handle.entry().lease_until
    while lease_until is not None and queue.now() <= lease_until:  # the database's clock
        time.sleep(0.05)
    assert _worker(store).run(until_idle=True) == 0
    assert (handle.status(), waiting.status()) == ("cancelled", "cancelled")
    assert executions(log) == {("job", 0): [os.getpid()]}  # nothing ran after the cancel


def test_queue_concurrency_limit_holds_across_workers(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    set_queue_limits(store, "default", concurrency=1)
    handles = [submit(store, T + "plan", task(log, f"r{i}", sleep=0.01)) for i in range(4)]
    workers = [_worker(store, concurrency=4) for _ in range(2)]
    threads = [threading.Thread(target=w.run, kwargs={"until_idle": True}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for h in handles:
        h.result(timeout=60)
    # one run at a time: each run's steps are contiguous in the log  # guarantee 236
    names = [line.split()[0] for line in Path(log).read_text().splitlines()]
    runs_seen = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert len(runs_seen) == 4


def test_queue_rate_limit_spaces_starts(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    set_queue_limits(store, "default", rate=2)
    handles = [submit(store, T + "make_plan", task(log, f"r{i}")) for i in range(6)]
    t0 = time.monotonic()
    _worker(store, concurrency=6).run(until_idle=False, max_runs=6)
    for h in handles:
        assert h.result(timeout=30).ok
    # 6 starts at 2 per second need at least two full windows after the first two
    assert time.monotonic() - t0 >= 2.0  # guarantee 237


@pytest.mark.parametrize(("rate", "runs"), [(0.5, 3), (2.5, 7)])
def test_a_rate_below_one_or_fractional_holds_on_average(
    store: Store, tmp_path: Path, rate: float, runs: int
) -> None:
    # guarantee 297: 0.5/s started one run a second and 2.5/s three: the window was one
    # second whatever the rate. Judged by the start times the queue records (the
    # database's clock), never by how long the test took.
    log = str(tmp_path / "log")
    set_queue_limits(store, "default", rate=rate)
    handles = [submit(store, T + "make_plan", task(log, f"r{i}")) for i in range(runs)]
    assert _worker(store, concurrency=runs).run(max_runs=runs) == runs
    starts = sorted(float(h.entry().started_at or 0) for h in handles)
    most = math.ceil(rate)  # starts allowed in any window of most / rate seconds
    gaps = [later - first for first, later in zip(starts, starts[most:], strict=False)]
    assert min(gaps) >= most / rate - 1e-3


def test_submit_errors_name_the_fix(store: Store) -> None:
    with pytest.raises(PlanCompileError, match="needs a store the workers share"):
        targets.plan.submit("t")  # the plan has no store= of its own
    with pytest.raises(QueuedRunError, match="no queued run 'nope'"):
        RunHandle(store, "nope").status()
    with pytest.raises(UserError, match="max_attempts"):
        submit(store, T + "plan", "t", max_attempts=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delay": float("nan")}, "delay must be a finite number of seconds >= 0"),
        ({"not_before": "tomorrow"}, "not_before must be a unix time"),
        ({"not_before": float("inf")}, "not_before must be a unix time"),
        ({"priority": 10**30}, r"\|priority\| < 2\*\*31, got 1000000000000000000000000"),
        ({"priority": 2**31}, r"priority must be an int with \|priority\| < 2\*\*31"),
        ({"priority": -(2**31) - 1}, r"\|priority\| < 2\*\*31, got -2147483649"),
        ({"max_attempts": 2**31}, r"1 <= max_attempts < 2\*\*31, got 2147483648"),
        ({"max_attempts": 10**30}, r"1 <= max_attempts < 2\*\*31"),
        ({"key": "a\ud800"}, "key must be a non-empty str without NUL characters or lone surr"),
        ({"dedupe_key": "\udfff"}, "dedupe_key must be a non-empty str without NUL"),
        ({"queue": "q\ud800"}, "queue must be a non-empty str without NUL"),
        ({"key": "a\0b"}, "key must be a non-empty str without NUL"),
        ({"queue": "q\0"}, "queue must be a non-empty str without NUL"),
        ({"dedupe_key": ""}, "dedupe_key must be a non-empty str"),
        ({"task": None}, "task must be a str, an Envelope"),
        ({"task": {"order": "o-1"}}, "task must be a str, an Envelope"),
    ],
)
def test_submit_refuses_what_no_worker_could_run(
    store: Store, options: dict[str, object], message: str
) -> None:
    # guarantee 230, 299: refused at submit, naming the value, before anything is queued
    # (a datetime as text was stored and never ran; NaN and huge numbers were raw errors,
    # and so were a priority or max_attempts that PostgreSQL's INTEGER cannot hold, and a
    # key with a lone surrogate on SQLite)
    options = dict(options)  # the same dict serves every store's run
    task = options.pop("task", "t")
    with pytest.raises(UserError, match=message):
        submit(store, T + "plan", task, **options)  # type: ignore[arg-type]
    assert queue_backend(store).entries(None, None) == []


def test_not_before_takes_a_datetime(store: Store) -> None:
    from datetime import datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=1)
    handle = submit(store, T + "plan", "t", not_before=later)
    entry = queue_backend(store).get(handle.id)
    assert entry is not None and abs(entry.not_before - later.timestamp()) < 1e-3
    assert handle.status() == "queued"


def test_worker_arguments_are_checked(store: Store) -> None:
    with pytest.raises(UserError, match="concurrency"):
        Worker(store, concurrency=0)
    with pytest.raises(UserError, match="queues"):
        Worker(store, queues=[])
    with pytest.raises(UserError, match="can share"):
        Worker(Store())
    with pytest.raises(UserError, match="priority"):
        submit(store, T + "plan", "t", priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="rate must be a finite number of runs per second > 0"):
        set_queue_limits(store, "default", rate=0)
    with pytest.raises(UserError, match="concurrency must be an int"):
        set_queue_limits(store, "default", concurrency=0)
    # guarantee 299: PostgreSQL keeps a queue's concurrency in a 32-bit INTEGER
    with pytest.raises(UserError, match=r"1 <= concurrency < 2\*\*31, got 2147483648"):
        set_queue_limits(store, "default", concurrency=2**31)
    with pytest.raises(UserError, match=r"1 <= concurrency < 2\*\*31"):
        set_queue_limits(store, "default", concurrency=10**30)


@pytest.mark.parametrize("target", [5, None, True, 0, (), " : ", "a\0:b", "pkg.:plan"])
def test_submit_refuses_a_target_that_is_no_engine(tmp_path: Path, target: object) -> None:
    # guarantee 299: an int, None or () was queued under the name of whatever module
    # constant happened to be the same object; a path of no Python names was queued too
    with Store(db=tmp_path / "q.sqlite") as store:
        message = "is not an import path" if isinstance(target, str) else "target must be a Plan"
        with pytest.raises(UserError, match=message):
            submit(store, target, "t")
        assert queue_backend(store).entries(None, None) == []


@pytest.mark.timeout(60)  # NaN and a poll of 0 made result() wait (spinning) forever
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": float("nan")}, "timeout must be a finite number of seconds, got nan"),
        ({"timeout": "1"}, "timeout must be a finite number of seconds, got '1'"),
        ({"poll": -1}, "poll must be a finite number of seconds > 0, got -1"),
        ({"poll": 0}, "poll must be a finite number of seconds > 0, got 0"),
    ],
)
def test_result_refuses_a_wait_it_cannot_keep(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    # guarantee 299
    with Store(db=tmp_path / "q.sqlite") as store:
        handle = submit(store, T + "plan", "t")
        with pytest.raises(UserError, match=message):
            handle.result(**options)  # type: ignore[arg-type]
        with pytest.raises(UserError, match=message):
            asyncio.run(handle.aresult(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate": "5"}, "rate must be a finite number of runs per second > 0, got '5'"),
        ({"rate": True}, "rate must be a finite number of runs per second > 0, got True"),
        ({"rate": float("inf")}, "rate must be a finite number of runs per second > 0"),
    ],
)
def test_queue_limits_refuse_what_is_no_limit(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    # guarantee 299
    with Store(db=tmp_path / "q.sqlite") as store, pytest.raises(UserError, match=message):
        set_queue_limits(store, "default", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"poll_interval": "1"}, "poll_interval must be a finite number of seconds > 0"),
        ({"poll_interval": float("nan")}, "poll_interval must be a finite number of sec"),
        ({"registry": 5}, r"registry must map targets to engines, e.g. registry=\{"),
        ({"shutdown_timeout": "x"}, "shutdown_timeout must be a finite number of seconds >= 0"),
        ({"shutdown_timeout": -1}, "shutdown_timeout must be a finite number of seconds >= 0"),
        ({"shutdown_timeout": float("nan")}, "shutdown_timeout must be a finite number"),
        ({"queues": ["a\0"]}, "a name in queues must be a non-empty str without NUL"),
        ({"name": 5}, "name must be a non-empty str"),
    ],
)
def test_worker_refuses_arguments_it_cannot_work_with(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    # guarantee 299: raw TypeErrors and ValueErrors before, or accepted (a NaN poll
    # interval made the worker spin)
    with Store(db=tmp_path / "q.sqlite") as store, pytest.raises(UserError, match=message):
        Worker(store, **options)  # type: ignore[arg-type]


def test_worker_run_refuses_a_max_runs_that_is_no_count(tmp_path: Path) -> None:
    # guarantee 299: a raw TypeError before
    with (
        Store(db=tmp_path / "q.sqlite") as store,
        pytest.raises(UserError, match="max_runs must be an int with 1 <= max_runs < 2"),
    ):
        Worker(store).run(max_runs="2")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "damage",
    [
        "priority = 'zz'",  # a number that is not one
        "created_at = ''",
        "task = CAST(X'7B22FF22' AS TEXT)",  # bytes that are not UTF-8
    ],
)
def test_a_corrupt_queue_entry_fails_alone_and_never_stops_a_worker(
    tmp_path: Path, damage: str
) -> None:
    """guarantee 131, 234: a queue entry a damaged byte made unreadable is marked failed,
    naming it; the worker goes on and runs the others (it used to die on it, and every
    worker after it: the entry blocked its queue)."""
    import sqlite3

    log = str(tmp_path / "log")
    with Store(db=tmp_path / "q.sqlite") as store:
        bad = submit(store, T + "plan", task(log, "bad"))
        good = submit(store, T + "plan", task(log, "good"))
        conn = sqlite3.connect(tmp_path / "q.sqlite")
        conn.execute(f"UPDATE stepstone_queue SET {damage} WHERE id = ?", (bad.id,))
        conn.commit()
        conn.close()
        assert _worker(store).run(until_idle=True) == 1
        assert good.status() == "done"
        status, error = _stored_outcome(tmp_path / "q.sqlite", bad.id)
        assert status == "failed" and f"queue entry '{bad.id}' is corrupt" in error
    assert {name for name, _ in executions(log)} == {"good"}


def test_a_queued_task_a_damaged_byte_changed_is_never_run(tmp_path: Path) -> None:
    """guarantee 234, 353: the entry's task still decodes (one letter of a name changed in
    the file), so only its checksum tells; it is marked failed, naming it, and the worker
    runs the others."""

    from tests.store.damage import flip, settle

    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        bad = submit(store, T + "plan", task(log, "bad-entry-7"))
        good = submit(store, T + "plan", task(log, "good"))
    settle(db)
    flip(db, b"bad-entry-7", at=1)
    with Store(db=db) as store:
        assert _worker(store).run(until_idle=True) == 1
        assert good.status() == "done"
    status, error = _stored_outcome(db, bad.id)
    assert status == "failed" and f"queue entry '{bad.id}' is corrupt" in error
    assert "checksum" in error
    assert {name for name, _ in executions(log)} == {"good"}


def test_a_queue_table_without_checksums_gains_the_column_and_its_entries_still_run(
    tmp_path: Path,
) -> None:
    """guarantee 353: entries of a queue an older stepstone made (no ``crc`` column) run as
    before; entries submitted afterwards carry a checksum."""
    import sqlite3

    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        old = submit(store, T + "plan", task(log, "old"))
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER stepstone_queue_crc")  # the table as an older stepstone made it
    conn.execute("ALTER TABLE stepstone_queue DROP COLUMN crc")
    conn.commit()
    conn.close()
    with Store(db=db) as store:
        new = submit(store, T + "plan", task(log, "new"))
        assert _worker(store).run(until_idle=True) == 2
        assert old.status() == new.status() == "done"
    conn = sqlite3.connect(db)
    crcs = dict(conn.execute("SELECT id, crc FROM stepstone_queue").fetchall())
    conn.close()
    assert crcs[old.id] is None and isinstance(crcs[new.id], int)
    assert {name for name, _ in executions(log)} == {"old", "new"}


def test_a_damaged_queue_trigger_is_found_when_the_queue_opens(tmp_path: Path) -> None:
    """guarantee 353: a byte changed in the text of the queue's checksum trigger is a
    StoreDamagedError naming it, not a bare error on the next claim."""
    from stepstone import StoreDamagedError
    from tests.store.damage import flip, settle

    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        submit(store, T + "plan", task(str(tmp_path / "log"), "x"))
    settle(db)
    flip(db, b"stepstone_queue SET crc = NULL", at=len("stepstone_queue SET crc = NUL"), to=b"M")
    with Store(db=db) as store, pytest.raises(StoreDamagedError, match="stepstone_queue_crc"):
        _worker(store).run(until_idle=True)


def test_a_damaged_entry_held_by_a_dead_worker_never_stops_a_worker_starting(
    tmp_path: Path,
) -> None:
    """guarantee 234, 353: a worker starting on a host where a dead worker held an entry
    that a damaged byte changed looks past it (it cannot end a lease it cannot read); the
    entry is marked failed once its lease runs out, and the others run."""

    from stepstone.core._ids import host_id
    from stepstone.durable._queue import queue_backend
    from stepstone.store._queue_base import Owner
    from tests.store.damage import flip, settle

    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        bad = submit(store, T + "plan", task(log, "bad-entry-9"))
        dead = Owner(worker="w-dead", host=host_id(), pid=2**22 + 7, pid_start=1)
        (taken,) = queue_backend(store).claim("default", dead, 0.2)
        assert taken.id == bad.id
        good = submit(store, T + "plan", task(log, "good"))
    settle(db)
    flip(db, b"bad-entry-9", at=1)
    time.sleep(0.3)  # the dead worker's lease runs out
    with Store(db=db) as store:
        assert _worker(store).run(until_idle=True) == 1
        assert good.status() == "done"
    status, error = _stored_outcome(db, bad.id)
    assert status == "failed" and "checksum" in error
    assert {name for name, _ in executions(log)} == {"good"}


def test_a_result_a_damaged_byte_changed_is_never_handed_back(tmp_path: Path) -> None:
    """guarantee 234, 353: a finished run's stored result carries its entry's checksum; a
    byte changed in it makes reading the entry a CorruptRecordError naming it, where it
    used to hand back another result."""
    from stepstone import CorruptRecordError
    from tests.store.damage import flip, settle

    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        handle = submit(store, T + "tool_agent", "hello-result-7")
        sound = submit(store, T + "tool_agent", "other")
        assert _worker(store).run(until_idle=True) == 2
        assert handle.result(timeout=5).payload == "HELLO-RESULT-7"
    settle(db)
    flip(db, b"HELLO-RESULT-7", at=1, to=b"A")  # HELLO -> HALLO: still a valid envelope
    with Store(db=db) as store:
        with pytest.raises(CorruptRecordError, match=f"queue entry '{handle.id}' is corrupt"):
            handle.result(timeout=5)
        assert sound.result(timeout=5).payload == "OTHER"


def test_an_entry_whose_id_index_a_damaged_byte_changed_never_stops_a_worker(
    tmp_path: Path,
) -> None:
    """guarantee 234: a damaged byte in the index of entry ids (the row itself sound) used
    to make the claim that found the entry lose it again and raise a TypeError out of the
    worker; the claim addresses rows by their row id."""
    import sqlite3

    from tests.store.damage import settle

    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    with Store(db=db) as store:
        first = submit(store, T + "plan", task(log, "first"))
        second = submit(store, T + "plan", task(log, "second"))
    settle(db)
    conn = sqlite3.connect(db)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    (root,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'stepstone_queue' "
        "AND sql IS NULL AND name LIKE 'sqlite_autoindex_stepstone_queue_%' ORDER BY name"
    ).fetchone()  # the UNIQUE index of ids
    conn.close()
    data = bytearray(db.read_bytes())
    page = data[(root - 1) * page_size : root * page_size]
    # the last character of the index's copy of the id only: the index keeps its order, so
    # a lookup of the other entry's id still finds it (a changed first character could sort
    # this copy past it, and then no lookup through the index would find that one)
    at = page.index(first.id.encode()) + len(first.id) - 1 + (root - 1) * page_size
    data[at] ^= 0x01
    db.write_bytes(bytes(data))
    with Store(db=db) as store:
        _worker(store).run(until_idle=True)
        assert second.status() == "done"
    assert ("second", 0) in executions(log)


def test_a_damaged_queue_table_definition_is_named_at_once(tmp_path: Path) -> None:
    """guarantee 234: a byte changed in the queue table's definition (a column renamed)
    is a StoreDamagedError naming the columns, not a bare "no such column" on each claim."""
    from stepstone import StoreDamagedError
    from tests.store.damage import flip, settle

    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        submit(store, T + "plan", task(str(tmp_path / "log"), "x"))
    settle(db)
    # the queue's started_at -> startad_at (journal rows have a started_at too)
    flip(db, b"started_at REAL,\n    cancel_requested", at=5, to=b"a")
    with Store(db=db) as store, pytest.raises(StoreDamagedError, match="startad_at"):
        _worker(store).run(until_idle=True)


def test_a_worker_run_until_idle_on_a_damaged_queue_ends_with_the_damage(
    tmp_path: Path,
) -> None:
    """guarantee 234: a claim a damaged file refuses is retried less often each time; with
    until_idle, the worker stops with the StoreDamagedError once none of its runs is left,
    instead of retrying (and logging) forever."""
    import sqlite3

    from stepstone import StoreDamagedError
    from tests.store.damage import damage_page, settle

    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        submit(store, T + "plan", task(str(tmp_path / "log"), "x"))
    settle(db)
    conn = sqlite3.connect(db)
    (root,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'stepstone_queue_pick'"
    ).fetchone()
    conn.close()
    damage_page(db, root)
    with Store(db=db) as store, pytest.raises(StoreDamagedError, match="is damaged"):
        _worker(store).run(until_idle=True)


def test_a_worker_refuses_a_store_it_cannot_write(tmp_path: Path) -> None:
    # guarantee 234: a worker on a closed or read-only store took nothing (until_idle
    # returned 0 with runs queued) or handed every run back every few seconds, forever
    db = tmp_path / "w.sqlite"
    store = Store(db=db)
    submit(store, T + "plan", "t")
    with (
        Store(db=db, read_only=True) as reader,
        pytest.raises(UserError, match="is opened read_only=True: pass an open, writable"),
    ):
        Worker(reader)
    store.close()
    with pytest.raises(UserError, match="is closed: pass an open, writable Store"):
        Worker(store)
    with Store(db=db) as again:
        assert Worker(again, poll_interval=0.05).run(until_idle=True) == 1
