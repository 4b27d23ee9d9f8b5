"""Reading and damaging effect journals in tests, whatever format wrote them."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepstone import Store
from stepstone.durable._journal_format import ENTRIES_KIND, Entry, expand, read_entries
from stepstone.store import Claim, RunHead


def entries(store: Store, key: str) -> list[Entry]:
    """The entries of the run under ``key``, in order."""
    return read_entries(store.backend.run_journal(key))


def first_format(store: Store, key: str) -> None:
    """Rewrite the journal of the run under ``key`` as the first format wrote it (one row
    per entry): a run journaled by an older stepstone."""
    rows = expand(store.backend.run_journal(key))

    def decide(head: RunHead | None, kv: str | None) -> Claim:
        assert head is not None
        new = dataclasses.replace(head, journal_len=len(rows), version=head.version + 1)
        return Claim(head=new, reset_journal=True, rows=rows)

    store.backend.run_transact(key, decide)


def edit_entry(
    db: Path, key: str, find: Callable[[list[Any]], bool], change: Callable[[list[Any]], Any]
) -> None:
    """Change, in the SQLite file, the first entry ``find`` picks among the ``entries`` rows
    of the run under ``key`` (as a damaged byte or a hand edit would): ``change`` gets the
    entry (a JSON array) and returns what to store instead (None: drop it)."""
    conn = sqlite3.connect(db)
    try:
        found = conn.execute(
            "SELECT seq, data FROM stepstone_journal WHERE run_key = ? AND kind = ? ORDER BY seq",
            (key, ENTRIES_KIND),
        ).fetchall()
        for seq, text in found:
            data = json.loads(text)
            for i, entry in enumerate(data["e"]):
                if find(entry):
                    new = change(list(entry))
                    if new is None:
                        del data["e"][i]
                    else:
                        data["e"][i] = new
                    conn.execute(
                        "UPDATE stepstone_journal SET data = ? WHERE run_key = ? AND seq = ?",
                        (json.dumps(data), key, seq),
                    )
                    conn.commit()
                    return
        raise AssertionError(f"no entry of {key!r} matches")
    finally:
        conn.close()
