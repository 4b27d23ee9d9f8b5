"""Reading, listing and deleting run records, and the one rule for calling backends from
async code.

Engines and the CLI reach run records only through these calls (and ``claim_run`` /
``OwnedRun``), never through ``store.backend``:

* :func:`read_run` returns a run's head together with the journal that head describes,
  read consistently even while its owner keeps committing.
* :func:`run_head`, :func:`list_runs` and :func:`delete_run` read one head, list heads by
  key prefix, and delete a record.
* :func:`blocking_call` runs any of them (or an engine's function made of them) from async
  code; ``aread_run``, ``alist_runs``, ``adelete_run`` and ``aclaim_run`` are the async
  forms built on it.

The rule :func:`blocking_call` applies, for every backend call the kernel or an engine
makes from async code: an in-memory backend (``Backend.blocking`` False) is called on the
loop thread; a local file (``Backend.commit_inline``, SQLite) is called on the loop thread
for a call of bounded size (a commit, a claim, a head: cheaper than the ~40 us thread round
trip, and writers of one file serialize anyway) and from a worker thread for a ``bulk``
call, whose cost grows with the data (a whole journal, a listing); a network backend
(PostgreSQL) is called from a worker thread, so a slow server never stalls the loop (its
step commits, which the kernel sends itself, are awaited on the loop over async
connections instead: ``Backend.async_commit``). On a
sync call's private event loop (``may_block_loop``), with no other task to starve, every
call runs inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from stepstone.core._sync import may_block_loop
from stepstone.core._threads import to_thread
from stepstone.store._base import JournalRow, RunHead, read_consistent
from stepstone.store._store import Store

__all__ = [
    "adelete_run",
    "alist_runs",
    "aread_run",
    "blocking_call",
    "delete_run",
    "list_runs",
    "journal_since",
    "read_run",
    "run_head",
]

R = TypeVar("R")


async def blocking_call(store: Store, fn: Callable[..., R], *args: Any, bulk: bool = False) -> R:
    """Call ``fn(*args)``, a blocking call on ``store``'s backend, from async code, by the
    kernel's one rule (module docstring): on the loop thread for an in-memory backend, and
    for a local file unless ``bulk`` (the call reads a whole journal or many runs); in a
    worker thread otherwise."""
    backend = store.backend
    if not backend.blocking or (backend.commit_inline and not bulk) or may_block_loop():
        # may_block_loop: a sync caller's private loop, with no other task to starve.
        return fn(*args)
    return await to_thread(fn, *args)


def run_head(store: Store, key: str) -> RunHead | None:
    """The head of the run under ``key`` (None when there is none)."""
    return store.backend.run_get(key)


def journal_since(store: Store, key: str, since_seq: int) -> list[JournalRow]:
    """The journal rows of the run under ``key`` from ``since_seq`` on (a finished run's
    last row, say: one read, however long the journal)."""
    return store.backend.run_journal(key, since_seq)


def read_run(store: Store, key: str) -> tuple[RunHead, list[JournalRow]] | None:
    """The run under ``key``: its head and the journal rows that head describes, or None
    when there is no run (:func:`~stepstone.store._base.read_consistent`: the pair is
    consistent even while its owner commits).

    Raises:
        StoreError: the run was claimed again on every one of many attempts.
    """
    return read_consistent(store.backend, key)


def list_runs(store: Store, prefix: str | None = None) -> list[RunHead]:
    """Heads of the runs whose key starts with ``prefix`` (all runs when None), sorted by
    key. A head that cannot be decoded is listed with status ``"corrupt"`` and the reason
    in ``meta["corrupt"]``."""
    return store.backend.run_list(prefix)


def delete_run(store: Store, key: str) -> bool:
    """Delete the run under ``key`` with its journal (a plain value under ``key`` too, as
    ``Store.delete`` does). True if something was there."""
    return store.backend.kv_delete(key)


async def aread_run(store: Store, key: str) -> tuple[RunHead, list[JournalRow]] | None:
    """Async :func:`read_run`."""
    return await blocking_call(store, read_run, store, key, bulk=True)


async def alist_runs(store: Store, prefix: str | None = None) -> list[RunHead]:
    """Async :func:`list_runs`."""
    return await blocking_call(store, list_runs, store, prefix, bulk=True)


async def adelete_run(store: Store, key: str) -> bool:
    """Async :func:`delete_run`."""
    return await blocking_call(store, delete_run, store, key)
