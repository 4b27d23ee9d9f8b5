"""In-memory backend: dicts behind one lock (the lock is this backend's "database")."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from stepstone.exceptions import StoreError, StoreKeyConflictError
from stepstone.store._base import Backend, Decide, JournalRow, RunHead

__all__ = ["MemoryBackend", "run_key_conflict"]


def run_key_conflict(key: str) -> StoreKeyConflictError:
    """The error for a plain-value operation on a key that holds a durable run."""
    return StoreKeyConflictError(
        f"key {key!r} holds a durable run checkpoint, not a plain value; read it with "
        f"store.read({key!r}) or remove it first with store.delete({key!r})"
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
            return True

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

    def describe(self) -> str:
        return "memory"
