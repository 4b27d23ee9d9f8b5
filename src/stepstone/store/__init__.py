"""Storage: the Store facade and its backends (memory, SQLite, PostgreSQL)."""

from stepstone.store._base import Backend, Claim, JournalRow, RunHead
from stepstone.store._memory import MemoryBackend
from stepstone.store._store import Store, StoreEntry
from stepstone.store._views import register_run_view

__all__ = [
    "Backend",
    "Claim",
    "JournalRow",
    "MemoryBackend",
    "RunHead",
    "Store",
    "StoreEntry",
    "register_run_view",
]
