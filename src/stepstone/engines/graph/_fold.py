"""Folding a graph run's journal rows back into its record, and the store's view of it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stepstone.engines.graph._codec import Codec
from stepstone.engines.graph._records import GRAPH_KIND, Frame, NodePosition, RawRecord
from stepstone.engines.graph._state import apply_patch
from stepstone.exceptions import CheckpointRecordInvalid
from stepstone.store._base import JournalRow, RunHead, journal_problem

__all__ = ["fold", "graph_view"]


def fold(head: RunHead, rows: Sequence[JournalRow], codec: Codec | None) -> RawRecord:
    """Fold a graph run's journal into a :class:`RawRecord`.

    ``codec=None`` folds without decoding bodies (states stay None), for the store view.
    """
    where = f"graph checkpoint {head.key!r}"
    meta = head.meta
    problem = journal_problem(head, rows)
    if problem is not None:  # a lost row would lose a node's update
        raise CheckpointRecordInvalid(
            f"{where} is corrupt: {problem}; remove it with "
            f"checkpointer.delete({meta.get('invocation_id')!r})"
        )
    try:
        if not rows or rows[0].kind != "start":
            raise CheckpointRecordInvalid(
                f"{where} has no start row (it was interrupted before its first save); "
                f"remove it with checkpointer.delete({meta.get('invocation_id')!r})"
            )
        start = _known(json.loads(rows[0].data), _START_FIELDS, "its start row")
        for plain in start["frames"]:
            _known(plain, _FRAME_FIELDS, "a frame of its start row")
        start_body = codec.decode(start, where=where) if codec is not None else {"frames": None}
        body_frames = start_body["frames"] or [{"state": None}] * len(start["frames"])
        frames = [Frame.from_parts(p, b) for p, b in zip(start["frames"], body_frames, strict=True)]
        positions = [NodePosition.from_json(p) for p in start["positions"]]
        for row in rows[1:]:
            if row.kind != "node":  # a byte flipped in its kind: skipping it loses a node
                raise CheckpointRecordInvalid(
                    f"{where}: journal row {row.seq} is a {row.kind!r} row, which a graph "
                    f"record never writes; remove it with "
                    f"checkpointer.delete({meta.get('invocation_id')!r})"
                )
            data = _known(json.loads(row.data), _NODE_FIELDS, f"journal row {row.seq}")
            positions.append(_apply_node_row(frames, data, codec, where))
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
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise CheckpointRecordInvalid(
            f"{where} cannot be decoded ({type(exc).__name__}: {exc}); remove it with "
            f"checkpointer.delete({meta.get('invocation_id')!r})"
        ) from exc


def _apply_node_row(
    frames: list[Frame], data: dict[str, Any], codec: Codec | None, where: str
) -> NodePosition:
    """Apply one ``node`` row to the frame stack (leave, enter, patch); its position."""
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
        patch = _known(_known(body, {"patch", "push"}, "a node body")["patch"], _PATCH, "a patch")
        top.state = apply_patch(top.state, patch)
    top.last = (pos.node_name, pos.step)
    return pos


#: The fields each part of a graph record holds (any other is a damaged field name).
_START_FIELDS = {
    "frames",
    "positions",
    "attempt",
    "resumed_from",
    "metadata",
    "body",
    "body_pickle",
}
_FRAME_FIELDS = {"node", "step", "ns", "schema_version", "last"}
_NODE_FIELDS = {"pos", "pop", "push", "body", "body_pickle"}
_PATCH = {"set", "extend"}


def _known(data: Any, fields: set[str], what: str) -> dict[str, Any]:
    """``data``, a JSON object with no field but ``fields`` (a byte flipped in a field's
    name would otherwise drop the field silently: a node's update, a frame to leave)."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is a JSON {type(data).__name__}, not an object")
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"{what} has the field(s) {sorted(unknown)}, which a graph never writes")
    return data


def graph_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
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
