"""Messages to runs, and a run's events and streams, from anywhere: the kernel's calls.

``send(store, key, topic, value)`` stores a message for the run under ``key`` (any
process, any host); the run reads it with ``recv``. ``get_event`` reads (or waits for) a
value the run set with ``set_event``; ``read_stream`` follows a stream the run writes with
``write_stream``, from any offset, until the run ends. Values go through the typed JSON
codec (``to_typed_json``): a datetime, a dataclass or a pydantic model comes back as
itself in Python, and as plain JSON to any other reader of the database.

Waiting uses the store's change feed (``store/_changes.py``): at once on the in-memory
store and on PostgreSQL (``LISTEN``/``NOTIFY``), within the poll interval on SQLite for
changes made by another process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from stepstone.core._serialization import dumps, from_typed_json, loads, to_typed_json
from stepstone.core._threads import to_thread
from stepstone.durable._queue import check_number, existing_queue
from stepstone.exceptions import ConfigurationError, ConfigurationTypeError, RunFinishedError
from stepstone.store._changes import Subscription, run_topic
from stepstone.store._extras import StreamEntry
from stepstone.store._queue_base import FINAL_STATUSES, QueueBackend
from stepstone.store._store import Store, check_key

__all__ = [
    "RUN_ENDED",
    "RunOutcome",
    "StreamItem",
    "StreamReader",
    "aevents",
    "aget_event",
    "asend",
    "check_store",
    "decode_value",
    "encode_value",
    "events",
    "get_event",
    "read_stream",
    "run_outcome",
    "send",
]

#: The head statuses after which a run takes no message: it will never receive one.
RUN_ENDED = ("done",)

#: How many stream values one read fetches.
_BATCH = 256


def encode_value(value: Any, where: str) -> str:
    """``value`` as the JSON text a message, an event or a stream value is stored as
    (typed JSON: types JSON cannot hold keep a tag).

    Raises:
        SerializationError: ``value`` cannot be stored, naming ``where``.
    """
    return dumps(to_typed_json(value, where=where, strict=True))


def decode_value(text: str) -> Any:
    """Undo :func:`encode_value`."""
    return from_typed_json(loads(text))


def check_name(what: str, value: Any) -> str:
    """``value`` if it can name a topic, an event or a stream: a non-empty str that a
    store can keep (no NUL character, no lone surrogate)."""
    if not isinstance(value, str):
        raise ConfigurationTypeError(f"{what} must be a non-empty str, got {value!r:.80}")
    if not value:
        raise ConfigurationError(f"{what} must be a non-empty str, got ''")
    try:
        check_key(value, what)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return value


def check_store(store: Any, what: str) -> Store:
    """``store`` if it is a :class:`~stepstone.Store`.

    Raises:
        ConfigurationTypeError: it is not, naming ``what`` took it and how to make one.
    """
    if not isinstance(store, Store):
        raise ConfigurationTypeError(
            f"{what} takes a Store as its first argument (Store(db='app.sqlite') or "
            f"Store(url='postgresql://...')), got {store!r:.80}"
        )
    return store


def _run_key(key: Any) -> str:
    try:
        return check_key(key, "run key")
    except TypeError as exc:
        raise ConfigurationTypeError(str(exc)) from None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def send(store: Store, key: str, topic: str, value: Any) -> int:
    """Send ``value`` to the run under ``key`` on ``topic``; returns the message's id
    (its place in send order).

    The message is stored durably before this returns. A run that does not exist yet
    (not started, or queued) gets it when it receives on ``topic``; messages of a topic
    are received in send order, each exactly once. A run waiting for one wakes at once
    (PostgreSQL, or this process) or within the poll interval (SQLite, another process);
    a worker's run parked waiting for it becomes runnable in the same transaction.

    Raises:
        RunFinishedError: the run under ``key`` finished (``done``): nothing was stored.
        SerializationError: ``value`` cannot be stored (nothing was stored).
        ConfigurationError: ``key`` or ``topic`` is not a non-empty str a store can keep.
    """
    check_store(store, "stepstone.send")
    key = _run_key(key)
    check_name("topic", topic)
    text = encode_value(value, f"the message to {key!r} on topic {topic!r}")
    mid = store.backend.message_send(key, topic, text, refuse=RUN_ENDED)
    if mid is None:
        raise RunFinishedError(
            f"run {key!r} has finished (done): a message on topic {topic!r} would never be "
            "received, so it was not stored. Send it to a run that is still going (check "
            f"`stepstone show {key}`), or start a new run under another key"
        )
    return mid


async def asend(store: Store, key: str, topic: str, value: Any) -> int:
    """Async :func:`send`."""
    return await to_thread(send, store, key, topic, value)


@dataclasses.dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended.

    Attributes:
        status: ``done``, ``failed`` or (a queued run) ``cancelled``.
        error: Why it failed or was cancelled, when it says.
    """

    status: str
    error: str | None = None


class _Ending:
    """Whether the run under ``key`` ended, looked up again each time: through its queue
    entry when it was submitted (the entry's final status), else its head (``done`` or
    ``failed``). A run waiting, parked or paused has not ended."""

    def __init__(self, store: Store, key: str) -> None:
        self.store = store
        self.key = key
        self._queue: QueueBackend | None = None

    def outcome(self) -> RunOutcome | None:
        if self._queue is None:
            self._queue = existing_queue(self.store)  # (a SQLite file may get one later)
        entry = None if self._queue is None else self._queue.latest_entry(self.key)
        if entry is not None:
            if entry.status in FINAL_STATUSES:
                return RunOutcome(entry.status, entry.error)
            return None
        head = self.store.backend.run_get(self.key)
        if head is None or head.status not in ("done", "failed"):
            return None
        error = head.meta.get("error")
        if isinstance(error, dict):
            return RunOutcome(head.status, f"{error.get('type')}: {error.get('message')}")
        return RunOutcome(head.status)


def run_outcome(store: Store, key: str) -> RunOutcome | None:
    """How the run under ``key`` ended, or None while it has not (or does not exist)."""
    return _Ending(check_store(store, "run_outcome"), _run_key(key)).outcome()


def _deadline(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    try:
        return time.monotonic() + check_number("timeout", timeout, 0)
    except ConfigurationError as exc:
        raise type(exc)(f"{exc} (0: look once; None: wait without a limit)") from None


def _poll(poll: float | None, sub: Subscription) -> float:
    return sub.feed.poll if poll is None else check_number("poll", poll, 0, above=True)


def get_event(
    store: Store, key: str, name: str, *, timeout: float | None = 60.0, poll: float | None = None
) -> Any:
    """The value the run under ``key`` last set for the event ``name``.

    When it has none yet, waits up to ``timeout`` seconds (None: until it is set or the
    run ends; 0: one look) and gives None if none came. A run that ended without setting
    it gives None at once; a finished run's last value is given at once.

    Raises:
        ConfigurationError: a bad key, name, timeout or poll interval.
    """
    check_store(store, "get_event")
    key = _run_key(key)
    check_name("event name", name)
    deadline = _deadline(timeout)
    backend = store.backend
    ending = _Ending(store, key)
    with backend.changes().subscribe([run_topic(key)]) as sub:
        every = _poll(poll, sub)
        while True:
            ended = ending.outcome()
            found = backend.event_get(key, name)
            if found is not None:
                return decode_value(found.data)
            if ended is not None:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            sub.wait(every if left is None else min(left, every))


async def aget_event(
    store: Store, key: str, name: str, *, timeout: float | None = 60.0, poll: float | None = None
) -> Any:
    """Async :func:`get_event` (its looks at the store in a worker thread, its waits on
    the event loop)."""
    check_store(store, "aget_event")
    key = _run_key(key)
    check_name("event name", name)
    deadline = _deadline(timeout)
    backend = store.backend
    ending = _Ending(store, key)
    with backend.changes().subscribe([run_topic(key)]) as sub:
        every = _poll(poll, sub)
        while True:
            ended = await to_thread(ending.outcome)
            found = await to_thread(backend.event_get, key, name)
            if found is not None:
                return decode_value(found.data)
            if ended is not None:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            await sub.await_change(every if left is None else min(left, every))


def events(store: Store, key: str) -> dict[str, Any]:
    """Every event the run under ``key`` set, with its last value, by name."""
    check_store(store, "events")
    key = _run_key(key)
    return {e.name: decode_value(e.data) for e in store.backend.events(key)}


async def aevents(store: Store, key: str) -> dict[str, Any]:
    """Async :func:`events`."""
    return await to_thread(events, store, key)


class StreamItem(tuple[int, Any]):
    """One value of a stream: the pair ``(offset, value)``, with two more attributes.

    Attributes:
        attempt: The attempt of the step that wrote it, for a value written from inside a
            step (a step that ran again after a crash may have written a value again, at a
            later offset); None for a value the run's body wrote (journaled: exactly once).
        written_at: When it was stored (the database's clock).
    """

    attempt: int | None
    written_at: float

    def __new__(
        cls, offset: int, value: Any, attempt: int | None = None, written_at: float = 0.0
    ) -> StreamItem:
        item = super().__new__(cls, (offset, value))
        item.attempt = attempt
        item.written_at = written_at
        return item

    @property
    def offset(self) -> int:
        """Its place in the stream (0 for the first value)."""
        return self[0]

    @property
    def value(self) -> Any:
        """The value written."""
        return self[1]

    @classmethod
    def of(cls, entry: StreamEntry) -> StreamItem:
        return cls(entry.offset, decode_value(entry.data), entry.attempt, entry.written_at)


class StreamReader:
    """Follows the stream ``name`` of the run under ``key`` from offset ``start``.

    Iterate it (``for offset, value in reader``, or ``async for``) to get each value as a
    :class:`StreamItem` pair, in offset order. The iteration waits for new values while the
    run goes on, and ends once the run has ended and every value it wrote was read; then
    :attr:`outcome` says how the run ended. To stop early and come back later, break out
    and read again from :attr:`next_offset`.

    Args:
        follow: False reads the values stored now and ends there (:attr:`outcome` then
            says whether the run had ended).
        timeout: The longest wait for a next value (seconds; None: no limit); past it the
            iteration raises TimeoutError (the values read so far were read; go on from
            :attr:`next_offset`).
        poll: How often to look without a notification (default: the store's).

    Attributes:
        next_offset: The offset of the next value to read.
        outcome: None while the run goes on; once the iteration ended because the run
            ended, how (:class:`RunOutcome`).
    """

    def __init__(
        self,
        store: Store,
        key: str,
        name: str,
        start: int = 0,
        *,
        follow: bool = True,
        timeout: float | None = None,
        poll: float | None = None,
    ) -> None:
        self.store = check_store(store, "StreamReader")
        self.key = _run_key(key)
        self.name = check_name("stream name", name)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigurationError(f"start must be an offset (an int >= 0), got {start!r:.80}")
        if timeout is not None:
            check_number("timeout", timeout, 0)
        if poll is not None:
            check_number("poll", poll, 0, above=True)
        self.next_offset = start
        self.follow = follow
        self.timeout = timeout
        self.poll = poll
        self.outcome: RunOutcome | None = None
        self._ending = _Ending(store, self.key)

    def __repr__(self) -> str:
        return f"StreamReader({self.key!r}, {self.name!r}, next_offset={self.next_offset})"

    def _batch(self) -> list[StreamItem]:
        entries = self.store.backend.stream_read(self.key, self.name, self.next_offset, _BATCH)
        return [StreamItem.of(e) for e in entries]

    def _step(self) -> tuple[list[StreamItem], bool]:
        """One look: the values past :attr:`next_offset`, and whether the stream is over
        (the run had ended before they were read, or not following)."""
        ended = self._ending.outcome()  # first: values written before the end are read after
        batch = self._batch()
        if batch or not (ended is not None or not self.follow):
            return batch, False
        self.outcome = ended
        return [], True

    def _wait_left(self, since: float) -> float | None:
        if self.timeout is None:
            return None
        left = since + self.timeout - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"no new value on stream {self.name!r} of run {self.key!r} for "
                f"{self.timeout}s (the run goes on); read again from offset {self.next_offset}"
            )
        return left

    def __iter__(self) -> Iterator[StreamItem]:
        with self.store.backend.changes().subscribe([run_topic(self.key)]) as sub:
            every = _poll(self.poll, sub)
            since = time.monotonic()
            while True:
                batch, over = self._step()
                if over:
                    return
                for item in batch:
                    self.next_offset = item.offset + 1
                    yield item
                if batch:
                    since = time.monotonic()
                    continue
                left = self._wait_left(since)
                sub.wait(every if left is None else min(every, left))

    async def __aiter__(self) -> AsyncIterator[StreamItem]:
        with self.store.backend.changes().subscribe([run_topic(self.key)]) as sub:
            every = _poll(self.poll, sub)
            since = time.monotonic()
            while True:
                batch, over = await to_thread(self._step)
                if over:
                    return
                for item in batch:
                    self.next_offset = item.offset + 1
                    yield item
                if batch:
                    since = time.monotonic()
                    continue
                left = self._wait_left(since)
                await sub.await_change(every if left is None else min(every, left))


def stream_items(store: Store, key: str, name: str, start: int, limit: int) -> list[StreamItem]:
    """Up to ``limit`` values of the stream ``name`` of the run under ``key`` from offset
    ``start`` on, as stored now (no waiting)."""
    return [StreamItem.of(e) for e in store.backend.stream_read(key, name, start, limit)]


def run_known(store: Store, key: str) -> bool:
    """Whether ``key`` holds a run, or a queue entry that will start one."""
    if store.backend.run_get(key) is not None:
        return True
    queue = existing_queue(store)
    return queue is not None and queue.latest_entry(key) is not None


def read_stream(
    store: Store,
    key: str,
    name: str,
    start: int = 0,
    *,
    follow: bool = True,
    timeout: float | None = None,
    poll: float | None = None,
) -> StreamReader:
    """A :class:`StreamReader` of the stream ``name`` of the run under ``key``, from
    offset ``start`` (inclusive)."""
    return StreamReader(store, key, name, start, follow=follow, timeout=timeout, poll=poll)
