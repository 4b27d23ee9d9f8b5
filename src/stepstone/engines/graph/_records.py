"""Graph checkpoint records: positions, the saved record, its frames, the list filter.

A graph invocation is one durable run of kind ``"graph"`` under ``<prefix><invocation_id>``,
written through the kernel (``claim_run``, which writes the ``start`` row with the claim,
then one ``OwnedRun.commit`` per completed node).
Its journal holds one ``start`` row (the starting state, carried positions) and one
``node`` row per completed node: the node's position and a *patch* of the fields it
changed (items appended to ``append`` fields, new values of the others). Bytes written per
node do not grow with the run's length; :func:`~stepstone.engines.graph._fold.fold` folds
the rows back into a :class:`RawRecord`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError
from stepstone.store._base import RUN_STATUSES, RunHead

__all__ = [
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
RECORD_FORMAT = 1

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
            status=record_status(self.head.status),
            resumed_from=self.resumed_from,
            attempt_index=self.attempt,
            serialization=self.serialization,
            metadata=dict(self.metadata),
        )
