"""LLM engine tests run on scripted models; real model requests are blocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepstone.engines.llm._routing import ProviderRouting
from stepstone.providers._registry import restore_routing, routing_table
from stepstone.testing import block_model_requests


@pytest.fixture(autouse=True)
def _no_real_requests() -> Iterator[None]:
    with block_model_requests():
        yield


@pytest.fixture
def routing() -> Iterator[type[ProviderRouting]]:
    """Restore the provider registry's routing table after a test that changes it."""
    saved = routing_table()
    try:
        yield ProviderRouting
    finally:
        restore_routing(saved)
