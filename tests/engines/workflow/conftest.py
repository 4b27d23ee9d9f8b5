"""The operator tests' stores (a SQLite file, a PostgreSQL database) for workflow runs."""

from tests.operate.conftest import store_args

__all__ = ["store_args"]
