"""How the suite opens the store under test."""

from __future__ import annotations

import dataclasses
from typing import Any

from stepstone.store import Store

__all__ = ["StoreSpec"]


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """How to open the store under test: ``Store(**args)``; ``multiprocess`` if shareable."""

    name: str
    args: dict[str, Any]
    multiprocess: bool = True
    shared: Store | None = None

    def open(self) -> Store:
        """A Store on the backend under test (the same data each time, when shareable)."""
        if self.shared is not None:
            return self.shared
        return Store(**self.args)
