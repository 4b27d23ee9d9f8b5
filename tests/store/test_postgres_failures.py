"""When the PostgreSQL server refuses: a full disk, damaged data, a read-only database, a
lock table too small for a commit, no connection slot left. Each is a store error naming
the store and what to do, not the driver's bare error or the pool's timeout (guarantee
158), and a run stopped by a full disk continues after its last committed step.

The disk really fills: the store's tables live in a tablespace on a small tmpfs (a test
that needs root and mount(8) to set it up; elsewhere it is skipped). The damage is real
too: a table's first page overwritten in its file while the server is stopped.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from stepstone import Agent, Store, StoreDamagedError, StoreError, StoreFullError
from stepstone.store import PostgresBackend
from tests.conftest import SmallDisk
from tests.pgserver import PgServer
from tests.store.damage import counted_plan, fill_then_resume

pytestmark = pytest.mark.postgres


def test_a_read_only_database_is_a_store_error_saying_so(pg_server: PgServer) -> None:
    url = pg_server.create_database("t_read_only_db")
    try:
        with Store(url=url) as store:
            assert Agent(engine=counted_plan(store, "before", []))("go").ok
        pg_server.admin('ALTER DATABASE "t_read_only_db" SET default_transaction_read_only = on')
        calls: list[str] = []
        with Store(url=url) as store:
            assert store.read("before")["status"] == "done"  # reads still work
            with pytest.raises(StoreError, match="is read-only") as info:
                Agent(engine=counted_plan(store, "after", calls))("go")
            with pytest.raises(StoreError, match="is read-only"):
                store.write("setting", 1)
        assert "primary" in str(info.value) and "read_only=True" in str(info.value)
        assert not isinstance(info.value, (StoreFullError, StoreDamagedError))
        assert calls == []
    finally:
        pg_server.drop_database("t_read_only_db")


def test_damaged_data_is_a_store_damaged_error(own_pg_server: PgServer, own_pg_url: str) -> None:
    with Store(url=own_pg_url) as store:
        assert Agent(engine=counted_plan(store, "run", []))("go").ok
        store.write("setting", {"retries": 3})
    with psycopg.connect(own_pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_relation_filepath('stepstone_journal')").fetchone()
        conn.execute("CHECKPOINT")
    assert row is not None
    own_pg_server.stop()
    with open(own_pg_server.data / str(row[0]), "r+b") as fh:  # the page header of block 0
        fh.write(b"\xff" * 24)
    own_pg_server.start()
    with Store(url=own_pg_url) as store:
        assert store.read("setting") == {"retries": 3}  # another table: still reads
        with pytest.raises(StoreDamagedError, match="holds damaged data") as info:
            store.read("run")
    assert "stepstone check --url" in str(info.value)


# -- a real full disk ----------------------------------------------------------------------
@pytest.fixture
def small_tablespace(pg_server: PgServer, small_disk: SmallDisk) -> Iterator[str]:
    """A database whose tables go to a 2 MB tmpfs."""
    shutil.chown(small_disk.path, "postgres", "postgres")
    pg_server.admin(f"CREATE TABLESPACE t_small LOCATION '{small_disk.path}'")
    try:
        url = pg_server.create_database("t_small_disk")
        pg_server.admin('ALTER DATABASE "t_small_disk" SET default_tablespace = t_small')
        yield url
    finally:
        pg_server.drop_database("t_small_disk")
        pg_server.admin("DROP TABLESPACE IF EXISTS t_small")


def test_a_full_disk_stops_the_run_and_its_resume_continues_after_the_last_commit(
    small_tablespace: str, small_disk: SmallDisk
) -> None:
    url = small_tablespace
    with Store(url=url) as store:
        store.setup()
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT spcname FROM pg_tablespace WHERE oid = "
                "(SELECT reltablespace FROM pg_class WHERE relname = 'stepstone_journal')"
            ).fetchone()
        assert row == ("t_small",)
        error = fill_then_resume(store, lambda: small_disk.resize("64m"), steps=40, size=100_000)
    message = str(error)
    assert "out of disk space" in message and "resume=True" in message


def _take_the_slot(url: str, limit: float = 30.0) -> psycopg.Connection[Any]:
    """A connection holding the role's one slot, once the server has let go of the
    connections closed just before (a backend counts until its process has exited)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return psycopg.connect(url)
        except psycopg.OperationalError as exc:
            if "too many connections" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_server_with_no_connection_slot_left_is_a_store_error_saying_what_to_do(
    pg_server: PgServer,
) -> None:
    """A role limited to one connection, its one slot held elsewhere: the setup, and an
    operation whose pool cannot open a connection within reconnect_timeout, each end in a
    StoreError that names the refusal and the settings to change, not a bare pool timeout;
    an operation still within its reconnect_timeout when the slot frees goes through
    (guarantee 158)."""
    pg_server.create_database("t_no_slot")
    pg_server.admin("DROP ROLE IF EXISTS t_no_slot")
    pg_server.admin("CREATE ROLE t_no_slot LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")
    pg_server.admin('GRANT ALL ON DATABASE "t_no_slot" TO t_no_slot')
    url = f"postgresql://t_no_slot:pw@127.0.0.1:{pg_server.port}/t_no_slot"
    with psycopg.connect(pg_server.url("t_no_slot"), autocommit=True) as conn:
        conn.execute("GRANT ALL ON SCHEMA public TO t_no_slot")
    try:
        with Store(backend=PostgresBackend(url, reconnect_timeout=1.0)) as store:
            store.setup()  # the slot is free: the schema goes in (the pool opens later)
            with _take_the_slot(url):  # the only slot, once setup's backend has exited
                with pytest.raises(StoreError, match="no connection slot is left") as info:
                    store.write("setting", 1)  # the pool's connections are refused
                with pytest.raises(StoreError, match="no connection slot is left"):
                    Store(backend=PostgresBackend(url)).setup()
        message = str(info.value)
        assert "too many connections for role" in message
        assert "max_size" in message and "CONNECTION LIMIT" in message

        with Store(backend=PostgresBackend(url, reconnect_timeout=30.0)) as patient:
            patient.setup()
            holder = _take_the_slot(url)
            threading.Timer(0.5, holder.close).start()  # the slot frees while it retries
            patient.write("setting", 2)
            assert patient.read("setting") == 2
    finally:
        pg_server.drop_database("t_no_slot")
        pg_server.admin("DROP ROLE IF EXISTS t_no_slot")


def test_a_commit_that_exhausts_the_servers_lock_table_is_a_store_error(
    pg_server: PgServer,
) -> None:
    """150,000 ``writes=`` keys in one commit need more advisory locks than the server's
    lock table holds: "out of shared memory" (53200) is a StoreError naming the setting
    and what to do, and nothing of the commit is written (guarantee 158)."""
    from stepstone.durable import claim_run

    url = pg_server.create_database("t_locks")
    try:
        with Store(url=url) as store:
            run = claim_run(store, "run", kind="test", resume=False, first_step="s0").run
            assert run is not None
            with pytest.raises(StoreError, match="ran out of memory") as info:
                run.commit_sync(
                    status="running",
                    next_step="s1",
                    rows=[("step", "s0", {"n": 1})],
                    writes=[(f"k{i}", i) for i in range(150_000)],
                )
            assert "max_locks_per_transaction" in str(info.value)
            assert "resume=True" in str(info.value)
            head = store.backend.run_get("run")
            assert head is not None and head.version == run.head.version  # not moved
            assert store.read("k0") is None and store.backend.run_journal("run") == []
            run.release()
    finally:
        pg_server.drop_database("t_locks")
