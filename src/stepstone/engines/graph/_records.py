"""Graph checkpoint records: positions, the saved record, its frames, the list filter.

A graph invocation is one durable run of kind ``"graph"`` under ``<prefix><invocation_id>``,
written through the kernel (``claim_run``, which writes the ``start`` row with the claim,
then one ``OwnedRun.commit`` per completed node).
Its journal holds one ``start`` row (the starting state, carried positions) and one
``node`` row per completed node: the node's position and a *patch* of the fields it
changed (items appended to ``append`` fields, new values of the others). Format 2 adds a
``branch`` row per finished fan-out branch (its result, merged when the fan-out node
completes) and the unfinished fan-outs' results in the start row. Bytes written per node
do not grow with the run's length; :func:`~stepstone.engines.graph._fold.fold` folds the
rows back into a :class:`RawRecord`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError
from stepstone.store._base import RUN_STATUSES, RunHead

__all__ = [
    "FanOutProgress",
    "GRAPH_KIND",
    "LOCK_KIND",
    "RECORD_FORMAT",
    "CheckpointFilter",
    "CheckpointRecord",
    "Frame",
    "RECORD_STATUSES",
    "NodePosition",
    "RawRecord",
    "Serialization",
    "record_status",
]

GRAPH_KIND = "graph"
LOCK_KIND = "graph.resume"
#: Version of the journal layout below; records carry it so old layouts keep loading.
#: 1: ``start`` and ``node`` rows. 2: also ``branch`` rows and the start row's ``fan_outs``.
RECORD_FORMAT = 2

Serialization = Literal["json", "pickle"]


def record_status(run_status: str) -> str:
    """A record's status for its run's: a claimed run is shown as ``"running"``."""
    return "running" if run_status == "claimed" else run_status


#: Every status a :class:`CheckpointRecord` can show (the run statuses, claimed as running).
RECORD_STATUSES = tuple(dict.fromkeys(record_status(s) for s in RUN_STATUSES))


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
        error: For a ``"failed"`` record: ``{"type", "message", "node"}`` of the error.
        fan_outs: The fan-out nodes in progress when the record was saved, with the results
            of the branches that finished (a resume runs only the others).
        frames: Where each graph level continues (its namespace, the subgraph node and
            step it runs in, the state it started from, its last completed node): engine
            data, JSON for a JSON record; store it as it is.
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
    error: Mapping[str, Any] | None = None
    fan_outs: tuple[FanOutProgress, ...] = ()
    frames: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data (a JSON record: ``serialization="json"``), for a
        checkpointer of your own to store; :meth:`from_json` rebuilds an equal record."""
        return {
            "format": RECORD_FORMAT,
            "invocation_id": self.invocation_id,
            "correlation_id": self.correlation_id,
            "state": self.state,
            "completed_positions": [p.to_json() for p in self.completed_positions],
            "parent_states": list(self.parent_states),
            "schema_version": self.schema_version,
            "last_saved_at": self.last_saved_at,
            "status": self.status,
            "resumed_from": self.resumed_from,
            "attempt_index": self.attempt_index,
            "serialization": self.serialization,
            "metadata": dict(self.metadata),
            "error": dict(self.error) if self.error is not None else None,
            "fan_outs": [f.to_json() for f in self.fan_outs],
            "frames": [dict(f) for f in self.frames],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointRecord:
        """Undo :meth:`to_json`."""
        error = data.get("error")
        return cls(
            invocation_id=str(data["invocation_id"]),
            correlation_id=str(data["correlation_id"]),
            state=data["state"],
            completed_positions=tuple(
                NodePosition.from_json(p) for p in data["completed_positions"]
            ),
            parent_states=tuple(data.get("parent_states") or ()),
            schema_version=str(data.get("schema_version", "")),
            last_saved_at=float(data.get("last_saved_at", 0.0)),
            status=str(data.get("status", "running")),
            resumed_from=data.get("resumed_from"),
            attempt_index=int(data.get("attempt_index", 0)),
            serialization="pickle" if data.get("serialization") == "pickle" else "json",
            metadata=dict(data.get("metadata") or {}),
            error=dict(error) if isinstance(error, Mapping) else None,
            fan_outs=tuple(FanOutProgress.from_json(f) for f in data.get("fan_outs") or ()),
            frames=tuple(dict(f) for f in data.get("frames") or ()),
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FanOutProgress:
    """A fan-out node in progress: the branches that finished, with their results.

    Attributes:
        namespace: The subgraph path of the fan-out node (``()`` for the outer graph).
        node_name: The fan-out node.
        step: Its visit number in its namespace.
        results: ``(index, result)`` of every finished branch, by index: ``index`` is the
            item's place in the list, ``result`` what the branch returned (its JSON form
            in a JSON record).
    """

    namespace: tuple[str, ...]
    node_name: str
    step: int
    results: tuple[tuple[int, Any], ...] = ()

    @property
    def at(self) -> tuple[tuple[str, ...], str, int]:
        """``(namespace, node_name, step)``: which fan-out this is."""
        return (self.namespace, self.node_name, self.step)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (see :meth:`CheckpointRecord.to_json`)."""
        return {
            "namespace": list(self.namespace),
            "node_name": self.node_name,
            "step": self.step,
            "results": [[i, r] for i, r in self.results],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FanOutProgress:
        """Undo :meth:`to_json`."""
        return cls(
            namespace=tuple(str(n) for n in data["namespace"]),
            node_name=str(data["node_name"]),
            step=int(data["step"]),
            results=tuple((int(i), r) for i, r in data.get("results") or ()),
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointFilter:
    """Which records :meth:`StoreCheckpointer.list` returns (all given fields must match).

    Attributes:
        correlation_id: Only the attempts of this job.
        status: Only records in this status (``"running"``, ``"failed"``, ``"done"``; any
            of :data:`RECORD_STATUSES`).

    Raises:
        ConfigurationError: ``status`` is not one of :data:`RECORD_STATUSES`, or
            ``correlation_id`` is empty (``ConfigurationTypeError`` when either is not a
            str or None): such a filter would match nothing.

    Example::

        attempts = checkpointer.list(CheckpointFilter(correlation_id="mission-1"))
        latest = attempts[-1].invocation_id      # sorted by last_saved_at
    """

    correlation_id: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        # A value no record can hold would match nothing, silently: refuse it here.
        for name in ("correlation_id", "status"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigurationTypeError(
                    f"CheckpointFilter {name} must be a str or None, got {value!r}; pass "
                    f"CheckpointFilter({name}='...') or leave it out to match every record"
                )
        if self.correlation_id == "":
            raise ConfigurationError(
                "CheckpointFilter correlation_id must not be empty (no record has an empty "
                "one); pass the job's key, or None to match every record"
            )
        if self.status is not None and self.status not in RECORD_STATUSES:
            shown = record_status(self.status)
            hint = (
                "" if shown == self.status else f" (a {self.status} run's record shows {shown!r})"
            )
            raise ConfigurationError(
                f"CheckpointFilter status {self.status!r} is not a status a record can have"
                f"{hint}; pass one of {', '.join(map(repr, RECORD_STATUSES))}, or None to "
                "match every status"
            )


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

    def to_public(self) -> dict[str, Any]:
        """This frame as :attr:`CheckpointRecord.frames` shows it (its state is in
        ``state`` / ``parent_states``)."""
        return {**self.to_plain(), "initial": self.initial}

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


#: Where a fan-out node runs: ``(namespace, node_name, step)``.
FanOutAt = tuple[tuple[str, ...], str, int]


@dataclasses.dataclass(slots=True, kw_only=True)
class RawRecord:
    """A record with its frame stack (engine-internal): folded from a journal, or made from
    a :class:`CheckpointRecord` a checkpointer of the user's returned (``head`` None)."""

    head: RunHead | None
    invocation_id: str
    correlation_id: str
    frames: list[Frame]
    positions: list[NodePosition]
    attempt: int
    resumed_from: str | None
    metadata: dict[str, Any]
    serialization: Serialization
    status: str = "running"
    last_saved_at: float = 0.0
    error: dict[str, Any] | None = None
    #: The finished branches of each fan-out in progress: index -> result.
    fan_outs: dict[FanOutAt, dict[int, Any]] = dataclasses.field(default_factory=dict)

    def copy(self) -> RawRecord:
        """A copy that applying rows to leaves this one as it is (states are replaced by
        a patch, never changed in place)."""
        return dataclasses.replace(
            self,
            frames=[dataclasses.replace(f) for f in self.frames],
            positions=list(self.positions),
            metadata=dict(self.metadata),
            fan_outs={at: dict(done) for at, done in self.fan_outs.items()},
        )

    @property
    def origin(self) -> str | None:
        """The chain's first invocation (journal records only; keys LLM loops in nodes)."""
        origin = self.head.meta.get("origin") if self.head is not None else None
        return origin if isinstance(origin, str) else None

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
            last_saved_at=self.last_saved_at,
            status=record_status(self.status),
            resumed_from=self.resumed_from,
            attempt_index=self.attempt,
            serialization=self.serialization,
            metadata=dict(self.metadata),
            error=dict(self.error) if self.error is not None else None,
            fan_outs=tuple(
                FanOutProgress(
                    namespace=at[0],
                    node_name=at[1],
                    step=at[2],
                    results=tuple(sorted(done.items(), key=lambda pair: pair[0])),
                )
                for at, done in self.fan_outs.items()
            ),
            frames=tuple(f.to_public() for f in self.frames),
        )

    @classmethod
    def of(cls, rec: CheckpointRecord) -> RawRecord:
        """The engine's form of a record a checkpointer returned. A record without
        ``frames`` (made by hand) is one outer frame holding ``state``."""
        states = [*rec.parent_states, rec.state]
        if rec.frames and len(rec.frames) == len(states):
            frames = [
                Frame.from_parts(plain, {"state": st, "initial": plain.get("initial")})
                for plain, st in zip(rec.frames, states, strict=True)
            ]
        else:
            last = next((p for p in reversed(rec.completed_positions) if not p.namespace), None)
            frames = [
                Frame(
                    node=None,
                    step=None,
                    ns=(),
                    state=rec.state,
                    initial=None,
                    schema_version=rec.schema_version,
                    last=(last.node_name, last.step) if last is not None else None,
                )
            ]
        return cls(
            head=None,
            invocation_id=rec.invocation_id,
            correlation_id=rec.correlation_id,
            frames=frames,
            positions=list(rec.completed_positions),
            attempt=rec.attempt_index,
            resumed_from=rec.resumed_from,
            metadata=dict(rec.metadata),
            serialization=rec.serialization,
            status=rec.status,
            last_saved_at=rec.last_saved_at,
            error=dict(rec.error) if rec.error is not None else None,
            fan_outs={f.at: dict(f.results) for f in rec.fan_outs},
        )
