"""Folding a graph run's journal rows back into its record, and the store's view of it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stepstone.engines.graph._codec import Codec
from stepstone.engines.graph._records import (
    GRAPH_KIND,
    FanOutAt,
    Frame,
    NodePosition,
    RawRecord,
)
from stepstone.engines.graph._state import apply_patch
from stepstone.exceptions import CheckpointRecordInvalid
from stepstone.store._base import JournalRow, RunHead, journal_problem

__all__ = ["apply_row", "fold", "graph_view"]


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
        fmt = int(meta.get("format", 1))
        start = _known(json.loads(rows[0].data), _START_FIELDS[fmt >= 2], "its start row")
        for plain in start["frames"]:
            _known(plain, _FRAME_FIELDS, "a frame of its start row")
        start_body = codec.decode(start, where=where) if codec is not None else {"frames": None}
        body_frames = start_body["frames"] or [{"state": None}] * len(start["frames"])
        frames = [Frame.from_parts(p, b) for p, b in zip(start["frames"], body_frames, strict=True)]
        positions = [NodePosition.from_json(p) for p in start["positions"]]
        fan_outs = _start_fan_outs(start, start_body.get("fan_results"))
        kinds = ("node", "branch") if fmt >= 2 else ("node",)
        for row in rows[1:]:
            if row.kind not in kinds:  # a byte flipped in its kind: skipping it loses a node
                raise CheckpointRecordInvalid(
                    f"{where}: journal row {row.seq} is a {row.kind!r} row, which a graph "
                    f"record never writes (format {fmt}); remove it with "
                    f"checkpointer.delete({meta.get('invocation_id')!r})"
                )
            if row.kind == "branch":
                data = _known(json.loads(row.data), _BRANCH_FIELDS, f"journal row {row.seq}")
                _apply_branch_row(frames, fan_outs, data, codec, where)
                continue
            data = _known(json.loads(row.data), _NODE_FIELDS, f"journal row {row.seq}")
            pos = _apply_node_row(frames, data, codec, where)
            fan_outs.pop((pos.namespace, pos.node_name, pos.step), None)  # merged by now
            positions.append(pos)
        error = meta.get("error")
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
            status=head.status,
            last_saved_at=head.updated_at,
            error=dict(error) if isinstance(error, dict) else None,
            fan_outs=fan_outs,
        )
    except CheckpointRecordInvalid:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise CheckpointRecordInvalid(
            f"{where} cannot be decoded ({type(exc).__name__}: {exc}); remove it with "
            f"checkpointer.delete({meta.get('invocation_id')!r})"
        ) from exc


def apply_row(raw: RawRecord, kind: str, data: dict[str, Any], codec: Codec, where: str) -> None:
    """Apply one ``node`` or ``branch`` row's data to ``raw``, as :func:`fold` does."""
    if kind == "branch":
        _apply_branch_row(raw.frames, raw.fan_outs, data, codec, where)
        return
    pos = _apply_node_row(raw.frames, data, codec, where)
    raw.fan_outs.pop((pos.namespace, pos.node_name, pos.step), None)
    raw.positions.append(pos)
    raw.status = "running"


def _start_fan_outs(start: dict[str, Any], results: Any) -> dict[FanOutAt, dict[int, Any]]:
    """The unfinished fan-outs a start row carries (format 2), with their results (None
    when the bodies are not decoded)."""
    out: dict[FanOutAt, dict[int, Any]] = {}
    for n, fan in enumerate(start.get("fan_outs") or ()):
        _known(fan, {"at", "indexes"}, "a fan-out of its start row")
        at = _fan_at(fan["at"])
        got = results[n] if results is not None else [None] * len(fan["indexes"])
        out[at] = {int(i): r for i, r in zip(fan["indexes"], got, strict=True)}
    return out


def _fan_at(data: Any) -> FanOutAt:
    ns, node, step = data
    return (tuple(str(n) for n in ns), str(node), int(step))


def _push(frames: list[Frame], data: dict[str, Any], body: dict[str, Any] | None) -> None:
    """Enter the subgraph frames a row pushes (a subgraph's first save)."""
    for plain, fbody in zip(
        data.get("push", []),
        body["push"] if body is not None else [None] * len(data.get("push", [])),
        strict=True,
    ):
        frames.append(Frame.from_parts(plain, fbody or {"state": None}))


def _apply_branch_row(
    frames: list[Frame],
    fan_outs: dict[FanOutAt, dict[int, Any]],
    data: dict[str, Any],
    codec: Codec | None,
    where: str,
) -> None:
    """Apply one ``branch`` row: a fan-out branch finished with its result."""
    body = codec.decode(data, where=where) if codec is not None else None
    _push(frames, data, body)
    result = _known(body, {"result", "push"}, "a branch body")["result"] if body else None
    fan_outs.setdefault(_fan_at(data["fan"]), {})[int(data["index"])] = result


def _apply_node_row(
    frames: list[Frame], data: dict[str, Any], codec: Codec | None, where: str
) -> NodePosition:
    """Apply one ``node`` row to the frame stack (leave, enter, patch); its position."""
    for _ in range(int(data.get("pop", 0))):
        frames.pop()
    body = codec.decode(data, where=where) if codec is not None else None
    _push(frames, data, body)
    pos = NodePosition.from_json(data["pos"])
    top = frames[-1]
    if body is not None:
        patch = _known(_known(body, {"patch", "push"}, "a node body")["patch"], _PATCH, "a patch")
        top.state = apply_patch(top.state, patch)
    top.last = (pos.node_name, pos.step)
    return pos


#: The fields each part of a graph record holds (any other is a damaged field name).
_START_1 = {"frames", "positions", "attempt", "resumed_from", "metadata", "body", "body_pickle"}
_START_FIELDS = {False: _START_1, True: _START_1 | {"fan_outs"}}  # by format >= 2
_FRAME_FIELDS = {"node", "step", "ns", "schema_version", "last"}
_NODE_FIELDS = {"pos", "pop", "push", "body", "body_pickle"}
_BRANCH_FIELDS = {"fan", "index", "push", "body", "body_pickle"}
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
        "fan_outs": [
            {"at": [list(f.namespace), f.node_name, f.step], "finished": [i for i, _ in f.results]}
            for f in rec.fan_outs
        ],
        "next_node": head.next_step,
        "error": head.meta.get("error"),
        "last_saved_at": rec.last_saved_at,
    }
