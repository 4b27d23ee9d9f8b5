"""Group commit on SQLite: the step commits (and claims) of several runs in one transaction.

One ``BEGIN IMMEDIATE`` transaction holds the file's write lock, so checking every item
first and writing afterwards is atomic. Claims (``run_transact`` decisions) are applied
first, one by one, as :meth:`SQLiteBackend.run_transact` would; then the current heads of
every committing run (and of every ``writes=`` key) are read with one query, each commit's
compare-and-swap and key conflicts are checked in order against that state (updated as
items pass, so the outcome is that of committing them one after another), and the passing
commits' heads, journal rows and values are written with three ``executemany`` calls. A
commit that fails its check writes nothing; the others land. If a statement fails outright
(a full disk, a bug), the transaction is rolled back and every item is committed again on
its own, so one run's error never loses or lands another run's rows. One COMMIT, one fsync.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from stepstone.exceptions import StoreError
from stepstone.store._base import Decide, JournalRow, RunHead
from stepstone.store._memory import run_key_conflict
from stepstone.store._sqlite_rows import (
    head_commit_params,
    head_update_sql,
    journal_insert_sql,
    journal_params,
    kv_params,
    kv_upsert_sql,
)

if TYPE_CHECKING:
    from stepstone.store._sqlite import SQLiteBackend

__all__ = ["BatchItem", "Outcome", "commit_batch"]

#: A step commit: ``(head, expected_version, journal rows, writes)`` as for ``run_commit``.
CommitArgs = tuple[RunHead, int, Sequence[JournalRow], Sequence[tuple[str, str]]]
#: A claim: ``(key, decide)`` as for ``run_transact``.
TransactArgs = tuple[str, Decide]
BatchItem = CommitArgs | TransactArgs
#: Per item: what ``run_commit``/``run_transact`` returned, or the exception it raised.
Outcome = bool | RunHead | None | BaseException

#: Keys per ``IN (...)`` query (SQLite allows 32766 parameters; stay far below).
_CHUNK = 500


def commit_batch(backend: SQLiteBackend, items: Sequence[BatchItem]) -> list[Outcome]:
    """Apply ``items`` in one transaction; per item, its outcome (see module docstring).

    Raises nothing: a failure to take the write lock is every item's outcome.
    """
    if len(items) == 1:  # nothing to share: the single-item path, one statement less
        return _one_by_one(backend, items)
    entered = False
    try:
        with backend._tx() as conn:
            entered = True
            return _apply(backend, conn, items)
    except Exception as exc:  # noqa: BLE001 - per item below
        if not entered:  # no write lock, a closed store: nothing was written
            return [exc] * len(items)
    # A statement (or the COMMIT) failed and the batch was rolled back: each on its own.
    return _one_by_one(backend, items)


def _one_by_one(backend: SQLiteBackend, items: Sequence[BatchItem]) -> list[Outcome]:
    out: list[Outcome] = []
    for item in items:
        try:
            if _is_claim(item):
                key, decide = item  # type: ignore[misc]
                out.append(backend.run_claim(key, decide))
            else:
                out.append(backend.run_commit(*item))
        except Exception as exc:  # noqa: BLE001 - handed to the run that sent it
            out.append(exc)
    return out


def _is_claim(item: BatchItem) -> bool:
    return len(item) == 2


def _apply(
    backend: SQLiteBackend, conn: sqlite3.Connection, items: Sequence[BatchItem]
) -> list[Outcome]:
    outcomes: list[Outcome] = [None] * len(items)
    commits = _apply_claims(backend, conn, items, outcomes)
    if commits:
        _apply_commits(backend, conn, commits, outcomes)
    return outcomes


def _apply_claims(
    backend: SQLiteBackend,
    conn: sqlite3.Connection,
    items: Sequence[BatchItem],
    outcomes: list[Outcome],
) -> list[tuple[int, CommitArgs]]:
    """Apply the claims among ``items`` (their outcomes into ``outcomes``); the commits
    left, each with its index."""
    commits: list[tuple[int, CommitArgs]] = []
    for i, item in enumerate(items):
        if _is_claim(item):
            key, decide = item  # type: ignore[misc]
            try:
                outcomes[i] = backend.transact_in(conn, key, decide)
            except sqlite3.Error:
                raise  # the database failed: the whole batch is retried item by item
            except Exception as exc:  # noqa: BLE001 - decide refused: it wrote nothing
                outcomes[i] = exc
        else:
            commits.append((i, item))  # type: ignore[arg-type]
    return commits


def _apply_commits(
    backend: SQLiteBackend,
    conn: sqlite3.Connection,
    commits: list[tuple[int, CommitArgs]],
    outcomes: list[Outcome],
) -> None:
    """Check each commit against the heads as the commits before it left them, then write
    the passing ones with three ``executemany`` calls (outcomes into ``outcomes``)."""
    runs, journal, kv = backend._runs, backend._journal, backend._kv
    run_keys = {head.key for _, (head, _, _, _) in commits}
    write_keys = {k for _, (_, _, _, writes) in commits for k, _ in writes}
    state = dict(_heads(conn, runs, run_keys | write_keys))
    heads: list[tuple[object, ...]] = []
    rows: list[tuple[object, ...]] = []
    values: list[tuple[str, str, float, int | None]] = []
    for i, (head, expected, jrows, writes) in commits:
        if state.get(head.key) != (expected, head.run_uid):
            outcomes[i] = False
            continue
        clash = next((k for k, _ in writes if k in state), None)
        if clash is not None:
            outcomes[i] = run_key_conflict(clash)
            continue
        state[head.key] = (head.version, head.run_uid)
        heads.append(head_commit_params(head, expected))
        rows.extend(journal_params(head.key, r, head.updated_at) for r in jrows)
        values.extend(kv_params(k, text, head.updated_at) for k, text in writes)
        outcomes[i] = True
    if heads:
        cur = conn.executemany(head_update_sql(runs), heads)
        if cur.rowcount != len(heads):
            raise StoreError(f"group commit updated {cur.rowcount} of {len(heads)} run heads")
    if rows:
        conn.executemany(journal_insert_sql(journal), rows)
    if values:
        conn.executemany(kv_upsert_sql(kv), values)


def _heads(
    conn: sqlite3.Connection, runs: str, keys: set[str]
) -> Iterable[tuple[str, tuple[int, str]]]:
    """``(key, (version, run_uid))`` of every run among ``keys``."""
    ordered = sorted(keys)
    for start in range(0, len(ordered), _CHUNK):
        chunk = ordered[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        for key, version, run_uid in conn.execute(
            f"SELECT key, version, run_uid FROM {runs} WHERE key IN ({marks})", chunk
        ):
            yield str(key), (int(version), str(run_uid))
