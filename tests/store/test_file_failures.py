"""When the store's file fails: damaged pages, a full disk, a file size limit. Each is a
store error naming the file and what to do, never SQLite's bare error (guarantees 154,
155), and a run stopped by a full disk continues after its last committed step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone import (
    Agent,
    Store,
    StoreDamagedError,
    StoreError,
)
from tests.conftest import SmallDisk
from tests.store.damage import counted_plan, damage_table, fill_then_resume

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A store whose journal table is damaged; its runs and plain values still read."""
    db = tmp_path / "damaged.sqlite"
    with Store(db=db) as store:
        for key in ("a", "b"):
            assert Agent(engine=counted_plan(store, key, []))("go").ok
        store.write("setting", {"retries": 3})
    damage_table(db, "stepstone_journal")
    return db


def test_damaged_pages_are_a_store_damaged_error_naming_the_file_and_the_fix(
    damaged: Path,
) -> None:
    with Store(db=damaged) as store:
        assert store.read("setting") == {"retries": 3}  # what is not damaged still reads
        with pytest.raises(StoreDamagedError) as info:
            store.read("a")
    message = str(info.value)
    assert repr(str(damaged)) in message and "is damaged" in message
    assert f"stepstone check --db {damaged}" in message and ".recover" in message
    assert isinstance(info.value, StoreError)


def test_resuming_a_run_in_a_damaged_file_raises_it_and_runs_no_step(damaged: Path) -> None:
    calls: list[str] = []
    with Store(db=damaged) as store, pytest.raises(StoreDamagedError, match="is damaged"):
        Agent(engine=counted_plan(store, "a", calls))("go")
    assert calls == []


def test_a_file_that_is_no_database_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 200)
    with pytest.raises(StoreError, match="is not a SQLite database") as info:
        Store(db=path)
    assert not isinstance(info.value, StoreDamagedError)
    assert path.read_text().startswith("these are my notes")  # nothing was written to it


def test_a_full_store_stops_the_run_and_its_resume_continues_after_the_last_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "full.sqlite"
    with Store(db=db) as store:
        # SQLite's own size cap on this thread's connection (the one a sync run commits
        # on): growing the database past it fails exactly as a full disk does
        conn = store.backend._conn()  # type: ignore[attr-defined]
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        conn.execute(f"PRAGMA max_page_count = {pages + 40}")  # room for a few 40 KB steps
        error = fill_then_resume(
            store,
            lambda: conn.execute("PRAGMA max_page_count = 1073741823"),  # room again
            steps=8,
            size=30_000,
        )
    message = str(error)
    assert repr(str(db)) in message and "disk is full" in message
    assert "resume=True" in message


def test_a_really_full_disk_is_a_store_full_error_and_the_run_resumes(
    small_disk: SmallDisk,
) -> None:
    with Store(db=small_disk.path / "full.sqlite") as store:
        error = fill_then_resume(store, lambda: small_disk.resize("64m"), steps=60, size=75_000)
    assert "the disk is full" in str(error)


LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
from stepstone import Agent, Plan, Step, Store
store = Store(db=sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
big = lambda payload: "x" * 50_000
try:
    Agent(engine=Plan(*[Step(big, name=f"s{i}") for i in range(20)], store=store,
                      checkpoint_key="k", max_iterations=21))("go")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_file_size_limit_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    db = tmp_path / "limited.sqlite"
    Store(db=db).close()
    out = subprocess.run(
        [sys.executable, "-c", LIMITED, str(db), str(db.stat().st_size + 200_000)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=True,
    ).stdout
    assert out.startswith("StoreError "), out
    assert repr(str(db)) in out and "file size limit" in out and "resume=True" in out
