"""The work queue on PostgreSQL: workers on any number of hosts share one database.

Every time that matters (``not_before``, leases, the rate window) is the database server's
clock (``clock_timestamp()``), so hosts whose wall clocks disagree still agree on whether a
lease ran out. Workers take entries with ``FOR UPDATE SKIP LOCKED``: two workers never
wait on, or take, the same row. A queue with limits (:meth:`set_limits`) serializes its
claims on an advisory lock so the count of running entries cannot be overshot.

Every primitive goes through the store backend's retry helpers: after a lost connection
(a database restart) reads and idempotent updates are sent again, and a claim whose
``COMMIT`` got no answer is looked up, so an entry is never handed out twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import time
from collections.abc import Collection, Sequence
from typing import Any

import psycopg

from stepstone.core._threads import to_thread
from stepstone.store._postgres import Cursor, PostgresBackend
from stepstone.store._postgres_async import Failed
from stepstone.store._postgres_conn import Lost, connection_lost
from stepstone.store._postgres_wire import moved, text_rows
from stepstone.store._queue_base import (
    CANCELLED_RUNNING,
    ENTRY_COLUMNS,
    SCHEDULE_COLUMNS,
    Owner,
    QueueBackend,
    QueueEntry,
    ScheduleRow,
    TickEntry,
    entry_from_row,
    free_slots,
    key_in_use,
    rate_window,
    readable,
    schedule_from_row,
)

__all__ = ["PostgresQueue"]

_SCHEDULE_COLS = ", ".join(SCHEDULE_COLUMNS)

NOW = "extract(epoch FROM clock_timestamp())::float8"
COLS = ", ".join(ENTRY_COLUMNS)
QCOLS = ", ".join(f"q.{c}" for c in ENTRY_COLUMNS)

_POISON_SET = f"""
status = 'failed', lease_until = NULL, updated_at = {NOW},
    error = 'its worker died or lost its lease on each of its ' || attempts
        || ' attempts (max_attempts=' || max_attempts || '); last worker ' || coalesce(worker, '?')
        || ' (pid ' || coalesce(pid::text, '?') || ' on host ' || coalesce(host, '?') || ')'
"""

_POISON_SQL = f"""
UPDATE stepstone_queue SET {_POISON_SET}
WHERE queue = %s AND status = 'running' AND lease_until < {NOW} AND attempts >= max_attempts
"""

# An entry whose cancel was requested and whose worker is gone (its lease ran out) ends
# cancelled; no worker takes it again.
_CANCEL_SET = f"status = 'cancelled', lease_until = NULL, updated_at = {NOW}, error = %(cancelled)s"

_CANCEL_SQL = f"""
UPDATE stepstone_queue SET {_CANCEL_SET}
WHERE queue = %(queue)s AND status = 'running' AND lease_until < {NOW} AND cancel_requested
"""

# Runs whose worker died come first (they started before anything still queued), then
# queued ones in the order of the partial index: each query walks its own index.
_PICK_EXPIRED_SQL = f"""
SELECT id FROM stepstone_queue
WHERE queue = %s AND status = 'running' AND lease_until < {NOW}
ORDER BY priority DESC, lease_until
LIMIT %s FOR UPDATE SKIP LOCKED
"""

_PICK_QUEUED_SQL = f"""
SELECT id, cancel_requested FROM stepstone_queue
WHERE queue = %s AND status = 'queued' AND not_before <= {NOW}
ORDER BY priority DESC, not_before, seq
LIMIT %s FOR UPDATE SKIP LOCKED
"""

# A queued entry whose cancel was requested is never taken: an older stepstone's hand-back
# left such entries queued (it ignored the request), and the cancel was acknowledged while
# the run ran. The claim that reaches one marks it cancelled instead.
_SETTLE_SET = f"status = 'cancelled', lease_until = NULL, updated_at = {NOW}, error = %(cancelled)s"

_SETTLE_SQL = f"UPDATE stepstone_queue SET {_SETTLE_SET} WHERE id = ANY(%(ids)s)"

_TAKE_SET = f"""
status = 'running', attempts = q.attempts + 1, worker = %(worker)s, host = %(host)s,
    pid = %(pid)s, pid_start = %(pid_start)s, lease_until = {NOW} + %(lease)s,
    started_at = {NOW}, updated_at = {NOW}
"""

_TAKE_SQL = f"""
UPDATE stepstone_queue q SET {_TAKE_SET}
WHERE id = ANY(%(ids)s) RETURNING {QCOLS}
"""

# The whole claim of a queue without limits as one autocommit statement (one round trip,
# no BEGIN/COMMIT): the sweeps of cancelled and poison entries, the pick of expired then
# queued entries (each with SKIP LOCKED, so concurrent claims never wait on each other),
# and the take; picked queued entries whose cancel was requested are settled cancelled
# instead of taken. Each row answered says what it is (its last column): an entry taken,
# one entry settled (the claim is then sent again for the slots it left free), or
# ``limited``: the queue has limits, nothing was taken, and the claim goes through the
# serialized path (:meth:`PostgresQueue._claim_limited`). The sweeps, the settling and
# the pick select disjoint rows (by ``cancel_requested`` and ``attempts``): one statement
# must not update a row twice.
_CLAIM_SQL = f"""
WITH cancelled AS (
    UPDATE stepstone_queue SET {_CANCEL_SET}
    WHERE id IN (
        SELECT id FROM stepstone_queue
        WHERE queue = %(queue)s AND status = 'running' AND lease_until < {NOW}
            AND cancel_requested
        FOR UPDATE SKIP LOCKED)
    RETURNING id
), poison AS (
    UPDATE stepstone_queue SET {_POISON_SET}
    WHERE id IN (
        SELECT id FROM stepstone_queue
        WHERE queue = %(queue)s AND status = 'running' AND lease_until < {NOW}
            AND attempts >= max_attempts AND NOT cancel_requested
        FOR UPDATE SKIP LOCKED)
    RETURNING id
), limited AS (
    SELECT 1 FROM stepstone_queue_limits
    WHERE queue = %(queue)s AND (concurrency IS NOT NULL OR rate IS NOT NULL)
), expired AS (
    SELECT id, priority, lease_until FROM stepstone_queue
    WHERE queue = %(queue)s AND status = 'running' AND lease_until < {NOW}
        AND attempts < max_attempts AND NOT cancel_requested
    ORDER BY priority DESC, lease_until
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), queued AS (
    SELECT id, priority, not_before, seq, cancel_requested FROM stepstone_queue
    WHERE queue = %(queue)s AND status = 'queued' AND not_before <= {NOW}
    ORDER BY priority DESC, not_before, seq
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), settled AS (
    UPDATE stepstone_queue SET {_SETTLE_SET}
    WHERE id IN (SELECT id FROM queued WHERE cancel_requested)
        AND NOT EXISTS (SELECT 1 FROM limited)
    RETURNING id
), picked AS (
    SELECT id, row_number() OVER () AS ord FROM (
        (SELECT id FROM expired ORDER BY priority DESC, lease_until)
        UNION ALL
        (SELECT id FROM queued WHERE NOT cancel_requested ORDER BY priority DESC, not_before, seq)
    ) AS both_kinds
    WHERE NOT EXISTS (SELECT 1 FROM limited)
    LIMIT %(limit)s
), took AS (
    UPDATE stepstone_queue q SET {_TAKE_SET}
    FROM picked WHERE q.id = picked.id
    RETURNING {QCOLS}, picked.ord
)
SELECT {COLS}, ord, 'took' FROM took
UNION ALL
SELECT {", ".join("NULL" for _ in ENTRY_COLUMNS)}, NULL, 'settled' FROM settled
UNION ALL
SELECT {", ".join("NULL" for _ in ENTRY_COLUMNS)}, NULL, 'limited' FROM limited
"""


def _numbered(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` placeholders as libpq's ``$1``, ``$2``, ... (one number
    per name), and the names in that order: a statement sent past psycopg's cursor."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, sql).encode(), tuple(names)


_CLAIM_WIRE_SQL, _CLAIM_WIRE_NAMES = _numbered(_CLAIM_SQL)

_FINISH_SQL = f"""
UPDATE stepstone_queue SET status = %s, result = %s, error = %s, lease_until = NULL,
    updated_at = {NOW}
WHERE id = %s AND worker = %s AND status = 'running'
"""
_FINISH_RETURNING_SQL = f"{_FINISH_SQL} RETURNING 1".encode()

# Another entry under a submission's run key that has not finished yet.
_BUSY_KEY = """
SELECT id FROM stepstone_queue
WHERE run_key = %s AND id <> %s AND status IN ('queued', 'running') LIMIT 1
"""


def _limit_lock(queue: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"stepstone.queue:{queue}".encode(), digest_size=8).digest(),
        "big",
        signed=True,
    )


class PostgresQueue(QueueBackend):
    """The queue in the ``stepstone_queue`` tables of a :class:`PostgresBackend`."""

    def __init__(self, backend: PostgresBackend) -> None:
        self.backend = backend

    def now(self) -> float:
        return float(self.backend._read("read the clock", lambda cur: _one(cur, f"SELECT {NOW}")))

    def enqueue(
        self,
        *,
        id: str,
        queue: str,
        target: str,
        task: str,
        run_key: str,
        priority: int,
        delay: float,
        not_before: float | None,
        dedupe_key: str | None,
        max_attempts: int,
    ) -> tuple[str, bool]:
        def insert(cur: Cursor) -> tuple[str, bool]:
            row = cur.execute(
                "INSERT INTO stepstone_queue (id, queue, target, task, run_key, priority, "
                "not_before, dedupe_key, status, attempts, max_attempts, created_at, updated_at) "
                f"SELECT %s, %s, %s, %s, %s, %s, coalesce(%s, {NOW} + %s), %s, 'queued', 0, %s, "
                f"{NOW}, {NOW} WHERE NOT EXISTS ({_BUSY_KEY}) ON CONFLICT DO NOTHING RETURNING id",
                (
                    id,
                    queue,
                    target,
                    task,
                    run_key,
                    priority,
                    not_before,
                    delay,
                    dedupe_key,
                    max_attempts,
                    run_key,
                    id,
                ),
            ).fetchone()
            if row is not None:
                return str(row[0]), True
            found, busy = cur.execute(
                "SELECT (SELECT id FROM stepstone_queue WHERE dedupe_key = %s OR id = %s "
                f"LIMIT 1), ({_BUSY_KEY})",
                (dedupe_key, id, run_key, id),
            ).fetchone() or (None, None)
            if found is not None:  # a dedupe key in use, or our own row: a retried insert
                return str(found), str(found) == id
            raise key_in_use(run_key, str(busy))

        # Idempotent: the entry's id is chosen by the caller, so a retry after a lost
        # answer finds the row it inserted (and reports it as inserted). The lock of the
        # run's key makes submits under one key take turns, so two cannot both find the
        # key free.
        return self.backend._transaction("submit a run", [f"stepstone.queue:{run_key}"], insert)

    def claim(
        self,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int = 1,
        held: Collection[str] = (),
    ) -> list[QueueEntry]:
        taken: list[QueueEntry] = []
        while True:
            free = limit - len(taken)
            got = self._claim_once(
                queue, owner, lease_seconds, free, [*held, *(e.id for e in taken)]
            )
            if got is None:  # the queue has limits: take under the queue's lock
                return taken + self._claim_limited(queue, owner, lease_seconds, free)
            entries, settled = got
            taken += entries
            if not settled or len(taken) >= limit:
                return taken
            # entries it settled cancelled instead of taking them left slots free

    async def aclaim(
        self,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int = 1,
        held: Collection[str] = (),
    ) -> list[QueueEntry]:
        """:meth:`claim` with its statement sent on one of the backend's async connections
        (``_postgres_async``), awaited on the loop; a queue with limits, a claim that
        settled entries cancelled, a server error or a lost answer go on in a thread, as
        :meth:`claim` does it."""
        params = _claim_params(queue, owner, lease_seconds, limit)
        try:
            rows = await self.backend._async.send(
                _CLAIM_WIRE_SQL, [params[name] for name in _CLAIM_WIRE_NAMES], text_rows
            )
        except Failed as failed:
            if not failed.lost:  # an error undoes the statement: claim again, in a thread
                return await to_thread(self.claim, queue, owner, lease_seconds, limit, held)
            return await to_thread(
                self._claim_lost, failed, queue, owner, lease_seconds, limit, held
            )
        if rows is None:  # it could not be sent that way
            return await to_thread(self.claim, queue, owner, lease_seconds, limit, held)
        kinds = {r[-1] for r in rows}
        if "limited" in kinds:  # it took nothing
            return await to_thread(self._claim_limited, queue, owner, lease_seconds, limit)
        taken = _took(rows)
        if "settled" in kinds and len(taken) < limit:  # settled entries left slots free
            held = [*held, *(e.id for e in taken)]
            taken += await to_thread(
                self.claim, queue, owner, lease_seconds, limit - len(taken), held
            )
        return taken

    def _claim_lost(
        self,
        failed: Failed,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int,
        held: Collection[str],
    ) -> list[QueueEntry]:
        """:meth:`aclaim` after its connection broke: what the claim took if it committed
        unheard, else a claim again."""
        deadline = time.monotonic() + self.backend.reconnect_timeout
        return self._lost_claim(failed.session, deadline, owner, queue, held) or self.claim(
            queue, owner, lease_seconds, limit, held
        )

    def _claim_once(
        self, queue: str, owner: Owner, lease_seconds: float, limit: int, held: Collection[str]
    ) -> tuple[list[QueueEntry], int] | None:
        """One claim statement: the entries it took and how many it settled cancelled,
        or None when the queue has limits (it took nothing)."""
        params = _claim_params(queue, owner, lease_seconds, limit)

        def take(deadline: float) -> tuple[list[QueueEntry], int] | None:
            with self.backend._connection(deadline - time.monotonic()) as conn:
                session = conn.info.backend_pid
                try:
                    rows = conn.execute(_CLAIM_SQL, params).fetchall()
                except psycopg.Error as exc:
                    if not connection_lost(conn, exc):
                        raise
                    lost = exc
                else:
                    kinds = [r[-1] for r in rows]
                    if "limited" in kinds:
                        return None
                    return _took(rows), kinds.count("settled")
            mine = self._lost_claim(session, deadline, owner, queue, held)
            if mine:
                return mine, 0
            raise Lost(lost) from lost  # nothing was taken: claim again

        return self.backend._retry("take queued runs", take)

    def _lost_claim(
        self, session: int, deadline: float, owner: Owner, queue: str, held: Collection[str]
    ) -> list[QueueEntry]:
        """What a claim sent on the server session ``session``, whose answer was lost,
        took: nothing if it did not commit."""
        # The statement may have committed without our hearing of it: once its server
        # session is gone it has committed or never will. This worker claims one batch at
        # a time, so what it holds beyond ``held`` is that batch.
        self.backend.wait_session_gone(session, deadline)
        rows = self.backend._read(
            "look up a claim whose answer was lost",
            lambda cur: cur.execute(
                f"SELECT {COLS} FROM stepstone_queue WHERE worker = %s AND queue = %s "
                "AND status = 'running' AND NOT (id = ANY(%s)) ORDER BY started_at, seq",
                (owner.worker, queue, sorted(held)),
            ).fetchall(),
        )
        return [entry_from_row(r) for r in rows]

    def _claim_limited(
        self, queue: str, owner: Owner, lease_seconds: float, limit: int
    ) -> list[QueueEntry]:
        """The claim of a queue with limits: serialized on the queue's advisory lock, so
        its count of running entries and its rate window cannot be overshot."""

        def take(cur: Cursor) -> list[QueueEntry]:
            cur.execute(_CANCEL_SQL, {"queue": queue, "cancelled": CANCELLED_RUNNING})
            cur.execute(_POISON_SQL, (queue,))
            limits = cur.execute(
                "SELECT concurrency, rate FROM stepstone_queue_limits WHERE queue = %s", (queue,)
            ).fetchone()
            concurrency, rate = limits if limits is not None else (None, None)
            running = started = 0
            if concurrency is not None or rate is not None:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_limit_lock(queue),))
                running, started = cur.execute(
                    "SELECT count(*) FILTER (WHERE status = 'running' AND lease_until >= "
                    f"{NOW}), count(*) FILTER (WHERE started_at > {NOW} - %s) "
                    "FROM stepstone_queue WHERE queue = %s",
                    (rate_window(rate), queue),
                ).fetchone() or (0, 0)
            free = free_slots(limit, concurrency, int(running), rate, int(started))
            if free <= 0:
                return []
            ids = [r[0] for r in cur.execute(_PICK_EXPIRED_SQL, (queue, free)).fetchall()]
            while len(ids) < free:
                picked = cur.execute(_PICK_QUEUED_SQL, (queue, free - len(ids))).fetchall()
                cancelled = [r[0] for r in picked if r[1]]
                if not cancelled:
                    ids += [r[0] for r in picked]
                    break
                # settled: the next pick passes over them (and picks the others again)
                cur.execute(_SETTLE_SQL, {"ids": cancelled, "cancelled": CANCELLED_RUNNING})
            if not ids:
                return []
            rows = cur.execute(_TAKE_SQL, {**params_of(owner, lease_seconds), "ids": ids})
            order = {entry_id: i for i, entry_id in enumerate(ids)}
            return sorted((entry_from_row(r) for r in rows), key=lambda e: order[e.id])

        return self.backend._transaction("take queued runs", [], take)

    def renew(self, ids: Sequence[str], worker: str, lease_seconds: float) -> dict[str, bool]:
        if not ids:
            return {}

        def renew(cur: Cursor) -> dict[str, bool]:
            rows = cur.execute(
                f"UPDATE stepstone_queue SET lease_until = {NOW} + %s WHERE id = ANY(%s) "
                "AND worker = %s AND status = 'running' RETURNING id, cancel_requested",
                (lease_seconds, list(ids), worker),
            ).fetchall()
            return {str(i): bool(c) for i, c in rows}

        return self.backend._read("renew queue leases", renew)

    def finish(
        self, id: str, worker: str, status: str, result: str | None, error: str | None
    ) -> bool:
        def finish(cur: Cursor) -> bool:
            cur.execute(_FINISH_SQL, (status, result, error, id, worker))
            if cur.rowcount == 1:
                return True
            # A retry after a lost answer finds its own write already there.
            row = cur.execute(
                "SELECT status, worker FROM stepstone_queue WHERE id = %s", (id,)
            ).fetchone()
            return row is not None and row[0] == status and row[1] == worker

        return self.backend._read("record a run's outcome", finish)

    async def afinish(
        self, id: str, worker: str, status: str, result: str | None, error: str | None
    ) -> bool:
        """:meth:`finish` with its update sent on one of the backend's async connections,
        awaited on the loop; one that updated nothing, failed or could not be sent that way
        is settled by :meth:`finish` in a thread (which finds its own write after a lost
        answer)."""
        with contextlib.suppress(Failed):
            done = await self.backend._async.send(
                _FINISH_RETURNING_SQL, (status, result, error, id, worker), moved
            )
            if done:
                return True
        return await to_thread(self.finish, id, worker, status, result, error)

    def hand_back(self, id: str, worker: str, delay: float) -> bool:
        def back(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE stepstone_queue SET "
                "status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
                "error = CASE WHEN cancel_requested THEN %s ELSE error END, "
                "attempts = greatest(attempts - 1, 0), worker = NULL, host = NULL, pid = NULL, "
                "pid_start = NULL, lease_until = NULL, "
                f"not_before = {NOW} + %s, updated_at = {NOW} "
                "WHERE id = %s AND worker = %s AND status = 'running'",
                (CANCELLED_RUNNING, delay, id, worker),
            )
            return cur.rowcount == 1

        return self.backend._read("hand a run back to its queue", back)

    def park(
        self, id: str, worker: str, run_key: str, wake_at: float, topics: Sequence[str]
    ) -> bool:
        # Under the run key's advisory lock, which a message's send takes too (see
        # PostgresBackend.message_send): a message stored before the park makes the entry
        # runnable at once here; one stored after finds it parked and makes it runnable.
        def back(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE stepstone_queue SET "
                "status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
                "error = CASE WHEN cancel_requested THEN %(cancelled)s ELSE error END, "
                "attempts = greatest(attempts - 1, 0), worker = NULL, host = NULL, pid = NULL, "
                "pid_start = NULL, lease_until = NULL, "
                f"not_before = CASE WHEN EXISTS (SELECT 1 FROM stepstone_messages m "
                "WHERE m.run_key = %(key)s AND m.topic = ANY(%(topics)s) "
                f"AND m.consumed_at IS NULL) THEN {NOW} ELSE %(wake)s END, "
                f"updated_at = {NOW} "
                "WHERE id = %(id)s AND worker = %(worker)s AND status = 'running'",
                {
                    "cancelled": CANCELLED_RUNNING,
                    "key": run_key,
                    "topics": list(topics),
                    "wake": wake_at,
                    "id": id,
                    "worker": worker,
                },
            )
            return cur.rowcount == 1

        return self.backend._transaction("park a run", [run_key], back)

    def requeue(self, run_key: str) -> str | None:
        def requeue(cur: Cursor) -> str | None:
            row = cur.execute(
                "UPDATE stepstone_queue SET status = 'queued', attempts = 0, worker = NULL, "
                "host = NULL, pid = NULL, pid_start = NULL, lease_until = NULL, "
                "started_at = NULL, cancel_requested = FALSE, result = NULL, error = NULL, "
                f"not_before = {NOW}, updated_at = {NOW} "
                "WHERE id = (SELECT id FROM stepstone_queue WHERE run_key = %s "
                "ORDER BY seq DESC LIMIT 1 FOR UPDATE) "
                "AND status IN ('done', 'failed', 'cancelled') "
                "AND NOT EXISTS (SELECT 1 FROM stepstone_queue WHERE run_key = %s "
                "AND status IN ('queued', 'running')) RETURNING id",
                (run_key, run_key),
            ).fetchone()
            return None if row is None else str(row[0])

        # one statement: a retry after a lost answer finds the entry queued and changes nothing
        return self.backend._read("put a run back in its queue", requeue)

    def active_entry(self, run_key: str) -> str | None:
        row = self.backend._read(
            "find a run's queue entry",
            lambda cur: cur.execute(
                "SELECT id FROM stepstone_queue WHERE run_key = %s "
                "AND status IN ('queued', 'running') ORDER BY seq DESC LIMIT 1",
                (run_key,),
            ).fetchone(),
        )
        return None if row is None else str(row[0])

    # -- schedules -------------------------------------------------------------------------
    def schedule_put(self, row: ScheduleRow) -> None:
        marks = ", ".join(["%s"] * len(SCHEDULE_COLUMNS))
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in SCHEDULE_COLUMNS[1:])
        values = tuple(getattr(row, c) for c in SCHEDULE_COLUMNS)
        self.backend._read(
            "store a schedule",
            lambda cur: cur.execute(
                f"INSERT INTO stepstone_schedules ({_SCHEDULE_COLS}) VALUES ({marks}) "
                f"ON CONFLICT (name) DO UPDATE SET {updates}",
                values,
            ),
        )

    def schedule_get(self, name: str) -> ScheduleRow | None:
        row = self.backend._read(
            "read a schedule",
            lambda cur: cur.execute(
                f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules WHERE name = %s", (name,)
            ).fetchone(),
        )
        return None if row is None else schedule_from_row(row)

    def schedules(self) -> list[ScheduleRow]:
        rows = self.backend._read(
            "list schedules",
            lambda cur: cur.execute(
                f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules ORDER BY name"
            ).fetchall(),
        )
        return [schedule_from_row(r) for r in rows]

    def schedule_pause(self, name: str, paused: bool, next_tick: float | None) -> bool:
        def pause(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE stepstone_schedules SET paused = %s, "
                f"next_tick = coalesce(%s, next_tick), updated_at = {NOW} WHERE name = %s",
                (paused, next_tick, name),
            )
            return cur.rowcount == 1

        return self.backend._read("pause or resume a schedule", pause)

    def schedule_delete(self, name: str) -> bool:
        def delete(cur: Cursor) -> bool:
            cur.execute("DELETE FROM stepstone_schedules WHERE name = %s", (name,))
            return cur.rowcount == 1

        return self.backend._read("delete a schedule", delete)

    def schedules_due(self, queues: Sequence[str]) -> list[ScheduleRow]:
        rows = self.backend._read(
            "find due schedules",
            lambda cur: cur.execute(
                f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules WHERE NOT paused "
                f"AND next_tick <= {NOW} AND queue = ANY(%s) ORDER BY next_tick",
                (list(queues),),
            ).fetchall(),
        )
        return [schedule_from_row(r) for r in rows]

    def schedule_fire(
        self, name: str, expected_next: float, new_next: float, entries: Sequence[TickEntry]
    ) -> list[str] | None:
        last = max((e.tick for e in entries), default=None)

        def fire(cur: Cursor) -> list[str] | None:
            row = cur.execute(
                "UPDATE stepstone_schedules SET next_tick = %s, "
                f"last_tick = coalesce(%s, last_tick), updated_at = {NOW} "
                "WHERE name = %s AND next_tick = %s AND NOT paused "
                "RETURNING queue, target, priority, max_attempts",
                (new_next, last, name, expected_next),
            ).fetchone()
            if row is None:
                return None
            queue, target, priority, max_attempts = row
            queued: list[str] = []
            for entry in entries:
                got = cur.execute(
                    "INSERT INTO stepstone_queue (id, queue, target, task, run_key, priority, "
                    "not_before, dedupe_key, status, attempts, max_attempts, created_at, "
                    f"updated_at) VALUES (%s, %s, %s, %s, %s, %s, {NOW}, %s, 'queued', 0, %s, "
                    f"{NOW}, {NOW}) ON CONFLICT DO NOTHING RETURNING id",
                    (
                        entry.id,
                        queue,
                        target,
                        entry.task,
                        entry.run_key,
                        priority,
                        entry.dedupe_key,
                        max_attempts,
                    ),
                ).fetchone()
                if got is not None:
                    queued.append(str(got[0]))
            return queued

        # One transaction (retried whole after a lost connection unless it committed):
        # the next tick moves exactly when its runs are queued.
        return self.backend._transaction("queue a schedule's runs", [], fire)

    def latest_entry(self, run_key: str) -> QueueEntry | None:
        row = self.backend._read(
            "read a queued run",
            lambda cur: cur.execute(
                f"SELECT {COLS} FROM stepstone_queue WHERE run_key = %s ORDER BY seq DESC LIMIT 1",
                (run_key,),
            ).fetchone(),
        )
        return None if row is None else entry_from_row(row)

    def get(self, id: str) -> QueueEntry | None:
        row = self.backend._read(
            "read a queued run",
            lambda cur: cur.execute(
                f"SELECT {COLS} FROM stepstone_queue WHERE id = %s", (id,)
            ).fetchone(),
        )
        return None if row is None else entry_from_row(row)

    def cancel(self, id: str) -> str | None:
        def cancel(cur: Cursor) -> str | None:
            cur.execute(
                "UPDATE stepstone_queue SET "
                "status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END, "
                "error = CASE WHEN status = 'queued' THEN 'cancelled before it started' "
                "ELSE error END, "
                f"cancel_requested = (status = 'running'), updated_at = {NOW} "
                "WHERE id = %s AND status IN ('queued', 'running')",
                (id,),
            )
            row = cur.execute(
                "SELECT status, CASE WHEN cancel_requested THEN "
                "pg_notify('stepstone', 'r:' || left(md5(run_key), 16)) END "
                "FROM stepstone_queue WHERE id = %s",
                (id,),
            ).fetchone()  # a run waiting in its worker hears of its cancel at once
            return None if row is None else str(row[0])

        return self.backend._read("cancel a queued run", cancel)

    def running_on(self, host: str) -> list[QueueEntry]:
        rows = self.backend._read(
            "list running entries",
            lambda cur: cur.execute(
                f"SELECT {COLS} FROM stepstone_queue WHERE status = 'running' AND host = %s",
                (host,),
            ).fetchall(),
        )
        return readable(rows, entry_from_row)

    def expire(self, id: str, worker: str) -> bool:
        def expire(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE stepstone_queue SET lease_until = 0 "
                "WHERE id = %s AND worker = %s AND status = 'running'",
                (id, worker),
            )
            return cur.rowcount == 1

        return self.backend._read("expire a dead worker's lease", expire)

    def probe(self, timeout: float) -> str | None:
        # A connection of its own, not the pool's: the pool would wait out its turn and
        # the backend retry for reconnect_timeout, which is what a probe must not do.
        try:
            with psycopg.connect(
                self.backend.url, autocommit=True, connect_timeout=max(2, math.ceil(timeout))
            ) as conn:
                conn.execute("SELECT 1")
        except (psycopg.Error, OSError) as exc:
            return str(exc)
        return None

    def set_limits(self, queue: str, *, concurrency: int | None, rate: float | None) -> None:
        self.backend._read(
            "set queue limits",
            lambda cur: cur.execute(
                "INSERT INTO stepstone_queue_limits (queue, concurrency, rate) VALUES (%s, %s, %s) "
                "ON CONFLICT (queue) DO UPDATE SET concurrency = EXCLUDED.concurrency, "
                "rate = EXCLUDED.rate",
                (queue, concurrency, rate),
            ),
        )

    def entries(self, queue: str | None, status: str | None) -> list[QueueEntry]:
        rows = self.backend._read(
            "list queued runs",
            lambda cur: cur.execute(
                f"SELECT {COLS} FROM stepstone_queue WHERE (%s::text IS NULL OR queue = %s) "
                "AND (%s::text IS NULL OR status = %s) ORDER BY seq",
                (queue, queue, status, status),
            ).fetchall(),
        )
        return [entry_from_row(r) for r in rows]

    def prune(self, older_than: float, queue: str | None) -> int:
        def prune(cur: Cursor) -> int:
            cur.execute(
                "DELETE FROM stepstone_queue WHERE status IN ('done', 'failed', 'cancelled') "
                f"AND updated_at < {NOW} - %s AND (%s::text IS NULL OR queue = %s)",
                (older_than, queue, queue),
            )
            return cur.rowcount

        # idempotent: a retry after a lost answer deletes what is left to delete
        return int(self.backend._read("prune finished queue entries", prune))


def _claim_params(queue: str, owner: Owner, lease_seconds: float, limit: int) -> dict[str, Any]:
    return {
        "queue": queue,
        "limit": limit,
        "cancelled": CANCELLED_RUNNING,
        **params_of(owner, lease_seconds),
    }


def _took(rows: Sequence[Sequence[Any]]) -> list[QueueEntry]:
    """The entries a claim statement took, in the order it picked them."""
    took = sorted((r for r in rows if r[-1] == "took"), key=lambda r: int(r[-2]))
    return [entry_from_row(r[:-2]) for r in took]


def params_of(owner: Owner, lease_seconds: float) -> dict[str, Any]:
    """The take's parameters: who takes, for how long."""
    return {
        "worker": owner.worker,
        "host": owner.host,
        "pid": owner.pid,
        "pid_start": owner.pid_start,
        "lease": lease_seconds,
    }


def _one(cur: Cursor, sql: str, params: Any = ()) -> Any:
    row = cur.execute(sql.encode(), params).fetchone()
    return None if row is None else row[0]
