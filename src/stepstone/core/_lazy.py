"""Package attributes loaded on first use (PEP 562), for the packages' ``__init__``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, table: Mapping[str, str | tuple[str, str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: each name of ``table`` (mapped to its
    module, or to a ``(module, attribute)`` pair) is imported on first use and then kept in
    ``namespace``, the package's globals, so importing one module of a package does not
    import the others."""

    def getattr_(name: str) -> Any:
        try:
            where = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module, attribute = (where, name) if isinstance(where, str) else where
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *table})

    return getattr_, dir_
