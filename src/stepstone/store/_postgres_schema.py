"""The PostgreSQL schema and the SQL the backend runs; pure text and row conversion.

Tables are prefixed ``stepstone_`` so they can share a database (or schema) with others.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepstone.exceptions import StoreError
from stepstone.store._base import HEAD_COLUMNS, prefix_bounds

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CLAIM_HEAD",
    "CLAIM_FRESH_SQL",
    "CLAIM_READ_ASYNC_SQL",
    "CLAIM_READ_SQL",
    "DELETE_SQL",
    "INSERT_JOURNAL_SQL",
    "JOURNAL_TIMES",
    "KEY_STATE_SQL",
    "PUT_HEAD_SQL",
    "HEAD_COLS",
    "KEY_LOCK_CLASS",
    "LOCK_XID_SQL",
    "MIGRATIONS",
    "PUT_SQL",
    "UPSERT_KV_SQL",
    "check_schema",
    "lock_id",
    "lock_ids",
    "migrate",
    "prefix_where",
]

#: Schema changes in order; the list index + 1 is the schema version recorded in
#: ``stepstone_schema``. Never edit an entry, append a new one. Keys use the "C" collation:
#: byte order is code point order (as Python sorts), and equality is exact.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE stepstone_kv (
        key TEXT COLLATE "C" PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE stepstone_runs (
        key TEXT COLLATE "C" PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        next_step TEXT,
        run_uid TEXT NOT NULL,
        version BIGINT NOT NULL,
        iteration BIGINT NOT NULL,
        journal_len BIGINT NOT NULL,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        pid_start BIGINT,
        lease_until DOUBLE PRECISION NOT NULL,
        meta TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE stepstone_journal (
        run_key TEXT COLLATE "C" NOT NULL,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT,
        data TEXT NOT NULL,
        PRIMARY KEY (run_key, seq)
    );
    """,
    # The work queue (``stepstone worker``): one row per submitted run, plus per-queue
    # limits every worker obeys.
    """
    CREATE TABLE stepstone_queue (
        seq BIGSERIAL NOT NULL UNIQUE,
        id TEXT COLLATE "C" PRIMARY KEY,
        queue TEXT COLLATE "C" NOT NULL,
        target TEXT NOT NULL,
        task TEXT NOT NULL,
        run_key TEXT COLLATE "C" NOT NULL,
        priority INTEGER NOT NULL,
        not_before DOUBLE PRECISION NOT NULL,
        dedupe_key TEXT COLLATE "C" UNIQUE,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        worker TEXT,
        host TEXT,
        pid BIGINT,
        pid_start BIGINT,
        lease_until DOUBLE PRECISION,
        started_at DOUBLE PRECISION,
        cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
        result TEXT,
        error TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX stepstone_queue_ready ON stepstone_queue (queue, priority DESC, not_before, seq)
        WHERE status = 'queued';
    CREATE INDEX stepstone_queue_running ON stepstone_queue (queue, lease_until)
        WHERE status = 'running';
    CREATE TABLE stepstone_queue_limits (
        queue TEXT COLLATE "C" PRIMARY KEY,
        concurrency INTEGER,
        rate DOUBLE PRECISION
    );
    """,
    # A step's whole commit as one statement (COMMIT_FN_SQL): the advisory locks of its
    # writes= keys, then the compare-and-swap of the head with the journal rows and the
    # writes. In a VOLATILE function each statement takes a fresh snapshot (READ
    # COMMITTED), so the commit sees everything committed under those locks, as the
    # two pipelined statements it replaces did, in one statement the server parses once.
    """
    CREATE FUNCTION stepstone_commit(
        p_lock_class INT4, p_lock_ids INT4[], p_status TEXT, p_next_step TEXT,
        p_version INT8, p_iteration INT8, p_journal_len INT8, p_lease_until FLOAT8,
        p_meta TEXT, p_updated_at FLOAT8, p_key TEXT, p_expected INT8, p_run_uid TEXT,
        p_seqs INT8[], p_kinds TEXT[], p_names TEXT[], p_datas TEXT[],
        p_wkeys TEXT[], p_wvals TEXT[],
        OUT applied INT8, OUT matched INT8, OUT conflict TEXT
    ) LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        IF cardinality(p_lock_ids) > 0 THEN
            PERFORM pg_advisory_xact_lock(p_lock_class, id) FROM unnest(p_lock_ids) AS id;
        END IF;
        WITH upd AS (
            UPDATE stepstone_runs SET status = p_status, next_step = p_next_step,
                version = p_version, iteration = p_iteration, journal_len = p_journal_len,
                lease_until = p_lease_until, meta = p_meta, updated_at = p_updated_at
            WHERE key = p_key AND version = p_expected AND run_uid = p_run_uid
              AND NOT EXISTS (SELECT 1 FROM stepstone_runs r WHERE r.key = ANY(p_wkeys))
            RETURNING key
        ), j AS (
            INSERT INTO stepstone_journal (run_key, seq, kind, name, data)
            SELECT upd.key, r.seq, r.kind, r.name, r.data FROM upd,
                unnest(p_seqs, p_kinds, p_names, p_datas) AS r(seq, kind, name, data)
        ), w AS (
            INSERT INTO stepstone_kv (key, value, updated_at)
            SELECT w.key, w.value, p_updated_at FROM upd,
                unnest(p_wkeys, p_wvals) AS w(key, value)
            ON CONFLICT (key) DO UPDATE
                SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
        )
        SELECT count(*) INTO applied FROM upd;
        IF applied > 0 THEN
            matched := 1;
            RETURN;
        END IF;
        SELECT count(*) INTO matched FROM stepstone_runs
            WHERE key = p_key AND version = p_expected AND run_uid = p_run_uid;
        SELECT min(key) INTO conflict FROM stepstone_runs WHERE key = ANY(p_wkeys);
    END
    $fn$;
    """,
    # A step commit is now one plain statement per shape (see _postgres_commit): the
    # key_free functions take the advisory locks of its writes= keys and then, in a
    # snapshot of their own (VOLATILE), check that none of those keys holds a run.
    # stepstone_commit is gone. stepstone_claim_read does a claim's reads in one call.
    """
    CREATE FUNCTION stepstone_key_free(p_lock_class INT4, p_lock_id INT4, p_key TEXT)
    RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock_class, p_lock_id);
        RETURN NOT EXISTS (SELECT 1 FROM stepstone_runs WHERE key = p_key);
    END
    $fn$;
    CREATE FUNCTION stepstone_keys_free(p_lock_class INT4, p_lock_ids INT4[], p_keys TEXT[])
    RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock_class, id)
            FROM (SELECT DISTINCT id FROM unnest(p_lock_ids) AS u(id) ORDER BY id) AS ids;
        RETURN NOT EXISTS (SELECT 1 FROM stepstone_runs WHERE key = ANY(p_keys));
    END
    $fn$;
    DROP FUNCTION stepstone_commit(INT4, INT4[], TEXT, TEXT, INT8, INT8, INT8, FLOAT8, TEXT,
        FLOAT8, TEXT, INT8, TEXT, INT8[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[]);
    -- A claim's reads in one call: the key's advisory lock, the transaction id, the key's
    -- plain value and its run head FOR UPDATE, each read in a snapshot taken after the lock.
    CREATE FUNCTION stepstone_claim_read(p_lock_class INT4, p_lock_id INT4, p_key TEXT)
    RETURNS TABLE (o_xid INT8, o_value TEXT, o_key TEXT, o_kind TEXT, o_status TEXT,
        o_next_step TEXT, o_run_uid TEXT, o_version INT8, o_iteration INT8,
        o_journal_len INT8, o_host TEXT, o_pid INT8, o_pid_start INT8,
        o_lease_until FLOAT8, o_meta TEXT, o_created_at FLOAT8, o_updated_at FLOAT8)
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        v_xid INT8;
        v_value TEXT;
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock_class, p_lock_id);
        v_xid := txid_current();
        SELECT kv.value INTO v_value FROM stepstone_kv kv WHERE kv.key = p_key;
        RETURN QUERY SELECT v_xid, v_value, r.key::TEXT, r.kind, r.status, r.next_step,
            r.run_uid, r.version, r.iteration, r.journal_len, r.host, r.pid, r.pid_start,
            r.lease_until, r.meta, r.created_at, r.updated_at
            FROM stepstone_runs r WHERE r.key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            o_xid := v_xid;
            o_value := v_value;
            RETURN NEXT;
        END IF;
    END
    $fn$;
    """,
    # A new run's claim as one call (one round trip): the key's lock and reads as in
    # stepstone_claim_read; the new head goes in only when the key holds neither a value
    # nor a run, and journal rows left under the key, if any, are dropped (as a fresh
    # claim's reset does). Returns whether the head went in, then what the reads found.
    # Its transaction commits without waiting for the WAL flush (for it alone).
    """
    CREATE FUNCTION stepstone_claim_fresh(p_lock_class INT4, p_lock_id INT4, p_key TEXT,
        p_kind TEXT, p_status TEXT, p_next_step TEXT, p_run_uid TEXT, p_version INT8,
        p_iteration INT8, p_journal_len INT8, p_host TEXT, p_pid INT8, p_pid_start INT8,
        p_lease_until FLOAT8, p_meta TEXT, p_created_at FLOAT8, p_updated_at FLOAT8)
    RETURNS TABLE (o_inserted BOOLEAN, o_xid INT8, o_value TEXT, o_key TEXT, o_kind TEXT,
        o_status TEXT, o_next_step TEXT, o_run_uid TEXT, o_version INT8, o_iteration INT8,
        o_journal_len INT8, o_host TEXT, o_pid INT8, o_pid_start INT8,
        o_lease_until FLOAT8, o_meta TEXT, o_created_at FLOAT8, o_updated_at FLOAT8)
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        v_inserted BOOLEAN := FALSE;
    BEGIN
        PERFORM set_config('synchronous_commit', 'off', true);
        IF NOT EXISTS (SELECT 1 FROM stepstone_claim_read(p_lock_class, p_lock_id, p_key) c
                WHERE c.o_value IS NOT NULL OR c.o_key IS NOT NULL) THEN
            INSERT INTO stepstone_runs VALUES (p_key, p_kind, p_status, p_next_step,
                p_run_uid, p_version, p_iteration, p_journal_len, p_host, p_pid,
                p_pid_start, p_lease_until, p_meta, p_created_at, p_updated_at)
                ON CONFLICT (key) DO NOTHING;
            v_inserted := FOUND;
            IF v_inserted THEN
                DELETE FROM stepstone_journal WHERE run_key = p_key;
            END IF;
        END IF;
        RETURN QUERY SELECT v_inserted, c.*
            FROM stepstone_claim_read(p_lock_class, p_lock_id, p_key) c;
    END
    $fn$;
    """,
    # A run's queue entries are found by run_key (the check that a submitted key is not
    # queued or running, a retry's requeue, a cancel's entry): an index, not a scan.
    #
    # A step commit whose one writes= key already holds a value locks that value's row
    # FOR KEY SHARE instead of taking the key's advisory lock (see _postgres_commit). So a
    # claim reads the key's value FOR UPDATE: a claim that imports a legacy value (and
    # drops it) waits for such a commit and reads what it wrote.
    #
    # A claim of an empty key (stepstone_claim_fresh) reads only what it needs: the key's
    # lock, then whether it holds a value; the full claim read only when it found one or
    # a run (it then inserts nothing).
    """
    CREATE INDEX stepstone_queue_run_key ON stepstone_queue (run_key);
    CREATE OR REPLACE FUNCTION stepstone_claim_read(p_lock_class INT4, p_lock_id INT4,
        p_key TEXT)
    RETURNS TABLE (o_xid INT8, o_value TEXT, o_key TEXT, o_kind TEXT, o_status TEXT,
        o_next_step TEXT, o_run_uid TEXT, o_version INT8, o_iteration INT8,
        o_journal_len INT8, o_host TEXT, o_pid INT8, o_pid_start INT8,
        o_lease_until FLOAT8, o_meta TEXT, o_created_at FLOAT8, o_updated_at FLOAT8)
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        v_xid INT8;
        v_value TEXT;
    BEGIN
        PERFORM pg_advisory_xact_lock(p_lock_class, p_lock_id);
        v_xid := txid_current();
        SELECT kv.value INTO v_value FROM stepstone_kv kv WHERE kv.key = p_key FOR UPDATE;
        RETURN QUERY SELECT v_xid, v_value, r.key::TEXT, r.kind, r.status, r.next_step,
            r.run_uid, r.version, r.iteration, r.journal_len, r.host, r.pid, r.pid_start,
            r.lease_until, r.meta, r.created_at, r.updated_at
            FROM stepstone_runs r WHERE r.key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            o_xid := v_xid;
            o_value := v_value;
            RETURN NEXT;
        END IF;
    END
    $fn$;
    CREATE OR REPLACE FUNCTION stepstone_claim_fresh(p_lock_class INT4, p_lock_id INT4,
        p_key TEXT, p_kind TEXT, p_status TEXT, p_next_step TEXT, p_run_uid TEXT,
        p_version INT8, p_iteration INT8, p_journal_len INT8, p_host TEXT, p_pid INT8,
        p_pid_start INT8, p_lease_until FLOAT8, p_meta TEXT, p_created_at FLOAT8,
        p_updated_at FLOAT8)
    RETURNS TABLE (o_inserted BOOLEAN, o_xid INT8, o_value TEXT, o_key TEXT, o_kind TEXT,
        o_status TEXT, o_next_step TEXT, o_run_uid TEXT, o_version INT8, o_iteration INT8,
        o_journal_len INT8, o_host TEXT, o_pid INT8, o_pid_start INT8,
        o_lease_until FLOAT8, o_meta TEXT, o_created_at FLOAT8, o_updated_at FLOAT8)
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM set_config('synchronous_commit', 'off', true);
        PERFORM pg_advisory_xact_lock(p_lock_class, p_lock_id);
        IF NOT EXISTS (SELECT 1 FROM stepstone_kv WHERE key = p_key) THEN
            INSERT INTO stepstone_runs VALUES (p_key, p_kind, p_status, p_next_step,
                p_run_uid, p_version, p_iteration, p_journal_len, p_host, p_pid,
                p_pid_start, p_lease_until, p_meta, p_created_at, p_updated_at)
                ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                DELETE FROM stepstone_journal WHERE run_key = p_key;
                o_inserted := TRUE;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
        RETURN QUERY SELECT FALSE, c.*
            FROM stepstone_claim_read(p_lock_class, p_lock_id, p_key) c;
    END
    $fn$;
    """,
    # A step commit for connections that prepare nothing (PostgresBackend(prepare=False),
    # as behind PgBouncer in transaction mode): the commit statement is then parsed and
    # planned on every step, which costs the server more than the commit's writes. Its
    # statements inside a plpgsql function are planned once per connection instead. Same
    # writes, locks and answer as the statement (see _postgres_commit): a lone writes=
    # key that holds a value is locked FOR KEY SHARE, other keys by stepstone_keys_free
    # (whose check runs in a snapshot taken after the locks); then the compare-and-swap of
    # the head; the rows and values only when it applied. Returns 1, or 0 when nothing
    # was written.
    """
    CREATE FUNCTION stepstone_step_commit(p_status TEXT, p_next_step TEXT, p_version INT8,
        p_iteration INT8, p_journal_len INT8, p_lease_until FLOAT8, p_meta TEXT,
        p_updated_at FLOAT8, p_key TEXT, p_expected INT8, p_run_uid TEXT,
        p_lock_class INT4, p_lock_ids INT4[], p_wkeys TEXT[], p_wvalues TEXT[],
        p_seqs INT8[], p_kinds TEXT[], p_names TEXT[], p_datas TEXT[])
    RETURNS INT8 LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        IF cardinality(p_wkeys) = 1 AND EXISTS (
            SELECT 1 FROM stepstone_kv WHERE key = p_wkeys[1] FOR KEY SHARE
        ) THEN
            NULL;
        ELSIF cardinality(p_wkeys) > 0
            AND NOT stepstone_keys_free(p_lock_class, p_lock_ids, p_wkeys) THEN
            RETURN 0;
        END IF;
        UPDATE stepstone_runs SET status = p_status, next_step = p_next_step,
            version = p_version, iteration = p_iteration, journal_len = p_journal_len,
            lease_until = p_lease_until, meta = p_meta, updated_at = p_updated_at
            WHERE key = p_key AND version = p_expected AND run_uid = p_run_uid;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
        INSERT INTO stepstone_journal (run_key, seq, kind, name, data)
            SELECT p_key, r.seq, r.kind, r.name, r.data
            FROM unnest(p_seqs, p_kinds, p_names, p_datas) AS r(seq, kind, name, data);
        INSERT INTO stepstone_kv (key, value, updated_at)
            SELECT w.key, w.value, p_updated_at
            FROM unnest(p_wkeys, p_wvalues) AS w(key, value)
            ON CONFLICT (key) DO UPDATE
                SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
        RETURN 1;
    END
    $fn$;
    """,
    # What a run keeps beside its journal (store/_extras.py): its timers, the messages
    # sent to it, its events and its streams. A new message, event or stream value
    # notifies the channel 'stepstone' with the run's topic ('r:' and the first 16 hex
    # digits of the md5 of its key: store/_changes.py), in its own transaction.
    """
    CREATE TABLE stepstone_timers (
        run_key TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        wake_at DOUBLE PRECISION,
        topic TEXT COLLATE "C",
        since DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_key, name)
    );
    CREATE TABLE stepstone_messages (
        id BIGSERIAL PRIMARY KEY,
        run_key TEXT COLLATE "C" NOT NULL,
        topic TEXT COLLATE "C" NOT NULL,
        data TEXT NOT NULL,
        sent_at DOUBLE PRECISION NOT NULL,
        consumed_at DOUBLE PRECISION
    );
    CREATE INDEX stepstone_messages_run ON stepstone_messages (run_key, id);
    CREATE INDEX stepstone_messages_pending ON stepstone_messages (run_key, topic, id)
        WHERE consumed_at IS NULL;
    CREATE TABLE stepstone_events (
        run_key TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        data TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_key, name)
    );
    CREATE TABLE stepstone_streams (
        run_key TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        pos BIGINT NOT NULL,
        data TEXT NOT NULL,
        attempt INTEGER,
        written_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_key, name, pos)
    );
    CREATE FUNCTION stepstone_notify_run() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        PERFORM pg_notify('stepstone', 'r:' || left(md5(NEW.run_key), 16));
        RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER stepstone_messages_notify AFTER INSERT ON stepstone_messages
        FOR EACH ROW EXECUTE FUNCTION stepstone_notify_run();
    CREATE TRIGGER stepstone_events_notify AFTER INSERT OR UPDATE ON stepstone_events
        FOR EACH ROW EXECUTE FUNCTION stepstone_notify_run();
    CREATE TRIGGER stepstone_streams_notify AFTER INSERT ON stepstone_streams
        FOR EACH ROW EXECUTE FUNCTION stepstone_notify_run();
    -- Schedules (store/_queue_base.py, ScheduleRow): a queued run at every cron tick.
    CREATE TABLE stepstone_schedules (
        name TEXT COLLATE "C" PRIMARY KEY,
        target TEXT NOT NULL,
        cron TEXT NOT NULL,
        timezone TEXT NOT NULL,
        queue TEXT COLLATE "C" NOT NULL,
        task TEXT NOT NULL,
        priority INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        catch_up TEXT NOT NULL,
        grace DOUBLE PRECISION NOT NULL,
        paused BOOLEAN NOT NULL,
        next_tick DOUBLE PRECISION NOT NULL,
        last_tick DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # The webhook outbox (store/_webhooks.py): deliveries a server owes, by id.
    """
    CREATE TABLE stepstone_webhooks (
        id TEXT COLLATE "C" PRIMARY KEY,
        run_key TEXT COLLATE "C" NOT NULL,
        url TEXT NOT NULL,
        event TEXT NOT NULL,
        status TEXT NOT NULL,
        payload TEXT,
        attempts BIGINT NOT NULL,
        next_at DOUBLE PRECISION NOT NULL,
        lease_until DOUBLE PRECISION NOT NULL,
        owner TEXT,
        log TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        version BIGINT NOT NULL
    );
    CREATE INDEX stepstone_webhooks_run ON stepstone_webhooks (run_key, created_at);
    CREATE INDEX stepstone_webhooks_open ON stepstone_webhooks (status, next_at);
    """,
]

#: When the work a journal row records started and when its commit was made (database
#: clock), for operators; older rows keep NULL. A step commit fills committed_at from the
#: head it moves, in the same statement. The commit function for connections that prepare
#: nothing gains the rows' start times (an overload: the older one stays for a process of
#: the previous version still running).
JOURNAL_TIMES = """
    ALTER TABLE stepstone_journal ADD COLUMN started_at DOUBLE PRECISION,
        ADD COLUMN committed_at DOUBLE PRECISION;
    CREATE FUNCTION stepstone_step_commit(p_status TEXT, p_next_step TEXT, p_version INT8,
        p_iteration INT8, p_journal_len INT8, p_lease_until FLOAT8, p_meta TEXT,
        p_updated_at FLOAT8, p_key TEXT, p_expected INT8, p_run_uid TEXT,
        p_lock_class INT4, p_lock_ids INT4[], p_wkeys TEXT[], p_wvalues TEXT[],
        p_seqs INT8[], p_kinds TEXT[], p_names TEXT[], p_datas TEXT[], p_starteds FLOAT8[])
    RETURNS INT8 LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        IF cardinality(p_wkeys) = 1 AND EXISTS (
            SELECT 1 FROM stepstone_kv WHERE key = p_wkeys[1] FOR KEY SHARE
        ) THEN
            NULL;
        ELSIF cardinality(p_wkeys) > 0
            AND NOT stepstone_keys_free(p_lock_class, p_lock_ids, p_wkeys) THEN
            RETURN 0;
        END IF;
        UPDATE stepstone_runs SET status = p_status, next_step = p_next_step,
            version = p_version, iteration = p_iteration, journal_len = p_journal_len,
            lease_until = p_lease_until, meta = p_meta, updated_at = p_updated_at
            WHERE key = p_key AND version = p_expected AND run_uid = p_run_uid;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
        INSERT INTO stepstone_journal (run_key, seq, kind, name, data, started_at,
                committed_at)
            SELECT p_key, r.seq, r.kind, r.name, r.data, r.started, p_updated_at
            FROM unnest(p_seqs, p_kinds, p_names, p_datas, p_starteds)
                AS r(seq, kind, name, data, started);
        INSERT INTO stepstone_kv (key, value, updated_at)
            SELECT w.key, w.value, p_updated_at
            FROM unnest(p_wkeys, p_wvalues) AS w(key, value)
            ON CONFLICT (key) DO UPDATE
                SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
        RETURN 1;
    END
    $fn$;
"""
MIGRATIONS.append(JOURNAL_TIMES)

# Advisory lock ids. Per-key locks use the two-int4 form (class, hash of the key), which
# PostgreSQL keeps apart from the one-bigint form the schema lock uses.
KEY_LOCK_CLASS = 0x53545053  # "STPS"
SCHEMA_LOCK = int.from_bytes(
    hashlib.blake2b(b"stepstone.schema", digest_size=8).digest(), "big", signed=True
)

HEAD_COLS = ", ".join(HEAD_COLUMNS)

# Take the per-key locks in the order of the (sorted) array, and return the transaction
# id, by which a COMMIT whose answer was lost is looked up later.
LOCK_XID_SQL = (
    "SELECT txid_current(), count(pg_advisory_xact_lock(%s, id)) FROM unnest(%s::int4[]) AS id"
)

UPSERT_KV_SQL = (
    "INSERT INTO stepstone_kv (key, value, updated_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at"
)

# A plain write, unless the key holds a run (then no row comes back): stepstone_key_free
# takes the key's advisory lock, then checks for a run in a snapshot of its own.
PUT_SQL = (
    "INSERT INTO stepstone_kv (key, value, updated_at) "
    f"SELECT %s, %s, %s WHERE stepstone_key_free({KEY_LOCK_CLASS}, %s::int4, %s) "
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at "
    "RETURNING 1"
)


# The claim's reads in one call (see stepstone_claim_read): the transaction id, the key's
# value, then the head's columns (CLAIM_HEAD: None when the key holds no run).
CLAIM_READ_SQL = f"SELECT * FROM stepstone_claim_read({KEY_LOCK_CLASS}, %s::int4, %s)"
CLAIM_HEAD = slice(2, 2 + len(HEAD_COLUMNS))
# The same for a run's claim, which also sets its transaction to commit without waiting
# for the WAL flush (see PostgresBackend.run_claim): local to the transaction, so a pooled
# connection keeps synchronous commits for everything else. The function always returns
# one row, so set_config always runs.
CLAIM_READ_ASYNC_SQL = (
    "SELECT c.*, set_config('synchronous_commit', 'off', true) "
    f"FROM stepstone_claim_read({KEY_LOCK_CLASS}, %s::int4, %s) AS c"
)
KEY_STATE_SQL = (
    "SELECT EXISTS (SELECT 1 FROM stepstone_runs WHERE key = %s), "
    "(SELECT value FROM stepstone_kv WHERE key = %s)"
)
DELETE_SQL = (
    "WITH v AS (DELETE FROM stepstone_kv WHERE key = %(key)s RETURNING 1), "
    "r AS (DELETE FROM stepstone_runs WHERE key = %(key)s RETURNING 1), "
    "j AS (DELETE FROM stepstone_journal WHERE run_key = %(key)s), "
    "t AS (DELETE FROM stepstone_timers WHERE run_key = %(key)s), "
    "m AS (DELETE FROM stepstone_messages WHERE run_key = %(key)s), "
    "e AS (DELETE FROM stepstone_events WHERE run_key = %(key)s), "
    "s AS (DELETE FROM stepstone_streams WHERE run_key = %(key)s) "
    "SELECT (SELECT count(*) FROM v) + (SELECT count(*) FROM r)"
)
# A claim's writes: reset the journal and drop the plain value when asked, put the head.
PUT_HEAD_SQL = (
    "WITH j AS (DELETE FROM stepstone_journal WHERE run_key = %s AND %s::bool), "
    "v AS (DELETE FROM stepstone_kv WHERE key = %s AND %s::bool), "
    # a fresh start drops the run's timers, events and streams with its journal
    "t AS (DELETE FROM stepstone_timers WHERE run_key = %s AND %s::bool), "
    "e AS (DELETE FROM stepstone_events WHERE run_key = %s AND %s::bool), "
    "s AS (DELETE FROM stepstone_streams WHERE run_key = %s AND %s::bool) "
    f"INSERT INTO stepstone_runs ({HEAD_COLS}) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in HEAD_COLS.split(", ")[1:])
)
# A claim of a key that holds nothing yet (see stepstone_claim_fresh): one round trip. Its
# row is whether the head went in, then the claim read's row (CLAIM_HEAD as there, one on).
CLAIM_FRESH_SQL = (
    f"SELECT * FROM stepstone_claim_fresh({KEY_LOCK_CLASS}, %s::int4, %s, %s, %s, %s, %s, "
    "%s::int8, %s::int8, %s::int8, %s, %s::int8, %s::int8, %s::float8, %s, %s::float8, "
    "%s::float8)"
).encode()
INSERT_JOURNAL_SQL = (
    "INSERT INTO stepstone_journal (run_key, seq, kind, name, data, started_at, committed_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


def lock_id(key: str) -> int:
    """The advisory lock id of ``key`` (with KEY_LOCK_CLASS)."""
    return int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).digest(),
        "big",
        signed=True,
    )


def lock_ids(keys: Sequence[str]) -> list[int]:
    return sorted({lock_id(k) for k in keys})


def prefix_where(column: str, prefix: str | None) -> tuple[str, tuple[str, ...]]:
    if prefix is None or prefix == "":
        return "TRUE", ()
    lo, hi = prefix_bounds(prefix)
    if hi is None:
        return f"{column} >= %s", (lo,)
    return f"{column} >= %s AND {column} < %s", (lo, hi)


def check_schema(
    conn: psycopg.Connection[Any], where: str, migrations: Sequence[str] = MIGRATIONS
) -> None:
    """Check, without writing, that ``conn``'s database holds a current stepstone schema."""
    current = _version(conn)
    if current is None:
        raise StoreError(
            f"{where} holds no stepstone store (no stepstone_schema table); check the "
            "database name, or open it writable once to create the schema"
        )
    if current != len(migrations):
        newer = current > len(migrations)
        raise StoreError(
            f"{where} has stepstone schema version {current}, this stepstone reads "
            f"{len(migrations)}; "
            + ("upgrade stepstone" if newer else "open it writable once to upgrade the schema")
        )


def _version(conn: psycopg.Connection[Any]) -> int | None:
    """The schema version ``conn``'s database holds (None: no stepstone schema). A
    migration creates the table and records its versions in one transaction, so once the
    table is seen, so are the versions that came with it."""
    row = conn.execute("SELECT to_regclass('stepstone_schema') IS NOT NULL").fetchone()
    if not (row and row[0]):
        return None
    row = conn.execute("SELECT coalesce(max(version), 0) FROM stepstone_schema").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: psycopg.Connection[Any], migrations: Sequence[str] = MIGRATIONS) -> int:
    """Bring the schema of ``conn``'s database up to ``len(migrations)``; return the
    number of migrations applied. Runs in one transaction under a database-wide advisory
    lock, so concurrent callers apply each migration exactly once. A schema already
    current is seen without the lock: a process that stalls inside its own migration (a
    frozen host, a debugger) never keeps the others from opening the store.

    ``conn`` is in autocommit mode. The lock is the session's, taken in a transaction of
    its own before the migration's: a server process caches what it looked up in the
    catalog (that the schema table did not exist, above) and learns of other sessions'
    changes when a transaction starts, not when an advisory lock it waited for is
    granted."""
    import psycopg  # the [postgres] extra, loaded already: conn is its connection

    if _version(conn) == len(migrations):
        return 0
    conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
    try:
        return _migrate_locked(conn, migrations)
    finally:
        with contextlib.suppress(psycopg.Error):  # a lost connection released it anyway
            conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))


def _migrate_locked(conn: psycopg.Connection[Any], migrations: Sequence[str]) -> int:
    with conn.transaction():
        current = _version(conn)
        if current is None:
            conn.execute(
                "CREATE TABLE stepstone_schema "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            current = 0
        if current > len(migrations):
            raise StoreError(
                f"database has stepstone schema version {current}, newer than this "
                f"stepstone ({len(migrations)}); upgrade stepstone"
            )
        for version in range(current + 1, len(migrations) + 1):
            conn.execute(migrations[version - 1].encode())
            conn.execute(
                "INSERT INTO stepstone_schema (version, applied_at) VALUES (%s, %s)",
                (version, time.time()),
            )
        return len(migrations) - current
