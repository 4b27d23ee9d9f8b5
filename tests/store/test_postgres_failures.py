"""When the PostgreSQL server refuses: a full disk, damaged data, a read-only database.
Each is a store error naming the store and what to do, not the driver's bare error
(guarantee 158), and a run stopped by a full disk continues after its last committed step.

The disk really fills: the store's tables live in a tablespace on a small tmpfs (a test
that needs root and mount(8) to set it up; elsewhere it is skipped). The damage is real
too: a table's first page overwritten in its file while the server is stopped.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import psycopg
import pytest

from stepstone import Agent, Store, StoreDamagedError, StoreError, StoreFullError
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
