"""Stores for the operator tests: a real SQLite file, and a real PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import Store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """CLI arguments naming a fresh, empty store (``--db FILE`` or ``--url URL``)."""
    if request.param == "sqlite":
        path = tmp_path / "ops.sqlite"
        Store(db=path).close()
        yield ["--db", str(path)]
        return
    url: str = request.getfixturevalue("pg_url")
    with Store(url=url) as store:
        for key in store.keys():
            store.delete(key)
    yield ["--url", url]


def open_args(args: list[str]) -> Store:
    """The store the CLI arguments name."""
    return Store(db=args[1]) if args[0] == "--db" else Store(url=args[1])
