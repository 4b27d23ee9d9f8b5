"""For the tests of stores that fail: damaging a closed SQLite store the way a failing disk
does (a page overwritten with bytes that are no b-tree page), and a Plan that counts its
step calls."""

from __future__ import annotations

import base64
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Store, StoreFullError


def counted_plan(
    store: Store, key: str, calls: list[str], *, steps: int = 2, size: int = 100
) -> Plan:
    """A resumable Plan of ``steps`` steps ``s0``, ``s1``..., each appending its name to
    ``calls`` and returning ``size`` random bytes in base64 (no store can compress them to
    nothing)."""

    def step(name: str) -> Any:
        def run(payload: Any) -> str:
            calls.append(name)
            return base64.b64encode(os.urandom(size)).decode()

        run.__name__ = name
        return run

    return Plan(
        *[Step(step(f"s{i}")) for i in range(steps)],
        store=store,
        checkpoint_key=key,
        resume=True,
        max_iterations=steps + 1,
    )


def fill_then_resume(
    store: Store, make_room: Callable[[], None], *, steps: int, size: int
) -> StoreFullError:
    """Run a counted plan until the full ``store`` stops it, ``make_room()``, then resume
    it, checking that the resume runs the step whose commit failed and the ones after it,
    none committed before it. Returns the error that stopped the run."""
    calls: list[str] = []
    with pytest.raises(StoreFullError) as info:
        Agent(engine=counted_plan(store, "run", calls, steps=steps, size=size))("go")
    stopped = len(calls)
    assert 1 < stopped < steps, calls
    make_room()
    calls.clear()
    assert Agent(engine=counted_plan(store, "run", calls, steps=steps, size=size))("go").ok
    assert calls == [f"s{i}" for i in range(stopped - 1, steps)]
    return info.value


def damage_page(db: Path, page: int, offset: int = 0) -> None:
    """Overwrite 16 bytes at ``offset`` of page ``page`` (1-based) of ``db`` (closed, its
    WAL checkpointed)."""
    con = sqlite3.connect(db)
    try:
        page_size = int(con.execute("PRAGMA page_size").fetchone()[0])
    finally:
        con.close()
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * page_size + offset)
        fh.write(b"\xff" * 16)


def damage_table(db: Path, table: str) -> None:
    """Damage ``table``'s root page, so every read of the table fails as a damaged page
    does."""
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    finally:
        con.close()
    assert row is not None, f"no table {table!r} in {db}"
    damage_page(db, int(row[0]))


def stored_rows(db: Path) -> list[Any]:
    """Every row of the runs, journal and kv tables of the store in ``db``, in a stable
    order: what an operation that refuses must leave as it was."""
    conn = sqlite3.connect(db)
    try:
        return [
            sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in ("stepstone_runs", "stepstone_journal", "stepstone_kv")
        ]
    finally:
        conn.close()


def flip(db: Path, marker: bytes, *, at: int = 0, to: bytes = b"Q") -> None:
    """Replace the byte ``at`` bytes into every place ``marker`` is stored in ``db`` (a
    closed store, its WAL checkpointed into the file) with ``to`` (a page SQLite freed may
    still hold an older copy of a row)."""
    data = bytearray(db.read_bytes())
    start = data.find(marker)
    assert start >= 0, f"{marker!r} is not stored in {db}"
    while start >= 0:
        assert data[start + at : start + at + 1] != to
        data[start + at] = to[0]
        start = data.find(marker, start + 1)
    db.write_bytes(bytes(data))


def settle(db: Path) -> None:
    """Fold the WAL into the file (as closing the last connection does), so every row is in
    the file at one place."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
