"""LLM engine tests run on scripted models; real model requests are blocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepstone.engines.llm._routing import ProviderRouting
from stepstone.testing import block_model_requests


@pytest.fixture(autouse=True)
def _no_real_requests() -> Iterator[None]:
    with block_model_requests():
        yield


@pytest.fixture
def routing() -> Iterator[type[ProviderRouting]]:
    """Restore the class-level routing tables after a test that changes them."""
    saved = (
        ProviderRouting._PROVIDER_ALIASES,
        list(ProviderRouting._PROVIDER_RULES),
        ProviderRouting._PROVIDER_DEFAULT,
    )
    try:
        yield ProviderRouting
    finally:
        (
            ProviderRouting._PROVIDER_ALIASES,
            ProviderRouting._PROVIDER_RULES,
            ProviderRouting._PROVIDER_DEFAULT,
        ) = saved
