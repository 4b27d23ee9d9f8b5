"""How many database pages a step commit writes on SQLite, counted in the WAL itself.

Every committed transaction is a run of WAL frames (one per page it changed), the last one
marked as the commit; :func:`wal_commits` reads them back from the file, so these tests see
exactly the pages each step commit wrote, and which table or index each page belongs to.
"""

from __future__ import annotations

import sqlite3
import statistics
import struct
from collections import Counter
from pathlib import Path

import pytest

from stepstone import Agent, Plan, Step, Store

_WAL_HEADER = 32
_FRAME_HEADER = 24


def wal_commits(path: Path) -> list[list[int]]:
    """The page numbers each committed transaction wrote, read from ``path``'s WAL since it
    was last restarted (frames carry the WAL's current salt; the first that does not, or a
    page number 0 in preallocated space, ends the log)."""
    wal = Path(f"{path}-wal").read_bytes()
    page_size = struct.unpack(">I", wal[8:12])[0]
    salt = wal[16:24]
    commits: list[list[int]] = []
    pages: list[int] = []
    offset = _WAL_HEADER
    while offset + _FRAME_HEADER + page_size <= len(wal):
        page, db_size = struct.unpack(">II", wal[offset : offset + 8])
        if page == 0 or wal[offset + 8 : offset + 16] != salt:
            break
        pages.append(page)
        if db_size:  # the commit frame: the transaction ends here
            commits.append(pages)
            pages = []
        offset += _FRAME_HEADER + page_size
    return commits


def _run(store: Store, key: str, steps: int, output: str) -> None:
    plan = Plan(
        *[Step(lambda _: output, name=f"s{i}", writes=f"{key}:w{i}") for i in range(steps)],
        store=store,
        checkpoint_key=key,
        max_iterations=steps + 1,
    )
    assert Agent(engine=plan)("go").ok


def step_commit_pages(tmp_path: Path, size: int, steps: int = 40) -> list[list[int]]:
    """Pages of each transaction of one ``steps``-step Plan run (``size``-character outputs,
    each also stored with ``writes=``) on a store that already holds a run."""
    path = tmp_path / f"pages-{size}.sqlite"
    with Store(db=path) as store:
        _run(store, "history", 60, "y" * size)
        probe = sqlite3.connect(path, isolation_level=None)
        try:
            # the WAL restarts from its beginning with the next transaction: the probe run's
            assert probe.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
            _run(store, "probe", steps, "x" * size)
            commits = wal_commits(path)
        finally:
            probe.close()
    return commits


def _owners(path: Path) -> dict[int, str] | None:
    """Page number -> table or index name, where SQLite was built with ``dbstat``."""
    conn = sqlite3.connect(path)
    try:
        return {int(p): str(n) for p, n in conn.execute("SELECT pageno, name FROM dbstat")}
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()


def test_a_small_step_commit_writes_one_page_of_each_table_and_key_index(tmp_path: Path) -> None:
    # guarantee 350
    commits = step_commit_pages(tmp_path, 100)
    # the claim and the 40 step commits (a release may ride with the last one or follow it)
    assert 40 <= len(commits) <= 42
    sizes = [len(c) for c in commits]
    assert statistics.median(sizes) == 5
    assert sum(sizes) / len(sizes) <= 5.5  # a leaf split (a new page + its parent) now and then
    owners = _owners(tmp_path / "pages-100.sqlite")
    if owners is None:
        pytest.skip("this SQLite has no dbstat table to name the pages")
    expected = Counter(
        {
            "stepstone_runs": 1,  # the run head (a WITHOUT ROWID table: no index of its own)
            "stepstone_journal": 1,
            "sqlite_autoindex_stepstone_journal_1": 1,  # its (run_key, seq) key
            "stepstone_kv": 1,  # the writes= value
            "sqlite_autoindex_stepstone_kv_1": 1,  # its key
        }
    )
    typical = [c for c in commits if len(c) == 5]
    assert len(typical) >= 30
    assert all(Counter(owners.get(p, "?") for p in c) == expected for c in typical)


@pytest.mark.parametrize(("size", "most"), [(1_000, 7.0), (10_000, 12.0)])
def test_large_outputs_add_only_their_own_pages(tmp_path: Path, size: int, most: float) -> None:
    # guarantee 350
    commits = step_commit_pages(tmp_path, size)
    pages = [len(c) for c in commits[1:-1]]  # the step commits
    # A 1 KB row stays inline (about 6.4 pages per commit, leaf splits included); 10 KB
    # spills into two overflow pages for each of the journal row and the value (about 11).
    # A WITHOUT ROWID layout, which keeps at most ~1 KB of a row inline per 4 KB page,
    # measured about 9 and 13 pages here.
    assert sum(pages) / len(pages) <= most


def test_a_value_written_again_is_updated_in_place_without_its_index(tmp_path: Path) -> None:
    # guarantee 350
    path = tmp_path / "again.sqlite"
    with Store(db=path) as store:
        _run_writing(store, "first", "shared", "y" * 100)
        probe = sqlite3.connect(path, isolation_level=None)
        try:
            assert probe.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
            _run_writing(store, "second", "shared", "x" * 100)  # the same writes= keys
            commits = wal_commits(path)[1:-1]
        finally:
            probe.close()
        assert [store.read(f"shared:w{i}") for i in range(40)] == ["x" * 100] * 40
    assert statistics.median(len(c) for c in commits) == 4  # head, journal row + index, value
    owners = _owners(path)
    if owners is not None:
        touched = {owners.get(p, "?") for c in commits for p in c}
        assert "sqlite_autoindex_stepstone_kv_1" not in touched


def _run_writing(store: Store, key: str, prefix: str, output: str) -> None:
    plan = Plan(
        *[Step(lambda _: output, name=f"s{i}", writes=f"{prefix}:w{i}") for i in range(40)],
        store=store,
        checkpoint_key=key,
        max_iterations=41,
    )
    assert Agent(engine=plan)("go").ok
