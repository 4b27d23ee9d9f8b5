"""Storage: the Store facade and its backends (memory, SQLite, PostgreSQL)."""

from stepstone.store._base import Backend, Claim, JournalRow, RunHead
from stepstone.store._check import CheckProblem, CheckReport, check_store
from stepstone.store._memory import MemoryBackend
from stepstone.store._retention import Retention, VacuumReport, vacuum
from stepstone.store._store import MAX_KEY_BYTES, Store, StoreEntry
from stepstone.store._views import register_run_view

__all__ = [
    "MAX_KEY_BYTES",
    "Backend",
    "CheckProblem",
    "CheckReport",
    "PostgresBackend",
    "Claim",
    "JournalRow",
    "MemoryBackend",
    "SQLiteBackend",
    "Retention",
    "RunHead",
    "Store",
    "StoreEntry",
    "VacuumReport",
    "check_store",
    "register_run_view",
    "vacuum",
]


def __getattr__(name: str) -> object:
    # Backends with drivers are imported on first use, so `import stepstone` never needs them.
    if name == "SQLiteBackend":
        from stepstone.store._sqlite import SQLiteBackend

        return SQLiteBackend
    if name == "PostgresBackend":
        from stepstone.store._postgres import PostgresBackend

        return PostgresBackend
    raise AttributeError(f"module 'stepstone.store' has no attribute {name!r}")
