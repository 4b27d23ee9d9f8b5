"""Keeping a SQLite WAL file allocated ahead of the commits.

With ``synchronous=FULL`` every commit ends with an fsync of the WAL. When the commit made
the file longer, that fsync also writes the file's metadata (its size, its new blocks),
which about doubles its cost; a new store's WAL grows on every commit until the first
checkpoint, after which SQLite reuses it from its start. :class:`WalTender` extends the
file with zeros ahead of the commits instead: 512 KB at open, doubled whenever the commits
outgrow it, up to the size the WAL reaches between two automatic checkpoints.
"""

from __future__ import annotations

import functools
import operator
import os
import sqlite3
import struct
import sys
import time
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = ["WalTender", "wal_checksum", "wal_damage"]

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

    def allocated(self) -> bool:
        """Whether the WAL already holds the space a store allocates at open (another
        store of the file keeps it tended): then opening need not take the write lock."""
        try:
            return self.wal.stat().st_size >= FIRST_CHUNK
        except FileNotFoundError:
            return False

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


# -- reading a WAL as SQLite's recovery does ---------------------------------------------
# SQLite recovers a WAL up to its last commit frame before the first frame whose salts or
# checksum fail, and forgets the rest; a WAL whose header fails is forgotten whole. A byte
# changed inside a committed frame (or in the header) would so drop that commit and every
# later one without an error. ``wal_damage`` reads the file as recovery does, and also as
# the writer wrote it (each frame checked against the checksum stored in the one before),
# and reports commits the writer made that recovery would drop.

_MAGIC = (0x377F0682, 0x377F0683)  # the low bit: checksums over big-endian words
_WAL_VERSION = 3007000


@functools.cache
def _weights(pairs: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, int, int, int]]:
    """The checksum over ``pairs`` word pairs as two dot products and a matrix.

    SQLite's WAL checksum runs ``s0 += x0 + s1; s1 += x1 + s0`` over the pairs, which is
    ``S' = M S + (x0, x0 + x1)`` with ``M = [[1, 1], [1, 2]]`` (mod 2**32): after all pairs,
    ``S = M**pairs S0 + sum_k M**(pairs-1-k) (x0_k, x0_k + x1_k)``, so each sum is a dot
    product of the words with fixed weights (computed once per page size), which the
    interpreter runs in C instead of a Python loop per word."""
    mask = 0xFFFFFFFF
    w0: list[tuple[int, int]] = []  # the weights of (x0, x1) of the last pair first
    w1: list[tuple[int, int]] = []
    p, q, r, t = 1, 0, 0, 1  # M**0
    for _ in range(pairs):  # M**j for j = 0, 1, ...: the weights of pair pairs-1-j
        w0.append(((p + q) & mask, q))
        w1.append(((r + t) & mask, t))
        p, q, r, t = (p + r) & mask, (q + t) & mask, (p + 2 * r) & mask, (q + 2 * t) & mask
    flat0 = tuple(w for pair in reversed(w0) for w in pair)
    flat1 = tuple(w for pair in reversed(w1) for w in pair)
    return flat0, flat1, (p, q, r, t)


def wal_checksum(data: bytes, seed: tuple[int, int], big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing ``seed``."""
    n = len(data) // 4
    words = struct.unpack(f"{'>' if big_endian else '<'}{n}I", data)
    w0, w1, (p, q, r, t) = _weights(n // 2)
    s0, s1 = seed
    return (
        (p * s0 + q * s1 + sum(map(operator.mul, words, w0))) & 0xFFFFFFFF,
        (r * s0 + t * s1 + sum(map(operator.mul, words, w1))) & 0xFFFFFFFF,
    )


def _page_size(value: int) -> int | None:
    size = 65536 if value == 1 else value
    return size if 512 <= size <= 65536 and size & (size - 1) == 0 else None


def wal_damage(db: Path) -> str | None:
    """What is wrong with ``db``'s WAL file when SQLite's recovery would drop commits from
    it (a changed byte in a committed frame, or in the WAL's header), or None.

    Commits that recovery would drop but whose pages the main file already holds (the
    WAL was checkpointed) lose nothing and are not reported. Reads only; safe while other
    processes use the store: a frame being written is not a commit yet, and a frame read
    while a writer was writing it (its header new, its page not yet) is not damage. That
    last one can look like damage when the frames after it were written meanwhile, so
    damage counts only when it is found the same twice, the file read again between."""
    seen: tuple[str, bytes] | None = None
    for _ in range(_SCANS):
        found = _scan(db)
        if found is None:
            return None
        if found == seen:
            return found[0]
        seen = found
        time.sleep(0.02)
    return None  # different every time: a live writer's WAL, which no recovery reads


#: At most this many reads of a WAL that seems damaged (see :func:`wal_damage`).
_SCANS = 5


def _scan(db: Path) -> tuple[str, bytes] | None:
    """One read of the WAL for :func:`wal_damage`: what is wrong and the bytes it was
    found in (the header and the first frame recovery stops at), or None."""
    try:
        f = open(f"{db}-wal", "rb")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with f:
        head = f.read(_WAL_HEADER)
        if len(head) < _WAL_HEADER:
            return None
        magic, version, size_field, _, salt1, salt2, c1, c2 = struct.unpack(">8I", head)
        big = magic & 1 == 1
        page = _page_size(size_field)
        header_ok = (
            magic in _MAGIC
            and version == _WAL_VERSION
            and page is not None
            and wal_checksum(head[:24], (0, 0), big) == (c1, c2)
        )
        if not header_ok:
            layout = _frames_layout(f, db, head, page, (c1, c2))
            if layout is None:
                return None
            page, salt1, salt2, big = layout
        if page is None:
            return None
        walk = _walk_frames(f, page, (salt1, salt2), (c1, c2), big, header_ok, head)
        if walk.written <= walk.recovered:
            return None
        if _reads_the_same(db, page, walk.frames, walk.recovered, walk.written):
            return None
    where = (
        "its header is damaged, so SQLite would ignore the whole file"
        if not header_ok
        else f"frame {walk.broken + 1} is damaged, so SQLite would stop reading there"
    )
    return (
        f"its WAL file ({db.name}-wal) holds committed transactions that SQLite would "
        f"drop (frames {walk.recovered + 2} to {walk.written + 1} of {len(walk.frames)}): "
        f"{where}",
        walk.evidence,
    )


def _frames_layout(
    f: BinaryIO, db: Path, head: bytes, page: int | None, sums: tuple[int, int]
) -> tuple[int, int, int, bool] | None:
    """For a WAL whose header is damaged: the page size, salts and checksum byte order its
    frames were written with, read from the first frame (the page size from the main file
    when the header's is not one), or None when there is no frame to read. Leaves ``f`` at
    the first frame."""
    if not head.strip(b"\0") and not f.read(1 << 16).strip(b"\0"):
        return None  # nothing written yet (or zeros kept ahead of the commits)
    page = page or _db_page_size(db)
    f.seek(_WAL_HEADER)
    if page is None:
        return None
    first = f.read(_WAL_FRAME_HEADER + page)
    f.seek(_WAL_HEADER)
    if len(first) < _WAL_FRAME_HEADER + page:
        return None
    salt1, salt2 = struct.unpack(">II", first[8:16])  # the frames' own salts
    # the byte order of the sums (the magic's low bit, perhaps the damaged one):
    # the one the first frame checks out with, else the machine's, as SQLite's
    stored = struct.unpack(">II", first[16:24])
    body = first[:8] + first[24:]
    fits = [b for b in (True, False) if wal_checksum(body, sums, b) == stored]
    return page, salt1, salt2, fits[0] if fits else sys.byteorder == "big"


class _Walk(NamedTuple):
    """What :func:`_walk_frames` found in a WAL's frames (indexes count from 0; -1: none)."""

    recovered: int  # the last commit frame recovery keeps
    written: int  # the last commit frame the writer wrote whole
    broken: int  # the first frame recovery stops at
    frames: list[tuple[int, bytes]]  # (page number, page) of every frame read
    evidence: bytes  # the header, and the frame recovery stops at


def _walk_frames(
    f: BinaryIO,
    page: int,
    salts: tuple[int, int],
    seed: tuple[int, int],
    big: bool,
    header_ok: bool,
    head: bytes,
) -> _Walk:
    """Read the frames of this generation (``salts``) from ``f``'s position, chaining
    their checksums from ``seed`` (the header's stored checksum)."""
    frame = _WAL_FRAME_HEADER + page
    recovered = -1
    written = -1
    broken = -1 if header_ok else 0
    frames: list[tuple[int, bytes]] = []
    evidence = head
    while True:
        data = f.read(frame)
        if len(data) < frame:
            break
        pgno, commit, s1, s2, k1, k2 = struct.unpack(">6I", data[:24])
        if (s1, s2) != salts or pgno == 0:
            break  # the end of this generation's frames (zeros, or an older one's)
        i = len(frames)
        sound = wal_checksum(data[:8] + data[24:], seed, big) == (k1, k2)
        if broken < 0 and not sound:
            broken = i
            evidence += data
        if sound and commit:
            written = i
            if broken < 0:
                recovered = i
        seed = (k1, k2)  # the stored checksum of the frame before
        frames.append((pgno, data[24:]))
    return _Walk(recovered, written, broken, frames, evidence)


def _db_page_size(db: Path) -> int | None:
    try:
        with open(db, "rb") as f:
            head = f.read(100)
    except OSError:
        return None
    return _page_size(int.from_bytes(head[16:18], "big")) if len(head) == 100 else None


def _reads_the_same(
    db: Path, page: int, frames: list[tuple[int, bytes]], recovered: int, written: int
) -> bool:
    """Whether SQLite, recovering ``frames[: recovered + 1]``, reads every page the lost
    commits wrote as those commits left it: each such page is read from the last recovered
    frame that holds it, else from the main file (where a checkpoint may have copied the
    lost commits' version before the WAL was damaged)."""
    kept = dict(frames[: recovered + 1])
    wanted = dict(frames[: written + 1])
    try:
        with open(db, "rb") as f:
            for pgno in dict(frames[recovered + 1 : written + 1]):
                seen = kept.get(pgno)
                if seen is None:
                    f.seek((pgno - 1) * page)
                    seen = f.read(page)
                if seen != wanted[pgno]:
                    return False
    except OSError:
        return False
    return True
