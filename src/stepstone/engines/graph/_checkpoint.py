"""The graph checkpointers: one class over any Store, and its SQLite and in-memory forms.

The record types live in ``_records``, the body codec in ``_codec``, journal folding and
the store's view of a graph run in ``_fold``.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from stepstone.core._serialization import SignedPickle
from stepstone.durable import blocking_call, claim_run, delete_run, list_runs, read_run
from stepstone.engines.graph._codec import Codec
from stepstone.engines.graph._fold import fold
from stepstone.engines.graph._protocol import Checkpointer
from stepstone.engines.graph._records import (
    GRAPH_KIND,
    RECORD_FORMAT,
    CheckpointFilter,
    CheckpointRecord,
    FanOutAt,
    Frame,
    NodePosition,
    RawRecord,
    Serialization,
)
from stepstone.exceptions import (
    CheckpointCorruptError,
    CheckpointNotFound,
    CheckpointRecordInvalid,
    ConfigurationTypeError,
    UserError,
)
from stepstone.store._store import Store

log = logging.getLogger("stepstone")

__all__ = [
    "InMemoryCheckpointer",
    "SQLiteCheckpointer",
    "StoreCheckpointer",
    "record_meta",
    "start_row",
]


def start_row(
    codec: Codec,
    frames: Sequence[Frame],
    positions: Sequence[NodePosition],
    *,
    attempt: int,
    resumed_from: str | None,
    metadata: dict[str, Any],
    fan_outs: Mapping[FanOutAt, Mapping[int, Any]],
) -> dict[str, Any]:
    """The data of an invocation's ``start`` row: where each frame stands, the positions
    and unfinished fan-outs it carries on."""
    fans = list(fan_outs.items())
    plain: dict[str, Any] = {
        "frames": [f.to_plain() for f in frames],
        "positions": [p.to_json() for p in positions],
        "attempt": attempt,
        "resumed_from": resumed_from,
        "metadata": metadata,
    }
    body: dict[str, Any] = {"frames": [f.to_body() for f in frames]}
    if fans:  # format 2; a run without fan-outs writes what format 1 wrote
        plain["fan_outs"] = [
            {"at": [list(at[0]), at[1], at[2]], "indexes": sorted(done)} for at, done in fans
        ]
        body["fan_results"] = [[done[i] for i in sorted(done)] for _, done in fans]
    return codec.encode(plain, body)


def record_meta(
    *,
    invocation_id: str,
    correlation_id: str,
    schema_version: str,
    serialization: str,
    resumed_from: str | None,
    origin: str,
) -> dict[str, Any]:
    """The head meta of an invocation's record."""
    return {
        "format": RECORD_FORMAT,
        "invocation_id": invocation_id,
        "correlation_id": correlation_id,
        "schema_version": schema_version,
        "serialization": serialization,
        "resumed_from": resumed_from,
        "origin": origin,  # the first invocation of the chain (keys LLM loops in nodes)
    }


class StoreCheckpointer(Checkpointer):
    """Saves graph checkpoints in any :class:`~stepstone.Store` (memory, SQLite, PostgreSQL).

    Every save goes through the durable kernel: one atomic commit per completed node,
    appended to the invocation's journal. Pass it to ``GraphBuilder.with_checkpointer``.

    Args:
        store: Where records live.
        serialization: ``"json"`` (default; records can be migrated and read by any
            process) or ``"pickle"`` (any picklable state; never migrated; signed).
        pickle_key: The HMAC key (at least 16 bytes) or a :class:`SignedPickle`; required
            for ``"pickle"``. An unsigned or tampered record is refused. A JSON
            checkpointer given a key can also read pickle records.
        prefix: Key prefix of the records in the store.

    Example::

        checkpointer = StoreCheckpointer(Store(url="postgresql://..."))
        graph = GraphBuilder(Mission)...with_checkpointer(checkpointer).compile()
    """

    def __init__(
        self,
        store: Store,
        *,
        serialization: Serialization = "json",
        pickle_key: bytes | str | SignedPickle | None = None,
        prefix: str = "graph:",
    ) -> None:
        if not isinstance(store, Store):
            raise ConfigurationTypeError(
                f"StoreCheckpointer takes a stepstone Store, got {store!r}; pass Store(), "
                "Store(db='checkpoints.sqlite') or Store(url='postgresql://...'), or use "
                "SQLiteCheckpointer(path) for a SQLite file"
            )
        if not prefix:
            raise UserError("prefix must be a non-empty string such as 'graph:'")
        self.store = store
        self.codec = Codec(serialization, pickle_key)
        self.prefix = prefix

    @property
    def serialization(self) -> Serialization:
        """``"json"`` or ``"pickle"``."""
        return self.codec.serialization

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r}, serialization={self.serialization!r})"

    def key(self, invocation_id: str) -> str:
        """The store key of an invocation's record."""
        return f"{self.prefix}{invocation_id}"

    def lock_key(self, invocation_id: str) -> str:
        """The store key that serializes resumes of one record."""
        return f"{self.prefix}{invocation_id}#resume"

    # -- reading -------------------------------------------------------------------------
    def load_raw(self, invocation_id: str) -> RawRecord:
        """The folded record with its frame stack (engine-internal)."""
        found = read_run(self.store, self.key(invocation_id))
        if found is None or found[0].kind != GRAPH_KIND:
            raise CheckpointNotFound(
                f"no graph checkpoint for invocation_id {invocation_id!r} in "
                f"{self.store!r}; list the saved ones with "
                "checkpointer.list(CheckpointFilter(correlation_id=...))"
            )
        return fold(found[0], found[1], self.codec)

    def load(self, invocation_id: str) -> CheckpointRecord:
        """The record of ``invocation_id``.

        Raises:
            CheckpointNotFound: no such record.
            CheckpointRecordInvalid: it cannot be decoded, or its pickle was refused.
        """
        return self.load_raw(invocation_id).public()

    def list(self, filter: CheckpointFilter | None = None) -> list[CheckpointRecord]:
        """Records matching ``filter``, oldest ``last_saved_at`` first.

        Raises:
            ConfigurationTypeError: ``filter`` is not a :class:`CheckpointFilter` or None.
        """
        if filter is not None and not isinstance(filter, CheckpointFilter):
            raise ConfigurationTypeError(
                f"checkpointer.list() takes a CheckpointFilter or None, got {filter!r}; "
                "pass list(CheckpointFilter(correlation_id=..., status=...))"
            )
        flt = filter or CheckpointFilter()
        out: list[CheckpointRecord] = []
        for head in list_runs(self.store, self.prefix):
            if head.status == "corrupt":  # one corrupt record never hides the others
                log.warning("stepstone: skipping a corrupt record: %s", head.meta.get("corrupt"))
                continue
            if head.kind != GRAPH_KIND or head.journal_len == 0:
                continue  # not a graph record, or claimed but killed before its first save
            if flt.correlation_id is not None and (
                head.meta.get("correlation_id") != flt.correlation_id
            ):
                continue
            try:
                rec = self.load(str(head.meta.get("invocation_id")))
            except CheckpointNotFound:
                continue  # deleted meanwhile
            except (CheckpointCorruptError, CheckpointRecordInvalid) as exc:
                log.warning("stepstone: skipping a record that cannot be decoded: %s", exc)
                continue
            if flt.status is not None and rec.status != flt.status:
                continue
            out.append(rec)
        out.sort(key=lambda r: r.last_saved_at)
        return out

    def save(self, record: CheckpointRecord) -> None:
        """Store ``record`` whole, replacing what is saved under its ``invocation_id`` (the
        engine does not call it: it commits each node as it completes). The record is
        written in one transaction with status ``running``, then given its own status;
        ``last_saved_at`` is the database's time.

        Raises:
            ConcurrentRunError: a live invocation is writing that record.
        """
        raw = RawRecord.of(record)
        data = start_row(
            self.codec,
            raw.frames,
            raw.positions,
            attempt=raw.attempt,
            resumed_from=raw.resumed_from,
            metadata=raw.metadata,
            fan_outs=raw.fan_outs,
        )
        meta = record_meta(
            invocation_id=record.invocation_id,
            correlation_id=record.correlation_id,
            schema_version=raw.frames[0].schema_version,
            serialization=self.serialization,
            resumed_from=record.resumed_from,
            origin=record.invocation_id,
        )
        claim = claim_run(
            self.store,
            self.key(record.invocation_id),
            kind=GRAPH_KIND,
            resume=False,
            first_step=None,
            meta=meta,
            what="graph record",
            first_rows=[("start", None, data)],
        )
        assert claim.run is not None
        try:
            if record.status != "running":
                error = {"error": dict(record.error)} if record.error is not None else {}
                claim.run.commit_sync(status=record.status, next_step=None, meta={**meta, **error})
        finally:
            claim.run.release()

    def delete(self, invocation_id: str) -> bool:
        """Delete an invocation's record; True if it existed."""
        delete_run(self.store, self.lock_key(invocation_id))
        return delete_run(self.store, self.key(invocation_id))

    def close(self) -> None:
        """Close the underlying store."""
        self.store.close()

    # -- async twins ---------------------------------------------------------------------
    async def asave(self, record: CheckpointRecord) -> None:
        """Async :meth:`save`."""
        await blocking_call(self.store, self.save, record)

    async def aload(self, invocation_id: str) -> CheckpointRecord:
        """Async :meth:`load`."""
        return await blocking_call(self.store, self.load, invocation_id, bulk=True)

    async def alist(
        self, filter: CheckpointFilter | None = None
    ) -> builtins.list[CheckpointRecord]:
        """Async :meth:`list`."""
        return await blocking_call(self.store, self.list, filter, bulk=True)

    async def adelete(self, invocation_id: str) -> bool:
        """Async :meth:`delete`."""
        return await blocking_call(self.store, self.delete, invocation_id)


class SQLiteCheckpointer(StoreCheckpointer):
    """Graph checkpoints in a SQLite file: synchronous, one transaction per completed node.

    Args:
        path: The database file (created if missing; its directory must exist).
        serialization: ``"json"`` (default, migration-eligible) or ``"pickle"`` (signed,
            never migrated).
        pickle_key: Required for ``"pickle"`` (see :class:`StoreCheckpointer`).
        durability: ``"full"`` (default, survives power loss) or ``"normal"``.

    Example::

        checkpointer = SQLiteCheckpointer("checkpoints.sqlite")           # JSON
        signed = SQLiteCheckpointer("c.sqlite", serialization="pickle",
                                    pickle_key=os.environ["STEPSTONE_PICKLE_KEY"])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        serialization: Serialization = "json",
        *,
        pickle_key: bytes | str | SignedPickle | None = None,
        durability: Literal["full", "normal"] = "full",
    ) -> None:
        if path is None:  # Store(db=None) would be a store in memory
            raise ConfigurationTypeError(
                "SQLiteCheckpointer takes the path of a SQLite file, got None; pass "
                "SQLiteCheckpointer('checkpoints.sqlite'), or use InMemoryCheckpointer() "
                "for checkpoints in memory"
            )
        codec = Codec(serialization, pickle_key)  # validate before creating a file
        super().__init__(
            Store(db=path, durability=durability),
            serialization=codec.serialization,
            pickle_key=codec.signer,
        )
        self.path = os.fspath(path)


class InMemoryCheckpointer(StoreCheckpointer):
    """Graph checkpoints in process memory (tests, notebooks): lost when the process ends.

    Args:
        serialization: ``"json"`` (default) or ``"pickle"`` (needs ``pickle_key``).
        pickle_key: See :class:`StoreCheckpointer`.
    """

    def __init__(
        self,
        serialization: Serialization = "json",
        *,
        pickle_key: bytes | str | SignedPickle | None = None,
    ) -> None:
        super().__init__(Store(), serialization=serialization, pickle_key=pickle_key)
