"""Keeping a SQLite WAL file allocated ahead of the commits.

With ``synchronous=FULL`` every commit ends with an fsync of the WAL. When the commit made
the file longer, that fsync also writes the file's metadata (its size, its new blocks),
which about doubles its cost; a new store's WAL grows on every commit until the first
checkpoint, after which SQLite reuses it from its start. :class:`WalTender` extends the
file with zeros ahead of the commits instead: 512 KB at open, doubled whenever the commits
outgrow it, up to the size the WAL reaches between two automatic checkpoints.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

__all__ = ["WalTender"]

#: Bytes of the WAL file header and of each frame's header (before its page).
_WAL_HEADER = 32
_WAL_FRAME_HEADER = 24
#: Frames allowed past ``wal_autocheckpoint`` pages (a commit's pages, before the checkpoint).
_SLACK_PAGES = 64
#: The WAL space allocated at open (about 125 pages: a few dozen step commits).
FIRST_CHUNK = 512 * 1024


class WalTender:
    """Extends one store's WAL file; :meth:`tend` is called holding the write lock."""

    def __init__(self, wal: Path) -> None:
        self.wal = wal
        self.seen = -1  # the file's size when this store last looked at (or grew) it

    def tend(self, conn: sqlite3.Connection) -> bool:
        """Extend the WAL when a store opens it or its commits outgrew the space; False
        when the disk refused (the caller stops tending it).

        Only bytes past the file's current end are written (zeros), never a frame: SQLite
        reads frames up to the first one whose checksum fails (zeros always fail), writes
        new frames at offsets it computes itself, and after a checkpoint starts again from
        the beginning of the file without shrinking it. Nothing else grows or shrinks the
        WAL meanwhile: the write lock is held, and SQLite deletes the file only when the
        last connection closes (the store keeps one open)."""
        try:
            size = self.wal.stat().st_size
        except FileNotFoundError:
            return True  # SQLite creates it with the first transaction
        if size == self.seen:
            return True
        if self.seen < 0 or size < self.seen:  # a store just opened, or a truncated WAL
            target = FIRST_CHUNK
        else:  # the commits outgrew the space: double it, up to a checkpoint's worth
            page = int(conn.execute("PRAGMA page_size").fetchone()[0])
            pages = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
            # the checkpoint runs after the commit that passed `pages`: leave it room
            full = _WAL_HEADER + (max(pages, 0) + _SLACK_PAGES) * (page + _WAL_FRAME_HEADER)
            target = max(FIRST_CHUNK, min(full, 2 * size))
        if size < target and hasattr(os, "pwrite"):
            try:
                size = _extend(self.wal, size, target)
            except OSError:
                return False
        self.seen = size
        return True


def _extend(wal: Path, size: int, target: int) -> int:
    """Append zeros to ``wal`` (``size`` bytes long) up to ``target`` bytes and sync it."""
    fd = os.open(wal, os.O_WRONLY)
    try:
        zeros = bytes(min(target - size, 1 << 20))
        while size < target:
            size += os.pwrite(fd, zeros[: target - size], size)
        getattr(os, "fdatasync", os.fsync)(fd)
    finally:
        os.close(fd)
    return size
