"""In-memory backend: dicts behind one lock (the lock is this backend's "database")."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from stepstone.exceptions import CorruptRecordError, StoreError, StoreKeyConflictError
from stepstone.store._base import Backend, Decide, JournalRow, RunHead
from stepstone.store._changes import ChangeFeed, run_topic
from stepstone.store._extras import EventValue, ExtraWrites, Message, StreamEntry, Timer
from stepstone.store._webhooks import WebhookRecord

__all__ = ["MemoryBackend", "consumed_already", "run_key_conflict"]


def run_key_conflict(key: str) -> StoreKeyConflictError:
    """The error for a plain-value operation on a key that holds a durable run."""
    return StoreKeyConflictError(
        f"key {key!r} holds a durable run checkpoint, not a plain value; read it with "
        f"store.read({key!r}) or remove it first with store.delete({key!r})"
    )


def consumed_already(key: str, message_id: int) -> CorruptRecordError:
    """The error of a commit that would consume a message that is not pending for the run
    under ``key`` (consumed already, or another run's): nothing of it was written."""
    return CorruptRecordError(
        f"run {key!r} would consume message {message_id}, which is not a pending message of "
        "this run (consumed already, or sent to another run); nothing was written. A run "
        "consumes each message once: its journal or the message table is damaged"
    )


class MemoryBackend(Backend):
    """Process-local storage; nothing survives the process. ``Store()`` uses it."""

    blocking = False
    commit_inline = True

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._closed = False
        self._kv: dict[str, str] = {}
        self._runs: dict[str, RunHead] = {}
        self._journal: dict[str, list[JournalRow]] = {}
        self._timers: dict[str, dict[str, Timer]] = {}
        self._messages: dict[int, Message] = {}  # by id, in send order
        self._run_messages: dict[str, list[int]] = {}
        self._message_ids = 0
        self._events: dict[str, dict[str, EventValue]] = {}
        self._streams: dict[str, dict[str, list[StreamEntry]]] = {}
        self._webhooks: dict[str, WebhookRecord] = {}
        # every waiter is in this process: each change wakes its waiters at once
        self._feed = ChangeFeed(poll=1.0)

    def _refuse_closed(self) -> None:
        """Raise once :meth:`close` ran, as a file or database store does (called under
        the lock, so a read or write racing ``close()`` sees either all data or none)."""
        if self._closed:
            raise StoreError(
                f"store {self.describe()} is closed, and what it held went with it; "
                "use a new Store()"
            )

    def kv_get(self, key: str) -> str | None:
        with self._lock:
            self._refuse_closed()
            return self._kv.get(key)

    def kv_put(self, key: str, text: str) -> None:
        with self._lock:
            self._refuse_closed()
            if key in self._runs:
                raise run_key_conflict(key)
            self._kv[key] = text

    def kv_delete(self, key: str) -> bool:
        with self._lock:
            self._refuse_closed()
            found = self._kv.pop(key, None) is not None
            if self._runs.pop(key, None) is not None:
                found = True
            self._journal.pop(key, None)
            self._drop_extras(key, messages=True)
            return found

    def kv_keys(self, prefix: str | None) -> list[str]:
        with self._lock:
            self._refuse_closed()
            keys = set(self._kv) | set(self._runs)
        return sorted(k for k in keys if prefix is None or k.startswith(prefix))

    def kv_items(self, prefix: str | None) -> list[tuple[str, str]]:
        with self._lock:
            self._refuse_closed()
            items = list(self._kv.items())
        return sorted((k, v) for k, v in items if prefix is None or k.startswith(prefix))

    def kv_cas(
        self, key: str, expected: Any, new_text: str, equal: Callable[[str, Any], bool]
    ) -> bool:
        with self._lock:
            self._refuse_closed()
            if key in self._runs:
                raise run_key_conflict(key)
            current = self._kv.get(key)
            if expected is None:
                if current is not None:
                    return False
            elif current is None or not equal(current, expected):
                return False
            self._kv[key] = new_text
            return True

    def run_get(self, key: str) -> RunHead | None:
        with self._lock:
            self._refuse_closed()
            return self._runs.get(key)

    def run_transact(self, key: str, decide: Decide) -> RunHead | None:
        with self._lock:
            self._refuse_closed()
            head = self._runs.get(key)
            claim = decide(head, self._kv.get(key))
            if claim is None:
                return head
            if claim.reset_journal and head is not None:  # a run started over
                self._drop_extras(key, messages=False)
            journal = [] if claim.reset_journal else list(self._journal.get(key, []))
            journal.extend(claim.rows)
            self._journal[key] = journal
            if claim.drop_kv:
                self._kv.pop(key, None)
            self._runs[key] = claim.head
            return claim.head

    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        with self._lock:
            self._refuse_closed()
            current = self._runs.get(head.key)
            if (
                current is None
                or current.version != expected_version
                or current.run_uid != head.run_uid
            ):
                return False
            for wkey, _ in writes:
                if wkey in self._runs:
                    raise run_key_conflict(wkey)
            self._runs[head.key] = head
            at = head.updated_at  # every row's committed_at: the commit's time
            self._journal.setdefault(head.key, []).extend(
                r if r.committed_at == at else dataclasses.replace(r, committed_at=at) for r in rows
            )
            for wkey, text in writes:
                self._kv[wkey] = text
        if head.status not in ("claimed", "running"):
            self._feed.publish(run_topic(head.key))  # a stream's readers learn it ended
        return True

    # -- timers, messages, events, streams ---------------------------------------------
    def _drop_extras(self, key: str, *, messages: bool) -> None:
        """Forget the run's timers, events and streams (and, with ``messages``, its
        messages); called under the lock."""
        self._timers.pop(key, None)
        self._events.pop(key, None)
        self._streams.pop(key, None)
        if messages:
            for mid in self._run_messages.pop(key, []):
                self._messages.pop(mid, None)

    def run_commit_extras(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
        extras: ExtraWrites,
    ) -> bool:
        with self._lock:
            self._refuse_closed()
            current = self._runs.get(head.key)
            if (
                current is None
                or current.version != expected_version
                or current.run_uid != head.run_uid
            ):
                return False
            key = extras.key or head.key  # whose records
            self._check_consumable(key, extras.consume)  # first: nothing written on a refusal
            if not self.run_commit(head, expected_version, rows, writes):
                return False  # (never: checked above, under the same lock)
            self._apply_extras(key, extras, head.updated_at)
        self._feed.publish(run_topic(key))
        if key != head.key:
            self._feed.publish(run_topic(head.key))
        return True

    def _check_consumable(self, key: str, consume: Sequence[int]) -> None:
        """Raise when a message to consume is missing, another run's, or consumed already;
        called under the lock."""
        for mid in consume:
            found = self._messages.get(mid)
            if found is None or found.run_key != key or found.consumed_at is not None:
                raise consumed_already(key, mid)

    def _apply_extras(self, key: str, extras: ExtraWrites, now: float) -> None:
        """Write a commit's messages consumed, events, stream items and timers for run
        ``key``; called under the lock, after the commit itself."""
        for mid in extras.consume:
            msg = self._messages[mid]
            self._messages[mid] = dataclasses.replace(msg, consumed_at=now)
        for name, data in extras.events:
            self._events.setdefault(key, {})[name] = EventValue(
                name=name, data=data, updated_at=now
            )
        for name, data in extras.stream:
            self._append(key, name, data, None, now)
        timers = self._timers.setdefault(key, {})
        for name in extras.clear_timers:
            timers.pop(name, None)
        for timer in extras.timers:
            timers[timer.name] = timer
        if not timers:
            del self._timers[key]

    def message_send(
        self, run_key: str, topic: str, data: str, *, refuse: Collection[str]
    ) -> int | None:
        with self._lock:
            self._refuse_closed()
            head = self._runs.get(run_key)
            if head is not None and head.status in refuse:
                return None
            self._message_ids += 1
            mid = self._message_ids
            self._messages[mid] = Message(
                id=mid,
                run_key=run_key,
                topic=topic,
                data=data,
                sent_at=self.clock(),
                consumed_at=None,
            )
            self._run_messages.setdefault(run_key, []).append(mid)
        self._feed.publish(run_topic(run_key))
        return mid

    def message_next(self, run_key: str, topic: str) -> Message | None:
        with self._lock:
            self._refuse_closed()
            for mid in self._run_messages.get(run_key, []):
                msg = self._messages[mid]
                if msg.topic == topic and msg.consumed_at is None:
                    return msg
        return None

    def messages(self, run_key: str) -> list[Message]:
        with self._lock:
            self._refuse_closed()
            return [self._messages[mid] for mid in self._run_messages.get(run_key, [])]

    def event_set(self, run_key: str, name: str, data: str) -> None:
        with self._lock:
            self._refuse_closed()
            self._events.setdefault(run_key, {})[name] = EventValue(
                name=name, data=data, updated_at=self.clock()
            )
        self._feed.publish(run_topic(run_key))

    def webhook_add(self, record: WebhookRecord) -> bool:
        with self._lock:
            self._refuse_closed()
            if record.id in self._webhooks:
                return False
            self._webhooks[record.id] = record
            return True

    def webhook_get(self, id: str) -> WebhookRecord | None:
        with self._lock:
            self._refuse_closed()
            return self._webhooks.get(id)

    def webhook_list(
        self, run_key: str | None, statuses: Collection[str] | None = None
    ) -> list[WebhookRecord]:
        with self._lock:
            self._refuse_closed()
            found = [
                r
                for r in self._webhooks.values()
                if (run_key is None or r.run_key == run_key)
                and (statuses is None or r.status in statuses)
            ]
        return sorted(found, key=lambda r: (r.created_at, r.id))

    def webhook_update(self, record: WebhookRecord, expected_version: int) -> bool:
        with self._lock:
            self._refuse_closed()
            stored = self._webhooks.get(record.id)
            if stored is None or stored.version != expected_version:
                return False
            self._webhooks[record.id] = record
            return True

    def event_get(self, run_key: str, name: str) -> EventValue | None:
        with self._lock:
            self._refuse_closed()
            return self._events.get(run_key, {}).get(name)

    def events(self, run_key: str) -> list[EventValue]:
        with self._lock:
            self._refuse_closed()
            found = dict(self._events.get(run_key, {}))
        return [found[name] for name in sorted(found)]

    def _append(self, key: str, name: str, data: str, attempt: int | None, now: float) -> int:
        items = self._streams.setdefault(key, {}).setdefault(name, [])
        items.append(
            StreamEntry(name=name, offset=len(items), data=data, attempt=attempt, written_at=now)
        )
        return len(items) - 1

    def stream_append(self, run_key: str, name: str, data: str, attempt: int | None) -> int:
        with self._lock:
            self._refuse_closed()
            offset = self._append(run_key, name, data, attempt, self.clock())
        self._feed.publish(run_topic(run_key))
        return offset

    def stream_read(self, run_key: str, name: str, start: int, limit: int) -> list[StreamEntry]:
        with self._lock:
            self._refuse_closed()
            items = self._streams.get(run_key, {}).get(name, [])
            return items[max(start, 0) : max(start, 0) + limit]

    def streams(self, run_key: str) -> list[tuple[str, int]]:
        with self._lock:
            self._refuse_closed()
            found = self._streams.get(run_key, {})
            return sorted((name, len(items)) for name, items in found.items())

    def timers(self, run_key: str | None) -> list[Timer]:
        with self._lock:
            self._refuse_closed()
            keys = sorted(self._timers) if run_key is None else [run_key]
            return [timer for key in keys for _, timer in sorted(self._timers.get(key, {}).items())]

    def changes(self) -> ChangeFeed:
        return self._feed

    def run_renew(self, key: str, run_uid: str, lease_until: float) -> bool:
        with self._lock:
            self._refuse_closed()
            current = self._runs.get(key)
            if current is None or current.run_uid != run_uid:
                return False
            self._runs[key] = current.replace(lease_until=lease_until)
            return True

    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        with self._lock:
            self._refuse_closed()
            return [r for r in self._journal.get(key, []) if r.seq >= since_seq]

    def run_list(self, prefix: str | None) -> list[RunHead]:
        with self._lock:
            self._refuse_closed()
            heads = list(self._runs.values())
        return sorted(
            (h for h in heads if prefix is None or h.key.startswith(prefix)), key=lambda h: h.key
        )

    def setup(self) -> None:
        with self._lock:
            self._refuse_closed()

    def close(self) -> None:
        """Drop everything the store held; every later read or write refuses. Idempotent."""
        with self._lock:
            self._closed = True
            self._kv, self._runs, self._journal = {}, {}, {}
            self._timers, self._events, self._streams = {}, {}, {}
            self._webhooks = {}
            self._messages, self._run_messages = {}, {}

    def describe(self) -> str:
        return "memory"
