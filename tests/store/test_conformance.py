"""The store conformance suite over every backend (guarantee 45; the backend contract)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone.store import Store
from stepstone.testing.store_conformance import *  # noqa: F403
from stepstone.testing.store_conformance import StoreSpec


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreSpec]:
    if request.param == "memory":
        store = Store()
        yield StoreSpec(name="memory", args={}, multiprocess=False, shared=store)
    elif request.param == "sqlite":
        yield StoreSpec(name="sqlite", args={"db": str(tmp_path / "conformance.sqlite")})
    else:
        # One database per module (pg_url); each test starts from empty tables.
        url: str = request.getfixturevalue("pg_url")
        with Store(url=url) as store:
            store.backend.setup()  # type: ignore[attr-defined]
            for key in store.keys():
                store.delete(key)
        yield StoreSpec(name="postgres", args={"url": url})
