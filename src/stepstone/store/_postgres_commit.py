"""One step's commit on PostgreSQL as one statement, its text generated per shape.

A step commit moves the run head (compare-and-swap on version and run_uid), appends its
journal rows and upserts its ``writes=`` values. It is sent as one statement: a ``WITH``
whose head ``UPDATE`` returns the key, and whose ``INSERT``\\ s select from that
``RETURNING``, so rows and values exist exactly when the head moved.

The statement's text depends on the commit's shape (how many journal rows, how many
writes): up to :data:`SCALAR_LIMIT` of each are sent as plain positional parameters
(``VALUES`` lists), which the server binds without parsing arrays and the client dumps
without escaping them; larger commits send arrays. Each text is built once per process,
and a connection prepares each text it runs often once (``prepare=False`` sends them
unprepared, the same statements).

A key holds a run or a value, never both. Writers of a key take its transaction-level
advisory lock; a commit with ``writes=`` takes them inside ``stepstone_key_free`` (or
``stepstone_keys_free``), a VOLATILE function in the head update's condition: the check
that no run lives under a written key runs in that function after the lock is granted,
with a snapshot of its own, so it sees a run that a claim committed while the commit
waited for the lock (a check in the statement itself would use the statement's older
snapshot and miss it).

A commit with one ``writes=`` key that already holds a value (a step writing the same key
on every run, the usual case) skips both: it locks that value's row ``FOR KEY SHARE``,
which no claim needs for a key holding a value (a claim refuses such a key, or imports a
legacy value with a read ``FOR UPDATE``, which waits for the commit), and which keeps the
row from being deleted until the commit ends, so the upsert updates that row and no run
can appear under the key meanwhile. The row lock is cheaper on the server than the
function (about 15 us less per commit, measured with fsync off). A commit with several
keys keeps the advisory locks: a row lock held while waiting for one of them could
deadlock with a claim.

A connection that prepares nothing (``prepare=False``, as behind PgBouncer in transaction
mode) would have the server parse and plan that statement on every step, which costs it
more than the commit's writes (about 150 us a step, measured). It calls the server function
``stepstone_step_commit`` instead, with every shape's rows and writes as arrays: the same
locks, writes and answer, with the function's statements planned once per connection.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from stepstone.store._base import JournalRow, RunHead, head_update_params
from stepstone.store._postgres_schema import KEY_LOCK_CLASS, lock_id, lock_ids

__all__ = ["FUNCTION_SQL", "SCALAR_LIMIT", "WHY_SQL", "commit_sql", "commit_statement"]

#: Journal rows (and, separately, writes) sent as scalar parameters up to this many per
#: commit; larger commits send arrays. Bounds the distinct texts (and so the statements a
#: connection prepares) to (SCALAR_LIMIT + 2) ** 2.
SCALAR_LIMIT = 4

_HEAD_UPDATE = (
    "UPDATE stepstone_runs SET status = %s, next_step = %s, version = %s::int8, "
    "iteration = %s::int8, journal_len = %s::int8, lease_until = %s::float8, meta = %s, "
    "updated_at = %s::float8 "
    "WHERE key = %s AND version = %s::int8 AND run_uid = %s"
)

#: Why a commit did not apply: whether the head still matched, and the least write key
#: that holds a run. Read only after a commit statement that changed nothing.
WHY_SQL = (
    "SELECT EXISTS (SELECT 1 FROM stepstone_runs WHERE key = %s AND version = %s::int8 "
    "AND run_uid = %s), (SELECT min(key) FROM stepstone_runs WHERE key = ANY(%s::text[]))"
)


def _shape(n: int) -> int:
    """The text variant for ``n`` items: ``n`` itself, or -1 for arrays."""
    return n if n <= SCALAR_LIMIT else -1


@functools.cache
def commit_sql(rows: int, writes: int) -> bytes:
    """The commit statement for ``rows`` journal rows and ``writes`` distinct write keys
    (each a count up to SCALAR_LIMIT, or -1 for arrays). It returns one row: how many
    heads it moved (1 or 0)."""
    check = ""
    if writes == 1:
        check = (
            " AND CASE WHEN EXISTS (SELECT 1 FROM stepstone_kv WHERE key = %s FOR KEY SHARE) "
            f"THEN TRUE ELSE stepstone_key_free({KEY_LOCK_CLASS}, %s::int4, %s) END"
        )
    elif writes:
        check = f" AND stepstone_keys_free({KEY_LOCK_CLASS}, %s::int4[], %s::text[])"
    parts = [f"WITH upd AS ({_HEAD_UPDATE}{check} RETURNING key, updated_at)"]
    # A row's committed_at is the commit's time: the head's updated_at, from the UPDATE.
    insert = (
        "j AS (INSERT INTO stepstone_journal "
        "(run_key, seq, kind, name, data, started_at, committed_at) "
    )
    if rows == 1:
        parts.append(
            f"{insert}SELECT upd.key, %s::int8, %s, %s, %s, %s::float8, upd.updated_at FROM upd)"
        )
    elif rows:
        source = (
            "unnest(%s::int8[], %s::text[], %s::text[], %s::text[], %s::float8[])"
            if rows < 0
            else "(VALUES " + ", ".join(["(%s::int8, %s, %s, %s, %s::float8)"] * rows) + ")"
        )
        parts.append(
            f"{insert}SELECT upd.key, r.seq, r.kind, r.name, r.data, r.started, upd.updated_at "
            f"FROM upd, {source} AS r(seq, kind, name, data, started))"
        )
    if writes:
        if writes == 1:
            select = "SELECT %s, %s, upd.updated_at FROM upd"
        else:
            source = (
                "unnest(%s::text[], %s::text[])"
                if writes < 0
                else "(VALUES " + ", ".join(["(%s, %s)"] * writes) + ")"
            )
            select = f"SELECT w.key, w.value, upd.updated_at FROM upd, {source} AS w(key, value)"
        parts.append(
            f"w AS (INSERT INTO stepstone_kv (key, value, updated_at) {select} "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, "
            "updated_at = EXCLUDED.updated_at)"
        )
    return (", ".join(parts) + " SELECT count(*) FROM upd").encode()


#: The commit for connections that prepare nothing (see the module docstring).
FUNCTION_SQL = (
    "SELECT stepstone_step_commit(%s, %s, %s::int8, %s::int8, %s::int8, %s::float8, %s, "
    f"%s::float8, %s, %s::int8, %s, {KEY_LOCK_CLASS}, %s::int4[], %s::text[], %s::text[], "
    "%s::int8[], %s::text[], %s::text[], %s::text[], %s::float8[])"
).encode()


def commit_statement(
    head: RunHead,
    expected_version: int,
    rows: Sequence[JournalRow],
    writes: Sequence[tuple[str, str]],
    prepare: bool = True,
) -> tuple[bytes, list[Any], list[str]]:
    """The commit's statement, its parameters, and its distinct write keys (the last write
    of a key wins); ``prepare=False``: the call of ``stepstone_step_commit``, for a
    connection that prepares nothing."""
    latest = dict(writes)
    keys = list(latest)
    if not prepare:
        return (
            FUNCTION_SQL,
            [
                *head_update_params(head, expected_version),
                lock_ids(keys),
                keys,
                list(latest.values()),
                [r.seq for r in rows],
                [r.kind for r in rows],
                [r.name for r in rows],
                [r.data for r in rows],
                [r.started_at for r in rows],
            ],
            keys,
        )
    n_rows, n_writes = _shape(len(rows)), _shape(len(keys))
    params: list[Any] = list(head_update_params(head, expected_version))
    if n_writes == 1:
        params += (keys[0], lock_id(keys[0]), keys[0])
    elif n_writes:
        params += (lock_ids(keys), keys)
    if n_rows < 0:
        params += (
            [r.seq for r in rows],
            [r.kind for r in rows],
            [r.name for r in rows],
            [r.data for r in rows],
            [r.started_at for r in rows],
        )
    else:
        for r in rows:
            params += (r.seq, r.kind, r.name, r.data, r.started_at)
    if n_writes < 0:
        params += (keys, list(latest.values()))
    else:
        for item in latest.items():
            params += item
    return commit_sql(n_rows, n_writes), params, keys
