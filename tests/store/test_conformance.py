"""The store conformance suite over every backend (spec 45; DESIGN section 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone.store import Store
from stepstone.testing.store_conformance import *  # noqa: F403
from stepstone.testing.store_conformance import StoreSpec


@pytest.fixture(params=["memory", "sqlite"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreSpec]:
    if request.param == "memory":
        store = Store()
        yield StoreSpec(name="memory", args={}, multiprocess=False, shared=store)
    else:
        yield StoreSpec(name="sqlite", args={"db": str(tmp_path / "conformance.sqlite")})
