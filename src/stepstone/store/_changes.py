"""Telling waiters that a run's records (or a queue) changed: one abstraction, three ways.

A waiter (a ``get_event`` waiting for a value, a stream reader following a stream, a run
waiting for a message, a worker waiting for a parked run to become runnable) subscribes to
*topics* (:func:`run_topic`, :func:`queue_topic`), then looks at the store, then waits on
its :class:`Subscription` and looks again, until it finds what it waits for. A wait returns
early when a topic it subscribed to was touched, and at the latest after the feed's
``poll`` interval, so a waiter never relies on a notification alone:

* the in-memory store publishes each change to the waiters of its process at once;
* a SQLite file publishes the changes made through it to the waiters of its process at
  once (every store object of this process on that file shares one feed), and waiters
  look again every ``poll`` seconds for changes made by other processes (SQLite has no
  notifications between processes);
* PostgreSQL sends ``NOTIFY`` from the server for every message, event and stream value
  (triggers, in the same transaction), and for a parked queue entry made runnable; one
  connection per process listens (``LISTEN``) and wakes the waiters of the topics named.

A subscription is sticky: a change published after it was made and before a wait is seen
by that wait, so "subscribe, look, wait" never misses one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

__all__ = [
    "CHANNEL",
    "ChangeFeed",
    "ListeningFeed",
    "Subscription",
    "queue_topic",
    "run_topic",
    "topic_digest",
]

log = logging.getLogger("stepstone")

#: The PostgreSQL notification channel stepstone's triggers and queue send on.
CHANNEL = "stepstone"


def topic_digest(text: str) -> str:
    """The short digest a topic carries (the same the PostgreSQL triggers compute with
    ``left(md5(text), 16)``): a notification's payload stays small whatever the key."""
    return hashlib.md5(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()[
        :16
    ]


def run_topic(key: str) -> str:
    """The topic of the records of the run under ``key`` (messages, events, streams)."""
    return "r:" + topic_digest(key)


def queue_topic(queue: str) -> str:
    """The topic of ``queue``'s entries becoming runnable."""
    return "q:" + topic_digest(queue)


class Subscription:
    """A waiter's interest in some topics of a :class:`ChangeFeed` (a context manager;
    :meth:`close` ends it)."""

    def __init__(self, feed: ChangeFeed, topics: tuple[str, ...]) -> None:
        self.feed = feed
        self.topics = topics
        self._flag = threading.Event()
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self.feed._drop(self)

    def _touch(self) -> None:
        """A topic of this subscription was touched (any thread)."""
        self._flag.set()
        with self._lock:
            waiting = list(self._loops)
        for loop, event in waiting:
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def wait(self, timeout: float) -> bool:
        """Block until a topic is touched (True) or ``min(timeout, feed.poll)`` seconds
        passed (False): look at the store again either way."""
        touched = self._flag.wait(max(0.0, min(timeout, self.feed.poll)))
        self._flag.clear()
        return touched

    async def await_change(self, timeout: float) -> bool:
        """:meth:`wait` on the running event loop, without a thread."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._loops.append(entry)
        try:
            if not self._flag.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(0.0, min(timeout, self.feed.poll)))
            touched = self._flag.is_set()
            self._flag.clear()
            return touched
        finally:
            with self._lock:
                self._loops.remove(entry)


class ChangeFeed:
    """Waiters of this process by topic, and the changes published to them.

    Args:
        poll: The longest a wait lasts without a notification (seconds): how often a
            waiter looks at the store again on its own.
    """

    def __init__(self, poll: float) -> None:
        self.poll = poll
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {}

    def subscribe(self, topics: Iterable[str]) -> Subscription:
        """A subscription to ``topics`` (:func:`run_topic`, :func:`queue_topic`)."""
        sub = Subscription(self, tuple(topics))
        with self._lock:
            for topic in sub.topics:
                self._subs.setdefault(topic, set()).add(sub)
        self._subscribed()
        return sub

    def _subscribed(self) -> None:
        """Hook: a subscription was made (a listening feed starts listening)."""

    def _drop(self, sub: Subscription) -> None:
        with self._lock:
            for topic in sub.topics:
                subs = self._subs.get(topic)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._subs[topic]

    def publish(self, topic: str) -> None:
        """Wake the waiters of ``topic`` in this process."""
        with self._lock:
            subs = list(self._subs.get(topic, ()))
        for sub in subs:
            sub._touch()

    def publish_all(self) -> None:
        """Wake every waiter (after notifications may have been missed)."""
        with self._lock:
            subs = {sub for group in self._subs.values() for sub in group}
        for sub in subs:
            sub._touch()

    def subscribed(self) -> bool:
        """Whether anyone waits now."""
        with self._lock:
            return bool(self._subs)

    def close(self) -> None:
        """Stop whatever the feed runs (idempotent); waiters fall back on polling."""


class ListeningFeed(ChangeFeed):
    """A feed fed by a listener thread: ``listen(stop, publish, ready)`` runs in a daemon
    thread while anyone is subscribed (and for ``linger`` seconds after), calling
    ``publish(topic)`` for each notification and ``ready()`` each time it (re)starts
    listening; it returns when ``stop`` is set. Each ``ready()`` wakes every waiter, so a
    change made before the listener listened is looked for again."""

    def __init__(
        self,
        poll: float,
        listen: Callable[[threading.Event, Callable[[str], None], Callable[[], None]], None],
        *,
        name: str = "stepstone-listen",
        linger: float = 30.0,
    ) -> None:
        super().__init__(poll)
        self._listen = listen
        self._name = name
        self._linger = linger
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._start_lock = threading.Lock()

    def _subscribed(self) -> None:
        with self._start_lock:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name=self._name, daemon=True
            )
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        idle_since: list[float | None] = [None]

        def watch() -> None:
            # ends the listener once nobody waited for `linger` seconds
            while not stop.wait(min(1.0, self._linger)):
                if self.subscribed():
                    idle_since[0] = None
                elif idle_since[0] is None:
                    idle_since[0] = time.monotonic()
                elif time.monotonic() - idle_since[0] >= self._linger:
                    stop.set()

        watcher = threading.Thread(target=watch, name=f"{self._name}-idle", daemon=True)
        watcher.start()
        try:
            self._listen(stop, self.publish, self.publish_all)
        except Exception:
            log.warning("stepstone: the change listener stopped", exc_info=True)
        finally:
            stop.set()
            self.publish_all()

    def close(self) -> None:
        with self._start_lock:
            self._closed = True
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
