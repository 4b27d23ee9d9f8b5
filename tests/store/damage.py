"""Damaging a closed SQLite store the way a failing disk does: a page overwritten with
bytes that are no b-tree page."""

from __future__ import annotations

import sqlite3
from pathlib import Path


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
