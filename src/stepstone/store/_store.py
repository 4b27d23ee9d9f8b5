"""The Store facade: a JSON key/value store that also holds durable run records."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypeVar

from stepstone.core._checks import positive_seconds
from stepstone.core._serialization import dumps, json_equal, loads, to_json_value
from stepstone.core._threads import to_thread
from stepstone.exceptions import CheckpointCorruptError, MissingExtraError
from stepstone.store._base import Backend, checked_text, read_consistent
from stepstone.store._memory import MemoryBackend
from stepstone.store._retention import Retention
from stepstone.store._views import render_run

__all__ = ["Store", "StoreEntry"]

R = TypeVar("R")

#: Which records :meth:`Store.items` returns: all (None), plain values, or checkpoints.
ItemKind: TypeAlias = Literal["value", "checkpoint"] | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StoreEntry:
    """A value with what the store knows about it.

    Attributes:
        key: The key.
        value: The decoded value (for a checkpoint: the assembled checkpoint dict).
        kind: ``"value"`` for plain values, ``"checkpoint"`` for durable run records.
        run_kind: For checkpoints, the engine that wrote it (``"plan"``, ``"graph"``...).
        version: For checkpoints, the head version (bumped by every commit), else None.
        updated_at: For checkpoints, unix time of the last commit, else None.
    """

    key: str
    value: Any
    kind: Literal["value", "checkpoint"]
    run_kind: str | None = None
    version: int | None = None
    updated_at: float | None = None


class Store:
    """Key/value storage for ``writes=`` values and durable checkpoints.

    ``Store()`` keeps everything in memory. ``Store(db="run.sqlite")`` uses a SQLite file
    (WAL, safe for concurrent readers and writers across threads and processes).
    ``Store(url="postgresql://user:pw@host/db")`` uses PostgreSQL (``stepstone[postgres]``).

    Values are JSON: pydantic models are stored as their ``model_dump``; anything JSON cannot
    hold is stored as ``str(value)`` with a warning. The full reference, with what each
    method does on a missing key or a checkpoint key, is ``docs/store.md``.

    Args:
        db: Path of a SQLite file (created if missing, unless ``read_only``).
        url: ``sqlite:///path`` or ``postgresql://...``; alternative to ``db``.
        durability: SQLite only. ``"full"`` (default) survives power loss; ``"normal"``
            survives a process crash and is faster.
        busy_timeout: Seconds to wait for another writer's lock before failing.
        lease_seconds: How long a run's ownership holds without renewal (a finite number
            > 0). The store only carries it: the kernel's ``LeasePolicy`` decides with it
            (a live run renews its lease every third of this; a run whose owner stopped
            renewing for this long, or whose process is gone on the same host, can be
            resumed by another process).
        backend: A ready :class:`~stepstone.store.Backend` (for custom backends).
        read_only: Open an existing store for inspection: nothing is ever created, migrated
            or written (a missing file, or a file or database that is not a stepstone store,
            is a :class:`~stepstone.exceptions.StoreError`); every write raises StoreError.
        retention: Which finished runs ``stepstone.durable.prune(store)`` (and
            ``stepstone prune``) delete; nothing is deleted until prune runs.

    Example::

        with Store(db="pipeline.sqlite") as store:
            store.write("greeting", {"text": "hello"})
            store.read("greeting")            # {'text': 'hello'}
            store.compare_and_swap("n", None, 1)   # True: created because absent
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        durability: Literal["full", "normal"] = "full",
        busy_timeout: float = 30.0,
        lease_seconds: float = 30.0,
        backend: Backend | None = None,
        read_only: bool = False,
        retention: Retention | None = None,
    ) -> None:
        if retention is not None and not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention(...), got {retention!r}")
        self.retention = retention
        given = [name for name, v in (("db", db), ("url", url), ("backend", backend)) if v]
        if len(given) > 1:
            raise ValueError(f"pass only one of db=, url=, backend= (got {', '.join(given)})")
        if read_only and db is None and url is None:
            raise ValueError(
                "read_only=True opens an existing store: pass db= or url= (an in-memory "
                "store, or a ready backend, has nothing to open)"
            )
        self.lease_seconds = positive_seconds("lease_seconds", lease_seconds)
        self.read_only = read_only
        self.backend: Backend
        if backend is not None:
            if not isinstance(backend, Backend):
                raise TypeError(
                    f"backend= takes a stepstone.store.Backend, got {backend!r:.200}; a file "
                    "path goes to db=, a URL to url="
                )
            self.backend = backend
        elif url is not None:
            if not isinstance(url, str):
                raise TypeError(
                    f"url= takes a str such as 'postgresql://user@host/db' or "
                    f"'sqlite:///path/to/file', got {url!r:.200}"
                )
            self.backend = _backend_from_url(
                url, durability=durability, busy_timeout=busy_timeout, read_only=read_only
            )
        elif db is not None:
            from stepstone.store._sqlite import SQLiteBackend

            self.backend = SQLiteBackend(
                db, durability=durability, busy_timeout=busy_timeout, read_only=read_only
            )
        else:
            self.backend = MemoryBackend()

    def __repr__(self) -> str:
        return f"Store({self.backend.describe()})"

    # -- sync API ------------------------------------------------------------------------
    def read(self, key: str, default: Any = None) -> Any:
        """The value under ``key`` (a checkpoint key gives the assembled checkpoint dict).

        A missing key gives ``default``. A record that cannot be decoded raises
        :class:`~stepstone.exceptions.CheckpointCorruptError` naming the key.
        """
        entry = self.read_entry(key)
        return default if entry is None else entry.value

    def read_entry(self, key: str) -> StoreEntry | None:
        """The value under ``key`` with its kind and version, or None."""
        text = self.backend.kv_get(check_key(key))
        if text is not None:
            return StoreEntry(key=key, value=_decode(key, text), kind="value")
        found = read_consistent(self.backend, key)
        if found is None:
            return None
        head, rows = found
        return StoreEntry(
            key=key,
            value=render_run(head, rows),
            kind="checkpoint",
            run_kind=head.kind,
            version=head.version,
            updated_at=head.updated_at,
        )

    def write(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` (replacing a plain value; a checkpoint key refuses)."""
        text = dumps(to_json_value(value, where=f"store[{key!r}]"))
        self.backend.kv_put(check_key(key, new=True), text)

    def delete(self, key: str) -> bool:
        """Delete the value or checkpoint (with its journal) under ``key``. True if found."""
        return self.backend.kv_delete(check_key(key))

    def keys(self, prefix: str | None = None) -> list[str]:
        """Sorted keys of values and checkpoints, optionally only those with ``prefix``."""
        return self.backend.kv_keys(_prefix(prefix))

    def __contains__(self, key: object) -> bool:
        """``key in store``: whether ``key`` holds a value or a checkpoint. Two point reads
        by key (nothing is listed or decoded); a key no store can hold (not a string, empty,
        with a NUL) is simply not in it."""
        if not isinstance(key, str) or not key or key_problem(key, new=False) is not None:
            return False
        return self.backend.kv_get(key) is not None or self.backend.run_get(key) is not None

    def __iter__(self) -> Iterator[str]:
        """``for key in store``: the keys of values and checkpoints, sorted, as
        :meth:`keys` lists them when the loop starts (the loop may write or delete)."""
        return iter(self.keys())

    def items(self, prefix: str | None = None, *, kind: ItemKind = None) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs of everything :meth:`read` can read, sorted by key.

        Checkpoints come in the shape :meth:`read` gives them. ``kind="value"`` keeps only
        plain values, ``kind="checkpoint"`` only checkpoints; ``prefix`` keeps only keys
        that start with it (exact, case-sensitive). ``dict(store.items(...))`` makes a dict.

        Example::

            for key, value in store.items(prefix="fan:"):
                print(key, value)
        """
        if kind not in (None, "value", "checkpoint"):
            raise ValueError(f"kind must be None, 'value' or 'checkpoint', got {kind!r}")
        prefix = _prefix(prefix)
        pairs: list[tuple[str, Any]] = []
        if kind != "checkpoint":
            pairs.extend((k, _decode(k, t)) for k, t in self.backend.kv_items(prefix))
        if kind != "value":
            for head in self.backend.run_list(prefix):
                pairs.append((head.key, render_run(head, self.backend.run_journal(head.key))))
            pairs.sort(key=lambda pair: pair[0])
        return pairs

    def compare_and_swap(self, key: str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it currently equals ``expected`` (JSON equality).

        ``expected=None`` means "only if the key is absent". Returns whether it swapped.
        Atomic across threads and processes: the comparison runs inside the database
        transaction.
        """
        new_text = dumps(to_json_value(new, where=f"store[{key!r}]"))
        expected_json = None if expected is None else to_json_value(expected, warn=False)
        return self.backend.kv_cas(check_key(key, new=True), expected_json, new_text, _text_equals)

    def setup(self) -> None:
        """Create or upgrade the backend's schema; idempotent and safe to run from several
        processes at once. Opening a store already does it; call it to fail fast at deploy
        time (a wrong URL or password) or to migrate a database ahead of the workers."""
        self.backend.setup()

    def close(self) -> None:
        """Close connections (a store in memory drops what it held). The store cannot be
        used afterwards: every read and write raises
        :class:`~stepstone.exceptions.StoreError`. Idempotent."""
        self.backend.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self.backend.closed

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def describe(self) -> str:
        """Where this store keeps its data (a file path or a URL without its password)."""
        return self.backend.describe()

    # -- async twins ---------------------------------------------------------------------
    async def _offload(self, fn: Callable[..., R], *args: Any) -> R:
        if self.backend.blocking:
            return await to_thread(fn, *args)
        return fn(*args)

    async def aread(self, key: str, default: Any = None) -> Any:
        """Async :meth:`read`."""
        return await self._offload(self.read, key, default)

    async def aread_entry(self, key: str) -> StoreEntry | None:
        """Async :meth:`read_entry`."""
        return await self._offload(self.read_entry, key)

    async def awrite(self, key: str, value: Any) -> None:
        """Async :meth:`write`."""
        text = dumps(to_json_value(value, where=f"store[{key!r}]"))
        await self._offload(self.backend.kv_put, check_key(key, new=True), text)

    async def adelete(self, key: str) -> bool:
        """Async :meth:`delete`."""
        return await self._offload(self.delete, key)

    async def akeys(self, prefix: str | None = None) -> list[str]:
        """Async :meth:`keys`."""
        return await self._offload(self.keys, prefix)

    async def aitems(
        self, prefix: str | None = None, *, kind: ItemKind = None
    ) -> list[tuple[str, Any]]:
        """Async :meth:`items`."""
        return await self._offload(functools.partial(self.items, prefix, kind=kind))

    async def acontains(self, key: str) -> bool:
        """Async ``key in store``."""
        return await self._offload(self.__contains__, key)

    async def acompare_and_swap(self, key: str, expected: Any, new: Any) -> bool:
        """Async :meth:`compare_and_swap`."""
        return await self._offload(self.compare_and_swap, key, expected, new)

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await self._offload(self.close)


def _text_equals(current_text: str, expected: Any) -> bool:
    try:
        current = loads(current_text)
    except ValueError:
        return False
    return json_equal(current, expected)


def _decode(key: str, text: str) -> Any:
    text = checked_text(text, key, "the value")
    try:
        return loads(text)
    except ValueError as exc:
        raise CheckpointCorruptError(
            f"value under key {key!r} is not valid JSON ({exc}); remove it with "
            f"store.delete({key!r})"
        ) from exc


#: Why a key with a NUL character is refused (PostgreSQL cannot keep one in text, SQLite's
#: C API cuts text at it), for every message that refuses one.
NUL_IN_KEY = "contains a NUL character ('\\x00'), which no store can keep in a key; remove it"


#: The longest key a new record may get, in UTF-8 bytes. PostgreSQL cannot index a longer
#: one (a B-tree entry holds at most 2,704 bytes, the key's index entries add a little), and
#: a key must work in every store, so a run built on SQLite moves to PostgreSQL as it is.
MAX_KEY_BYTES = 2048


def key_problem(key: str, *, new: bool = False) -> str | None:
    """Why no store can keep ``key`` (a str), for a message that names it, or None: a NUL
    character (:data:`NUL_IN_KEY`), or a lone surrogate (as ``os.fsdecode`` or
    ``errors='surrogateescape'`` make of bytes that are not UTF-8), which is not Unicode
    text: neither SQLite nor PostgreSQL can encode it. With ``new`` (a key a record is
    created under), also more than :data:`MAX_KEY_BYTES` bytes: reading or deleting a
    longer key an older version stored is not refused."""
    if "\0" in key:
        return NUL_IN_KEY
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError as exc:
            return (
                f"contains a lone surrogate ({key[exc.start]!r} at index {exc.start}), which "
                "is not Unicode text and no store can keep; remove it, or decode the bytes "
                "it came from with errors='replace'"
            )
    if new and len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES:
        return (
            f"is {len(key.encode())} bytes long in UTF-8, over the {MAX_KEY_BYTES} a key can "
            "have in every store (PostgreSQL cannot index a longer one); use a shorter key, "
            "e.g. a digest of this one: hashlib.sha256(key.encode()).hexdigest()"
        )
    return None


def shown_key(key: object, limit: int = 80) -> str:
    """``repr(key)`` for a message, a str cut after ``limit`` characters (a refused key
    may be megabytes long)."""
    if not isinstance(key, str) or len(key) <= limit:
        return repr(key)
    return f"{key[:limit]!r}... ({len(key)} characters)"


def check_key(key: Any, what: str = "store key", *, new: bool = False) -> str:
    """``key`` if it can be a key in every store: a non-empty string that
    :func:`key_problem` finds nothing wrong with (``new``: a key a record is created
    under)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"a {what} is a non-empty string, got {key!r:.200}")
    problem = key_problem(key, new=new)
    if problem is not None:
        raise ValueError(f"{what} {shown_key(key)} {problem}")
    return key


def _backend_from_url(
    url: str, *, durability: Any, busy_timeout: float, read_only: bool = False
) -> Backend:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from stepstone.store._sqlite import SQLiteBackend

        # sqlite:///relative.db and sqlite:////absolute/path.db, as SQLAlchemy spells them
        rest = url[len("sqlite:") :]
        path = rest[3:] if rest.startswith("///") else rest.lstrip("/")
        if not path:
            raise ValueError(f"store URL {url!r} names no file; use 'sqlite:///path/to/file'")
        return SQLiteBackend(
            path, durability=durability, busy_timeout=busy_timeout, read_only=read_only
        )
    if scheme in ("postgres", "postgresql"):
        try:
            importlib.import_module("psycopg")
        except ImportError as exc:
            raise MissingExtraError("psycopg", "postgres") from exc
        module = importlib.import_module("stepstone.store._postgres")
        backend: Backend = module.PostgresBackend(url, read_only=read_only)
        return backend
    # An unknown scheme is named without the rest of the URL, which may hold a password.
    what = f"unsupported store URL scheme {scheme!r}" if scheme else f"no URL scheme in {url!r}"
    raise ValueError(
        f"{what}; use 'sqlite:///path/to/file' or 'postgresql://user:password@host/dbname'"
    )


def _prefix(prefix: object) -> str | None:
    """``prefix`` checked: a str or None."""
    if prefix is None or isinstance(prefix, str):
        return prefix
    raise TypeError(
        f"prefix must be a str (or None for every key), got {type(prefix).__name__} {prefix!r}"
    )
