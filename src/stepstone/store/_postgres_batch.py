"""Group commit on PostgreSQL: the step commits of several runs in one transaction.

One transaction takes the advisory locks of every ``writes=`` key of the batch (sorted, so
batches never deadlock), runs each run's one-statement commit, and commits once: one WAL
flush for the whole batch, in two round trips (pipelined). A commit statement that does not
apply (lost ownership, a ``writes=`` key that holds a run) writes nothing by construction,
so each run's compare-and-swap stays its own. If a statement fails outright, the
transaction is rolled back and every commit of the batch is retried on its own, so one
run's error never loses or lands another run's rows. A lost connection is handled as for a
single commit: retried when nothing committed, looked up (``txid_status``) when the
COMMIT's answer was lost.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from stepstone.store._base import JournalRow, RunHead, commit_each
from stepstone.store._memory import run_key_conflict
from stepstone.store._postgres import Connection, PostgresBackend
from stepstone.store._postgres_commit import WHY_SQL, commit_statement

__all__ = ["commit_many"]

Item = tuple[RunHead, int, Sequence[JournalRow], Sequence[tuple[str, str]]]
Outcome = bool | Exception


def commit_many(backend: PostgresBackend, items: Sequence[Item]) -> list[Outcome]:
    """Per item, what ``run_commit`` would have returned (or raised)."""
    statements = [commit_statement(*item, backend.prepare) for item in items]
    locked = sorted({k for _, _, keys in statements for k in keys})

    def batch(conn: Connection) -> list[Outcome]:
        # Pipelined: BEGIN, the locks and every commit statement go in one round trip.
        cursors = [conn.execute(sql, params) for sql, params, _ in statements]
        out: list[Outcome] = []
        for (head, expected, _, _), (_, _, keys), cur in zip(
            items, statements, cursors, strict=True
        ):
            row = cur.fetchone()
            if row is not None and row[0]:
                out.append(True)
                continue
            # Under the batch's locks, nothing changes the answer in between.
            why = conn.execute(WHY_SQL, (head.key, expected, head.run_uid, keys)).fetchone()
            matched, conflict = (False, None) if why is None else why
            out.append(run_key_conflict(str(conflict)) if matched and conflict else False)
        return out

    try:
        return backend._pipelined("commit the steps of several runs", locked, batch)
    except psycopg.Error:
        # one statement failed and the batch rolled back: commit each on its own
        return commit_each(backend, items)
