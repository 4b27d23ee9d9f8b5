"""Where an invocation's saves go: a journal in a Store, or whole records to a checkpointer
of the user's.

Both take the same row data (a ``start`` row, then one ``node`` or ``branch`` row per save):
:class:`JournalSink` commits each row through the durable kernel; :class:`RecordSink` folds
it into the record it keeps, as :func:`~stepstone.engines.graph._fold.fold` folds a
journal, and hands the whole record to the checkpointer's ``asave``.
"""

from __future__ import annotations

import time
from typing import Any

from stepstone.durable import OwnedRun, blocking_call, claim_run
from stepstone.engines.graph._checkpoint import StoreCheckpointer, record_meta, start_row
from stepstone.engines.graph._codec import Codec
from stepstone.engines.graph._fold import apply_row
from stepstone.engines.graph._records import (
    GRAPH_KIND,
    CheckpointRecord,
    FanOutAt,
    Frame,
    NodePosition,
    RawRecord,
)
from stepstone.exceptions import CheckpointNotFound
from stepstone.store._store import Store

__all__ = ["JournalSink", "RecordSink", "Sink", "load_record"]


class Sink:
    """Where one invocation's saves go (see the module docstring)."""

    codec: Codec
    #: The store of a journal (LLM loops in nodes journal beside it), else None.
    store: Store | None = None
    #: The chain's first invocation, when LLM loops in nodes can journal.
    origin: str | None = None

    async def commit(
        self, kind: str, name: str, data: dict[str, Any], next_node: str | None, iteration: int
    ) -> None:
        """Save one row: a completed node or a finished fan-out branch."""
        raise NotImplementedError

    async def finish(self, status: str, error: dict[str, Any] | None) -> None:
        """Record how the invocation ended (best effort after a failure: see callers)."""
        raise NotImplementedError

    def release(self) -> None:
        """Stop owning the record (journals); nothing otherwise."""


class JournalSink(Sink):
    """An invocation recorded as a durable run in a Store: one commit per row."""

    def __init__(self, cp: StoreCheckpointer, owned: OwnedRun) -> None:
        self.codec = cp.codec
        self.owned = owned
        self.store = cp.store
        origin = owned.head.meta.get("origin")
        self.origin = origin if isinstance(origin, str) else None

    @classmethod
    def start(
        cls,
        cp: StoreCheckpointer,
        *,
        invocation_id: str,
        frames: list[Frame],
        positions: list[NodePosition],
        attempt: int,
        correlation_id: str,
        resumed_from: str | None,
        metadata: dict[str, Any],
        origin: str,
        fan_outs: dict[FanOutAt, dict[int, Any]],
        first_node: str,
    ) -> JournalSink:
        """Claim the new invocation's record with its start row, in one transaction: a
        process killed at any moment leaves either no record or one that holds its start
        (the frames and positions it resumes from), never a head without one."""
        data = start_row(
            cp.codec,
            frames,
            positions,
            attempt=attempt,
            resumed_from=resumed_from,
            metadata=metadata,
            fan_outs=fan_outs,
        )
        claim = claim_run(
            cp.store,
            cp.key(invocation_id),
            kind=GRAPH_KIND,
            resume=False,
            first_step=first_node,
            meta=record_meta(
                invocation_id=invocation_id,
                correlation_id=correlation_id,
                schema_version=frames[0].schema_version,
                serialization=cp.serialization,
                resumed_from=resumed_from,
                origin=origin,
            ),
            what="graph invocation",
            first_rows=[("start", None, data)],
        )
        assert claim.run is not None
        return cls(cp, claim.run)

    async def commit(
        self, kind: str, name: str, data: dict[str, Any], next_node: str | None, iteration: int
    ) -> None:
        await self.owned.commit(
            status="running", next_step=next_node, iteration=iteration, rows=[(kind, name, data)]
        )

    async def finish(self, status: str, error: dict[str, Any] | None) -> None:
        meta = dict(self.owned.head.meta)
        if error is not None:
            meta["error"] = error
        await self.owned.commit(status=status, next_step=None, meta=meta)

    def release(self) -> None:
        self.owned.release()


class RecordSink(Sink):
    """An invocation saved as whole records by a checkpointer of the user's."""

    def __init__(self, cp: Any, raw: RawRecord) -> None:
        self.codec = Codec("json", None)
        self.cp = cp
        self.raw = raw

    @classmethod
    async def start(
        cls,
        cp: Any,
        *,
        invocation_id: str,
        frames: list[Frame],
        positions: list[NodePosition],
        attempt: int,
        correlation_id: str,
        resumed_from: str | None,
        metadata: dict[str, Any],
        fan_outs: dict[FanOutAt, dict[int, Any]],
    ) -> RecordSink:
        """The new invocation's first record, saved before any node runs."""
        raw = RawRecord(
            head=None,
            invocation_id=invocation_id,
            correlation_id=correlation_id,
            frames=frames,
            positions=list(positions),
            attempt=attempt,
            resumed_from=resumed_from,
            metadata=metadata,
            serialization="json",
            fan_outs={at: dict(done) for at, done in fan_outs.items()},
        )
        sink = cls(cp, raw)
        await sink._save(raw)
        return sink

    async def _save(self, raw: RawRecord) -> None:
        raw.last_saved_at = time.time()
        await self.cp.asave(raw.public())

    async def commit(
        self, kind: str, name: str, data: dict[str, Any], next_node: str | None, iteration: int
    ) -> None:
        # Applied to a copy, kept only once saved: a save that fails leaves the record as
        # it was, so the run's last record never claims a node its save lost.
        raw = self.raw.copy()
        apply_row(raw, kind, data, self.codec, f"graph record {raw.invocation_id!r}")
        await self._save(raw)
        self.raw = raw

    async def finish(self, status: str, error: dict[str, Any] | None) -> None:
        raw = self.raw.copy()
        raw.status = status
        raw.error = error
        await self._save(raw)
        self.raw = raw


async def load_record(cp: Any, invocation_id: str) -> RawRecord:
    """The record of ``invocation_id`` from any checkpointer, in the engine's form."""
    if isinstance(cp, StoreCheckpointer):
        return await blocking_call(cp.store, cp.load_raw, invocation_id, bulk=True)
    rec = await cp.aload(invocation_id)
    if not isinstance(rec, CheckpointRecord):
        if rec is None:
            raise CheckpointNotFound(
                f"{type(cp).__name__}.aload({invocation_id!r}) returned None: a checkpointer "
                "raises CheckpointNotFound for a missing record (stepstone.graph.Checkpointer)"
            )
        raise TypeError(
            f"{type(cp).__name__}.aload({invocation_id!r}) returned {rec!r}, not a CheckpointRecord"
        )
    return RawRecord.of(rec)
