"""Graph checkpoints: records, the journal format, and the checkpointers over a Store.

A graph invocation is one durable run of kind ``"graph"`` under ``<prefix><invocation_id>``,
written through the kernel (``claim_run`` + one ``OwnedRun.commit`` per completed node).
Its journal holds one ``start`` row (the starting state, carried positions) and one
``node`` row per completed node: the node's position and a *patch* of the fields it
changed (items appended to ``append`` fields, new values of the others). Bytes written per
node do not grow with the run's length; :meth:`StoreCheckpointer.load` folds the rows back
into a :class:`CheckpointRecord`.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from stepstone.core._serialization import SignedPickle
from stepstone.durable import blocking_call, delete_run, list_runs, read_run
from stepstone.engines.graph._state import apply_patch
from stepstone.exceptions import (
    CheckpointCorruptError,
    CheckpointNotFound,
    CheckpointRecordInvalid,
    SerializationError,
    UserError,
)
from stepstone.store._base import JournalRow, RunHead
from stepstone.store._store import Store
from stepstone.store._views import register_run_view

log = logging.getLogger("stepstone")

__all__ = [
    "GRAPH_KIND",
    "LOCK_KIND",
    "CheckpointFilter",
    "CheckpointRecord",
    "Frame",
    "InMemoryCheckpointer",
    "NodePosition",
    "RawRecord",
    "SQLiteCheckpointer",
    "StoreCheckpointer",
]

GRAPH_KIND = "graph"
LOCK_KIND = "graph.resume"
#: Version of the journal layout below; records carry it so old layouts keep loading.
RECORD_FORMAT = 1

Serialization = Literal["json", "pickle"]


class NodePosition(NamedTuple):
    """Where a completed node ran: resume skips by position, never by name.

    Attributes:
        namespace: The subgraph path (names of the subgraph nodes from the outermost
            graph); ``()`` for the outermost graph.
        node_name: The node.
        step: The node's visit number within its namespace (0, 1, 2... across loops and
            repeated subgraph visits), so a node visited twice has two positions.
        attempt_index: Which invoke of the invocation chain completed it (0 for the first
            invoke, 1 for the first resume...).
    """

    namespace: tuple[str, ...]
    node_name: str
    step: int
    attempt_index: int

    def to_json(self) -> list[Any]:
        """``[namespace, node_name, step, attempt_index]``."""
        return [list(self.namespace), self.node_name, self.step, self.attempt_index]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> NodePosition:
        """Undo :meth:`to_json`."""
        ns, name, step, attempt = data
        return cls(tuple(str(n) for n in ns), str(name), int(step), int(attempt))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """One invocation's saved checkpoint, as last committed.

    Attributes:
        invocation_id: The invoke that wrote it (each invoke, resumes included, has its own).
        correlation_id: The caller's join key, shared by every attempt of one job.
        state: The saved state of the graph whose node completed last: a dict for JSON
            records, the State instance for pickle records (``CompiledGraph.load_record``
            gives a typed, migrated instance). When the last save happened inside a
            subgraph, it is the subgraph's state.
        completed_positions: Every completed node of the invocation chain, in order.
        parent_states: The states of the enclosing graphs (outermost first) when the last
            save happened inside a subgraph; ``()`` otherwise.
        schema_version: The ``schema_version`` of ``state``'s class when it was saved.
        last_saved_at: Unix time of the last save.
        status: ``"running"`` (in progress, or its process died), ``"failed"`` (a node
            raised) or ``"done"``.
        resumed_from: The invocation this one resumed, if any.
        attempt_index: This invocation's attempt number in its chain (0 = first invoke).
        serialization: ``"json"`` or ``"pickle"``.
        metadata: What the caller passed as ``invoke(metadata=...)``.
    """

    invocation_id: str
    correlation_id: str
    state: Any
    completed_positions: tuple[NodePosition, ...]
    parent_states: tuple[Any, ...]
    schema_version: str
    last_saved_at: float
    status: str = "running"
    resumed_from: str | None = None
    attempt_index: int = 0
    serialization: Serialization = "json"
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointFilter:
    """Which records :meth:`StoreCheckpointer.list` returns (all given fields must match).

    Attributes:
        correlation_id: Only the attempts of this job.
        status: Only records in this status (``"running"``, ``"failed"``, ``"done"``).

    Example::

        attempts = checkpointer.list(CheckpointFilter(correlation_id="mission-1"))
        latest = attempts[-1].invocation_id      # sorted by last_saved_at
    """

    correlation_id: str | None = None
    status: str | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class Frame:
    """One graph level of a saved record (engine-internal).

    The outermost graph is frame 0; a subgraph node in progress adds a frame.

    Attributes:
        node: The parent graph's node that runs this subgraph (None for frame 0).
        step: That node's step in the parent graph.
        ns: This graph's namespace.
        state: The saved state (JSON dict or State instance).
        initial: The subgraph's state when it was entered (to project its changes out).
        schema_version: The version ``state`` was saved at.
        last: ``(node_name, step)`` of the last node completed in this frame, if any.
    """

    node: str | None
    step: int | None
    ns: tuple[str, ...]
    state: Any
    initial: Any
    schema_version: str
    last: tuple[str, int] | None = None

    def to_body(self) -> dict[str, Any]:
        """The part that is serialized (states included)."""
        return {"state": self.state, "initial": self.initial}

    def to_plain(self) -> dict[str, Any]:
        """The part that is stored as plain JSON (no states)."""
        return {
            "node": self.node,
            "step": self.step,
            "ns": list(self.ns),
            "schema_version": self.schema_version,
            "last": list(self.last) if self.last is not None else None,
        }

    @classmethod
    def from_parts(cls, plain: Mapping[str, Any], body: Mapping[str, Any]) -> Frame:
        """Undo :meth:`to_plain` + :meth:`to_body`."""
        last = plain.get("last")
        return cls(
            node=plain.get("node"),
            step=plain.get("step"),
            ns=tuple(plain.get("ns") or ()),
            state=body["state"],
            initial=body.get("initial"),
            schema_version=str(plain.get("schema_version", "")),
            last=(str(last[0]), int(last[1])) if last else None,
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class RawRecord:
    """A record folded from its journal, with its frame stack (engine-internal)."""

    head: RunHead
    invocation_id: str
    correlation_id: str
    frames: list[Frame]
    positions: list[NodePosition]
    attempt: int
    resumed_from: str | None
    metadata: dict[str, Any]
    serialization: Serialization

    def public(self) -> CheckpointRecord:
        """The user-facing :class:`CheckpointRecord`."""
        top = self.frames[-1]
        return CheckpointRecord(
            invocation_id=self.invocation_id,
            correlation_id=self.correlation_id,
            state=top.state,
            completed_positions=tuple(self.positions),
            parent_states=tuple(f.state for f in self.frames[:-1]),
            schema_version=top.schema_version,
            last_saved_at=self.head.updated_at,
            status="running" if self.head.status == "claimed" else self.head.status,
            resumed_from=self.resumed_from,
            attempt_index=self.attempt,
            serialization=self.serialization,
            metadata=dict(self.metadata),
        )


class Codec:
    """Encodes the serialized body of journal rows: inline JSON, or a signed pickle."""

    def __init__(self, serialization: str, pickle_key: bytes | str | SignedPickle | None) -> None:
        if serialization not in ("json", "pickle"):
            raise UserError(
                f"serialization must be 'json' (the default; migrations need it) or 'pickle', "
                f"got {serialization!r}"
            )
        self.serialization: Serialization = "json" if serialization == "json" else "pickle"
        if isinstance(pickle_key, SignedPickle):
            self.signer: SignedPickle | None = pickle_key
        elif pickle_key is not None:
            self.signer = SignedPickle(pickle_key)
        else:
            self.signer = None
        if self.serialization == "pickle" and self.signer is None:
            raise UserError(
                "serialization='pickle' needs a signing key: pass pickle_key=<at least 16 "
                "bytes kept out of the database> (stepstone never loads an unsigned pickle), "
                "or use serialization='json'"
            )

    def encode(self, plain: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """A row's data: ``plain`` fields plus the body (inline JSON or signed pickle)."""
        if self.serialization == "pickle":
            assert self.signer is not None
            blob = self.signer.dumps(body)
            return {**plain, "body_pickle": base64.b64encode(blob).decode("ascii")}
        return {**plain, "body": body}

    def decode(self, data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """The body of a row, verifying a pickle's signature."""
        if "body_pickle" in data:
            if self.signer is None:
                raise CheckpointRecordInvalid(
                    f"{where} was saved with serialization='pickle'; open it with a "
                    "checkpointer created with serialization='pickle', pickle_key=<the key "
                    "it was signed with>"
                )
            try:
                blob = base64.b64decode(str(data["body_pickle"]), validate=True)
            except ValueError as exc:
                raise CheckpointRecordInvalid(
                    f"{where} holds a pickle that is not valid base64: refused ({exc})"
                ) from exc
            try:
                body = self.signer.loads(blob)
            except SerializationError as exc:
                raise CheckpointRecordInvalid(f"{where}: {exc}; it was not loaded") from exc
            if not isinstance(body, dict):
                raise CheckpointRecordInvalid(f"{where} holds a pickle of the wrong shape")
            return body
        body = data.get("body")
        if not isinstance(body, dict):
            raise CheckpointRecordInvalid(f"{where} has no body")
        return body


def fold(head: RunHead, rows: Sequence[JournalRow], codec: Codec | None) -> RawRecord:
    """Fold a graph run's journal into a :class:`RawRecord`.

    ``codec=None`` folds without decoding bodies (states stay None), for the store view.
    """
    where = f"graph checkpoint {head.key!r}"
    meta = head.meta
    try:
        if not rows or rows[0].kind != "start":
            raise CheckpointRecordInvalid(
                f"{where} has no start row (it was interrupted before its first save); "
                f"remove it with checkpointer.delete({meta.get('invocation_id')!r})"
            )
        start = json.loads(rows[0].data)
        start_body = codec.decode(start, where=where) if codec is not None else {"frames": None}
        body_frames = start_body["frames"] or [{"state": None}] * len(start["frames"])
        frames = [Frame.from_parts(p, b) for p, b in zip(start["frames"], body_frames, strict=True)]
        positions = [NodePosition.from_json(p) for p in start["positions"]]
        for row in rows[1:]:
            if row.kind != "node":
                continue
            data = json.loads(row.data)
            for _ in range(int(data.get("pop", 0))):
                frames.pop()
            body = codec.decode(data, where=where) if codec is not None else None
            for plain, fbody in zip(
                data.get("push", []),
                body["push"] if body is not None else [None] * len(data.get("push", [])),
                strict=True,
            ):
                frames.append(Frame.from_parts(plain, fbody or {"state": None}))
            pos = NodePosition.from_json(data["pos"])
            top = frames[-1]
            if body is not None:
                top.state = apply_patch(top.state, body["patch"])
            top.last = (pos.node_name, pos.step)
            positions.append(pos)
        return RawRecord(
            head=head,
            invocation_id=str(meta["invocation_id"]),
            correlation_id=str(meta["correlation_id"]),
            frames=frames,
            positions=positions,
            attempt=int(start.get("attempt", 0)),
            resumed_from=start.get("resumed_from"),
            metadata=dict(start.get("metadata") or {}),
            serialization="pickle" if meta.get("serialization") == "pickle" else "json",
        )
    except CheckpointRecordInvalid:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CheckpointRecordInvalid(
            f"{where} cannot be decoded ({type(exc).__name__}: {exc}); remove it with "
            f"checkpointer.delete({meta.get('invocation_id')!r})"
        ) from exc


def _graph_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
    """What ``store.read(key)`` shows for a graph run."""
    pickled = head.meta.get("serialization") == "pickle"
    raw = fold(head, rows, None if pickled else Codec("json", None))
    rec = raw.public()
    return {
        "kind": GRAPH_KIND,
        "invocation_id": rec.invocation_id,
        "correlation_id": rec.correlation_id,
        "status": rec.status,
        "schema_version": rec.schema_version,
        "serialization": rec.serialization,
        "state": "<signed pickle>" if pickled else rec.state,
        "parent_states": ["<signed pickle>" if pickled else s for s in rec.parent_states],
        "completed_positions": [p.to_json() for p in rec.completed_positions],
        "resumed_from": rec.resumed_from,
        "attempt_index": rec.attempt_index,
        "next_node": head.next_step,
        "error": head.meta.get("error"),
        "last_saved_at": rec.last_saved_at,
    }


register_run_view(GRAPH_KIND, _graph_view)


class StoreCheckpointer:
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
        """Records matching ``filter``, oldest ``last_saved_at`` first."""
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

    def delete(self, invocation_id: str) -> bool:
        """Delete an invocation's record; True if it existed."""
        delete_run(self.store, self.lock_key(invocation_id))
        return delete_run(self.store, self.key(invocation_id))

    def close(self) -> None:
        """Close the underlying store."""
        self.store.close()

    # -- async twins ---------------------------------------------------------------------
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
