"""Time and messages inside a durable run: ``sleep``, ``sleep_until``, ``recv``,
``set_event`` and ``write_stream``.

Each is an operation of the run's operation journal (:mod:`._operations`), at its position
in the code, so a resumed run replays it instead of doing it again:

* ``sleep`` records its wake time (the database's clock) in its intent, committed with the
  run's timer before it waits; a resumed run waits only what is left, and once past it, not
  again. Its outcome is "woke at T";
* ``recv`` waits for the next message on a topic (or its timeout, a durable timer), and
  consumes the message in the same commit that records its outcome: a replay returns the
  same message, which is never delivered twice;
* ``set_event`` and ``write_stream`` from a workflow's body are journaled with the value
  they write, in one commit: exactly once.

Where they journal:

* in a workflow's body (and the tasks it starts): the workflow's own journal;
* in a Plan step or a graph node: a journal of the step execution's own, a run of internal
  kind ``step-ops`` under ``"<the step's idempotency key>:ops"``, claimed on the first such
  call and released when the step returns; the step is re-run whole after a crash and its
  operations replay from there. ``set_event`` there is a plain write (last write wins);
* in a workflow's ``@step``: ``set_event`` and ``write_stream`` are plain writes (a step
  that runs again after a crash may write again: each stream value carries the step's
  attempt); ``sleep`` and ``recv`` are refused (do them in the body, where they are
  journaled).

Either way, messages, events and streams are those of the run the code belongs to: the
workflow's key, the Plan's checkpoint key, the graph's correlation id.

Waiting happens in the process (woken by the store's change feed) unless the run is on a
worker and waits longer than the worker's ``park_after``: then :class:`RunParked` gives the
worker's slot back (:mod:`._waiting`), and the run resumes into the same wait later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any

from stepstone.core._serialization import from_typed_json
from stepstone.core._threads import to_thread
from stepstone.durable._effects import DurableScope, current_scope
from stepstone.durable._kernel import aclaim_run
from stepstone.durable._messages import check_name, encode_value
from stepstone.durable._operations import (
    LAZY_COMMIT_DELAY,
    Call,
    Entry,
    OperationJournal,
    Outcome,
    load_entries,
)
from stepstone.durable._queue import check_number
from stepstone.durable._records import blocking_call
from stepstone.durable._waiting import Parking, parking
from stepstone.exceptions import (
    ConfigurationError,
    ConfigurationTypeError,
    RunCancelledError,
    RunParked,
    UserError,
)
from stepstone.store._changes import run_topic
from stepstone.store._extras import ExtraWrites, Message, Timer
from stepstone.store._store import Store

__all__ = [
    "STEP_OPS_KIND",
    "recv",
    "set_event",
    "sleep",
    "sleep_until",
    "write_stream",
]

#: The kind of a step execution's own operation journal (an internal record).
STEP_OPS_KIND = "step-ops"


@dataclasses.dataclass(frozen=True, slots=True)
class _Where:
    """Where a time or message operation journals, and whose records it touches."""

    journal: OperationJournal
    address: str

    @property
    def store(self) -> Store:
        return self.journal.store

    def timer_name(self, pos: str) -> str:
        """A timer's name: its position (in a step's own journal, with that journal's key,
        so two steps' timers under one run never share a name)."""
        return pos if self.journal.key == self.address else f"{self.journal.key}@{pos}"


def _outside(what: str) -> UserError:
    return UserError(
        f"stepstone.{what} works inside a durable run: a workflow's body, or a step of a "
        "Plan or graph that has a store; outside one there is no run to journal it in"
    )


def _in_step(what: str) -> UserError:
    return UserError(
        f"stepstone.{what} inside a workflow's @step is refused: a step runs again whole "
        f"after a crash, so it would not be durable there. Call it in the workflow's body, "
        "between steps, where it is journaled"
    )


async def _where(what: str) -> _Where | None:
    """The journal and address of the calling code, claiming a step execution's own
    journal on its first operation; None outside any durable run.

    Raises:
        UserError: inside a workflow's ``@step`` (refused there).
    """
    scope = current_scope()
    if scope is None:
        return None
    address = scope.run_address
    if scope.journal is not None and address is not None:
        return _Where(scope.journal, address)
    if scope.attempt is not None:
        raise _in_step(what)
    if address is None:
        return None
    if scope._ops:
        journal: OperationJournal = scope._ops[0]
        return _Where(journal, address)
    journal = await _step_journal(scope)
    return _Where(journal, address)


async def _step_journal(scope: DurableScope) -> OperationJournal:
    """Claim the operation journal of the step execution ``scope`` stands for (resumed, with
    what it recorded, when the step runs again after a crash) and number the calling task's
    operations from 0; released when the step's scope is left."""
    store = scope.store
    key = f"{scope.key}:ops"
    claimed = await aclaim_run(store, key, kind=STEP_OPS_KIND, resume=True, first_step=None)
    run = claimed.run
    if run is None:  # (a step's journal is never finished: released, it is taken again)
        raise UserError(f"the operations journal {key!r} of a step has ended; it cannot be reused")
    entries = None
    if claimed.outcome == "resumed":
        rows = await run.ajournal()
        entries, _ = load_entries(key, rows)
    journal = OperationJournal(run, entries, what=f"step {scope.key!r}")
    token = journal.enter()

    def close() -> None:
        journal.leave(token)
        journal.closed = True
        run.release()

    scope._ops[:] = [journal, close]
    return journal


def _clock(store: Store) -> float:
    return store.backend.clock()


async def _wait(
    where: _Where,
    *,
    wake_at: float | None,
    topic: str | None,
    look: Callable[[], Any] | None,
) -> Any:
    """Wait in this process until ``look()`` finds something (returned), or the database's
    clock reaches ``wake_at`` (None returned; None: no time limit).

    On a worker, a wait longer than its ``park_after`` raises :class:`RunParked` (a receive
    first waits ``park_after`` seconds here), and each look also asks the worker whether the
    run's cancel was requested. A cancel of the run by an operator (``stepstone cancel``)
    stops the wait at once too.

    Raises:
        RunParked: a worker gives its slot back until the wake time or a message.
        RunCancelledError: an operator cancelled the run meanwhile.
    """
    store = where.store
    backend = store.backend
    park = parking()
    started = time.monotonic()
    with backend.changes().subscribe([run_topic(where.address)]) as sub:
        while True:
            if look is not None:
                found = await blocking_call(store, look)
                if found is not None:
                    return found
            now = await blocking_call(store, _clock, store)
            left = None if wake_at is None else wake_at - now
            if left is not None and left <= 0:
                return None
            await _stop_if_cancelled(where)
            waited = time.monotonic() - started
            # A receive looks at every poll; a plain sleep, which only a cancel (or a change
            # of its run: a notification) can end early, at least a second apart.
            every = sub.feed.poll if topic is not None else max(sub.feed.poll, _SLEEP_LOOK)
            step = every if left is None else min(left, every)
            if park is not None:
                step = await _park_if_long(where, park, wake_at, topic, left, waited, step)
            until = time.monotonic() + step
            while not await sub.await_change(max(0.0, until - time.monotonic())):
                if time.monotonic() >= until:
                    break


async def _stop_if_cancelled(where: _Where) -> None:
    """Raise RunCancelledError when an operator asked to cancel the waiting run."""
    store = where.store
    run = where.journal.run
    head = await blocking_call(store, store.backend.run_get, where.address)
    if head is None or not head.meta.get("cancel_requested"):
        return
    if head.key != run.key:  # a step's own journal: the step stops here
        raise RunCancelledError(f"run {where.address!r} was cancelled while a step of it waited")
    if head.run_uid == run.run_uid:
        # the cancel's own flow: a commit that finds it commits the run failed
        # with RunCancelledError and raises it (the journal then writes no more)
        await where.journal.commit_now()


async def _park_if_long(
    where: _Where,
    park: Parking,
    wake_at: float | None,
    topic: str | None,
    left: float | None,
    waited: float,
    step: float,
) -> float:
    """On a worker: raise RunParked when the wait (``left`` seconds; None: no limit) is
    longer than its ``park_after`` (a receive first waits that long here); else how long
    to wait before the next look (``step`` at most)."""
    await to_thread(park.check)  # the worker stops the run at once if cancelled
    long = left is None or left > park.after
    if long and (topic is None or waited >= park.after):
        raise RunParked(where.address, wake_at, () if topic is None else (topic,))
    if topic is not None:
        step = min(step, max(0.0, park.after - waited))
    return step


#: The longest a sleep waits between two looks at its run (seconds): how soon an
#: operator's cancel reaches a sleeping run that is not on a worker.
_SLEEP_LOOK = 1.0


async def sleep(seconds: float) -> None:
    """Sleep ``seconds`` durably: the wake time is recorded (the database's clock) before
    the run sleeps, so a run resumed after a crash sleeps only what is left, and never
    again once past it. On a worker, a sleep longer than its ``park_after`` gives the
    worker's slot back until the wake time. Outside a durable run, a plain
    :func:`asyncio.sleep`.

    Raises:
        ConfigurationError: ``seconds`` is not a finite number >= 0.
        UserError: called inside a workflow's ``@step``.
    """
    seconds = check_number("seconds", seconds, 0)
    where = await _where("sleep")
    if where is None:
        await asyncio.sleep(seconds)
        return
    await _timer(where, lambda now: now + seconds)


async def sleep_until(when: datetime | float) -> None:
    """Sleep durably until ``when`` (an aware ``datetime``, or a unix time on the
    database's clock); as :func:`sleep`. A time already past returns at once.

    Raises:
        ConfigurationError: ``when`` is a naive datetime, or not a time.
    """
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ConfigurationError(
                f"sleep_until needs an aware datetime (with a time zone), got {when!r}: "
                "use datetime(..., tzinfo=UTC) or .astimezone()"
            )
        at = when.timestamp()
    elif isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        raise ConfigurationTypeError(
            f"sleep_until takes an aware datetime (datetime(..., tzinfo=UTC)) or a unix "
            f"time in seconds (time.time() + 60), got {when!r:.80}"
        )
    else:
        at = float(when)
    where = await _where("sleep_until")
    if where is None:
        await asyncio.sleep(max(0.0, at - time.time()))
        return
    await _timer(where, lambda now: at)


async def _timer(where: _Where, wake: Callable[[float], float]) -> None:
    journal = where.journal
    pos, found = journal.lookup("sleep", "sleep", None, check_args=False)
    if found is not None and found.outcome is not None:
        journal.recorded_value(found, _same)
        return
    now = await blocking_call(where.store, _clock, where.store)
    wake_at = _noted_wake(found, wake(now))
    name = where.timer_name(pos)
    if found is not None and wake_at is not None and wake_at <= now:
        # Back after its wake time (a parked run a worker took again, a run resumed after
        # a crash): over without another intent or wait. In a body, the outcome goes with
        # the run's next commit: a crash before it finds the intent again, past its time.
        cleared = ExtraWrites(key=where.address, clear_timers=(name,))
        mark = journal.conclude(pos, found, {"woke_at": now, "wake_at": wake_at}, cleared)
        if journal.key == where.address:
            journal.soon(LAZY_COMMIT_DELAY)
        else:  # a step's own journal is released when the step returns: commit it now
            await journal.commit(mark)
        return
    timer = Timer(run_key=where.address, name=name, wake_at=wake_at, topic=None, since=now)
    journal.add_extras(ExtraWrites(key=where.address, timers=(timer,)))

    async def invoke(call: Call) -> Outcome:
        until = call.note["wake_at"] if isinstance(call.note, dict) else wake_at
        await _wait(where, wake_at=until, topic=None, look=None)
        woke = await blocking_call(where.store, _clock, where.store)
        cleared = ExtraWrites(key=where.address, clear_timers=(name,))
        return Outcome.of({"woke_at": woke, "wake_at": until}, None, extras=cleared)

    await journal.operation(
        "sleep",
        "sleep",
        None,
        invoke,
        check_args=False,
        note={"wake_at": wake_at},
        position=pos,
        found=found,
    )


def _noted_wake(found: Entry | None, default: float | None) -> float | None:
    """The wake time the first attempt of a wait recorded (a re-run after a crash keeps
    it), else ``default``."""
    if found is not None:
        note = found.intent.get("note")
        if isinstance(note, dict) and "wake_at" in note:
            value = note["wake_at"]
            return None if value is None else float(value)
    return default


def _same(value: Any) -> Any:
    return value


#: Receives of one run and topic take turns (two at once would pick the same message).
_RECV_LOCKS: weakref.WeakKeyDictionary[OperationJournal, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _decode_received(data: Any) -> Any:
    if isinstance(data, dict) and "message" in data:
        return from_typed_json(data["message"])
    return None


async def recv(topic: str, timeout: float | None = None) -> Any:
    """The next message sent to this run on ``topic`` (in send order), or None when
    ``timeout`` seconds pass first (a durable timer; None: no time limit).

    The message is consumed in the same commit that records it as this call's outcome: a
    run resumed after a crash gets the same message again from its journal, and it is
    never delivered twice. On a worker, a wait longer than its ``park_after`` gives the
    worker's slot back until a message arrives or the timeout.

    Raises:
        UserError: outside a durable run, or inside a workflow's ``@step``.
        ConfigurationError: a bad topic or timeout.
    """
    check_name("topic", topic)
    if timeout is not None:
        timeout = check_number("timeout", timeout, 0)
    where = await _where("recv")
    if where is None:
        raise _outside("recv")
    journal = where.journal
    pos, found = journal.lookup("recv", topic, None, check_args=False)
    if found is not None and found.outcome is not None:
        return journal.recorded_value(found, _decode_received)
    store, address = where.store, where.address
    now = await blocking_call(store, _clock, store)
    wake_at = _noted_wake(found, None if timeout is None else now + timeout)
    name = where.timer_name(pos)
    lock = _RECV_LOCKS.setdefault(journal, {}).setdefault(topic, asyncio.Lock())
    backend = store.backend
    if found is not None:
        # Back at a receive that was waiting (a parked run a worker took again, a run
        # resumed after a crash): a message already there, or a timeout already past, is
        # its outcome at once, without another intent.
        async with lock:
            pending = await blocking_call(store, backend.message_next, address, topic)
            cleared = ExtraWrites(key=address, clear_timers=(name,))
            if pending is not None:
                data = json.loads(pending.data)
                taken = dataclasses.replace(cleared, consume=(pending.id,))
                mark = journal.conclude(pos, found, {"message": data, "id": pending.id}, taken)
                await journal.commit(mark)
                return from_typed_json(data)
            if wake_at is not None and wake_at <= now:
                await journal.commit(journal.conclude(pos, found, {"timeout": True}, cleared))
                return None
    timer = Timer(run_key=address, name=name, wake_at=wake_at, topic=topic, since=now)
    journal.add_extras(ExtraWrites(key=address, timers=(timer,)))

    async def invoke(call: Call) -> Outcome:
        until = wake_at
        if isinstance(call.note, dict) and "wake_at" in call.note:
            until = call.note["wake_at"]
        async with lock:
            found_msg: Message | None = await _wait(
                where,
                wake_at=until,
                topic=topic,
                look=lambda: backend.message_next(address, topic),
            )
            if found_msg is None:
                cleared = ExtraWrites(key=address, clear_timers=(name,))
                return Outcome.of({"timeout": True}, None, extras=cleared)
            data = json.loads(found_msg.data)
            taken = ExtraWrites(key=address, consume=(found_msg.id,), clear_timers=(name,))
            return Outcome.of(
                {"message": data, "id": found_msg.id}, from_typed_json(data), extras=taken
            )

    return await journal.operation(
        "recv",
        topic,
        None,
        invoke,
        check_args=False,
        note={"wake_at": wake_at},
        wait=True,  # consumed in the commit of the outcome, before the caller goes on
        decode=_decode_received,
        position=pos,
        found=found,
    )


def set_event(name: str, value: Any) -> None:
    """Set the event ``name`` of this run to ``value`` (last write wins), readable from
    outside with ``RunHandle.get_event``. A plain call (no ``await``).

    In a workflow's body it is journaled (a resumed run does not set it again) and
    committed with the run's next commit, within a turn of the event loop; in a step it is
    written at once.

    Raises:
        UserError: outside a durable run.
        SerializationError: ``value`` cannot be stored.
    """
    check_name("event name", name)
    scope = current_scope()
    address = None if scope is None else scope.run_address
    if scope is None or address is None:
        raise _outside("set_event")
    text = encode_value(value, f"event {name!r} of run {address!r}")
    journal = scope.journal
    if journal is None:
        scope.store.backend.event_set(address, name, text)
        return
    pos, found = journal.lookup("event", name, None, check_args=False)
    if found is not None and found.outcome is not None:
        journal.replayed += 1
        return
    journal.instant(
        pos,
        "event",
        name,
        {"value": json.loads(text)},
        ExtraWrites(key=address, events=((name, text),)),
    )
    journal.soon()


async def write_stream(name: str, value: Any) -> None:
    """Append ``value`` to this run's stream ``name`` (read from outside with
    ``RunHandle.read_stream``).

    From a workflow's body, a Plan step or a graph node it is journaled with the value, in
    one commit: written exactly once, a resumed run does not write it again. From a
    workflow's ``@step`` it is written at once, carrying the step's attempt (a step that
    runs again after a crash may write it again).

    Raises:
        UserError: outside a durable run.
        SerializationError: ``value`` cannot be stored.
    """
    check_name("stream name", name)
    scope = current_scope()
    address = None if scope is None else scope.run_address
    if scope is None or address is None:
        raise _outside("write_stream")
    text = encode_value(value, f"value of stream {name!r} of run {address!r}")
    if scope.journal is None and scope.attempt is not None:  # a workflow step: plain
        await blocking_call(
            scope.store, scope.store.backend.stream_append, address, name, text, scope.attempt
        )
        return
    where = await _where("write_stream")
    assert where is not None
    journal = where.journal
    pos, found = journal.lookup("stream", name, None, check_args=False)
    if found is not None and found.outcome is not None:
        journal.replayed += 1
        return
    mark = journal.instant(
        pos, "stream", name, None, ExtraWrites(key=address, stream=((name, text),))
    )
    await journal.commit(mark)
