"""Every run view stepstone registers is found by kind, whatever was imported."""

from __future__ import annotations

import importlib
import pkgutil

import stepstone
from stepstone.store import _views


def test_every_registered_view_is_a_builtin_found_by_name() -> None:
    # guarantee 143: an engine that registers a view must list it in _BUILTIN_VIEWS, or
    # Store.read would show its runs differently before and after the engine is imported.
    for info in pkgutil.walk_packages(stepstone.__path__, "stepstone."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert set(_views._VIEWS) <= set(_views._BUILTIN_VIEWS)
    for kind, module in _views._BUILTIN_VIEWS.items():
        importlib.import_module(module)
        assert kind in _views._VIEWS, (kind, module)
