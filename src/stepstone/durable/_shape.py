"""The shape of a run, for a diagram: a Plan's steps, the nodes a graph run reached, a
ReplanEngine run's rounds; each node with its state.

Read from the run's journal alone (the code that made it need not be importable): a Plan
journals its steps when it starts (its ``plan`` row); a graph run journals the nodes it
completed, so its diagram shows the nodes it reached and the edges it took, not the nodes
it never reached. Only reads.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from stepstone.durable._leases import LIVE_STATUSES, owner_alive
from stepstone.store._base import JournalRow, RunHead

__all__ = ["NODE_STATES", "run_shape"]

#: The states a diagram's node can be in.
NODE_STATES = ("done", "failed", "running", "next", "stranded", "pending")


def run_shape(head: RunHead, rows: Sequence[JournalRow], *, now: float) -> dict[str, Any] | None:
    """The run's diagram as JSON-ready data, or None for a kind that has none (workflow
    and agent runs show their steps and turns instead):

    * ``kind``: the run's kind;
    * ``nodes``: ``{"id", "label", "state", "visits", "col", "row", "detail"}``, where
      ``col``/``row`` place it on a grid (columns left to right in the order things
      happen, rows for what runs side by side) and ``state`` is one of
      :data:`NODE_STATES`;
    * ``edges``: ``{"from", "to", "count"}`` (``count``: how many times it was taken).
    """
    try:
        if head.kind == "plan":
            return _plan(head, rows, now)
        if head.kind == "graph":
            return _graph(head, rows, now)
        if head.kind == "replan":
            return _replan(head, rows, now)
    except (ValueError, TypeError, KeyError, IndexError):  # a damaged row: no diagram
        return None
    return None


def _data(row: JournalRow) -> Any:
    try:
        return json.loads(row.data)
    except ValueError:
        return None


def _error(head: RunHead) -> dict[str, Any]:
    err = head.meta.get("error")
    return err if isinstance(err, dict) else {}


def _waiting_state(head: RunHead, now: float) -> str:
    """The state of the node a run goes on with: ``running`` under a live owner,
    ``stranded`` when its owner died, ``next`` when it is stopped (paused, failed)."""
    if head.status in LIVE_STATUSES:
        return "running" if owner_alive(head, now=now) else "stranded"
    return "next"


def _plan(head: RunHead, rows: Sequence[JournalRow], now: float) -> dict[str, Any]:
    shape: list[Any] | None = None
    visits: dict[str, int] = {}
    order: list[str] = []
    for row in rows:
        if row.kind == "plan" and row.name == "shape":
            data = _data(row)
            if isinstance(data, dict) and isinstance(data.get("steps"), list):
                shape = data["steps"]
        elif row.kind == "step" and row.name:
            visits[row.name] = visits.get(row.name, 0) + 1
            if row.name not in order:
                order.append(row.name)
    steps: list[tuple[str, bool, Any]] = (
        [(str(s[0]), bool(s[1]), s[2]) for s in shape]
        if shape is not None
        else [(name, False, None) for name in order]
    )
    failed = _error(head).get("step") if head.status in ("failed", "paused") else None
    going = head.next_step if head.status != "done" else None
    nodes: list[dict[str, Any]] = []
    columns: list[list[str]] = []
    for name, parallel, writes in steps:
        if parallel and columns and nodes and nodes[-1]["_parallel"]:
            columns[-1].append(name)
        else:
            columns.append([name])
        if name == failed:
            state = "failed"
        elif name == going:
            state = _waiting_state(head, now) if head.status != "paused" else "next"
        elif visits.get(name):
            state = "done"
        else:
            state = "pending"
        nodes.append(
            {
                "id": name,
                "label": name,
                "state": state,
                "visits": visits.get(name, 0),
                "col": len(columns) - 1,
                "row": len(columns[-1]) - 1,
                "detail": f"writes {writes!r}" if writes else ("parallel" if parallel else ""),
                "_parallel": parallel,
            }
        )
    for node in nodes:
        node.pop("_parallel")
    edges = [
        {"from": a, "to": b, "count": 1}
        for left, right in itertools.pairwise(columns)
        for a in left
        for b in right
    ]
    return {"kind": "plan", "nodes": nodes, "edges": edges}


def _graph(head: RunHead, rows: Sequence[JournalRow], now: float) -> dict[str, Any]:
    positions: list[tuple[tuple[str, ...], str, int]] = []
    branches: dict[tuple[tuple[str, ...], str], int] = {}
    for row in rows:
        data = _data(row)
        if not isinstance(data, dict):
            continue
        if row.kind == "start":
            for pos in data.get("positions") or ():
                positions.append((tuple(pos[0]), str(pos[1]), int(pos[2])))
        elif row.kind == "node" and isinstance(data.get("pos"), list):
            pos = data["pos"]
            positions.append((tuple(pos[0]), str(pos[1]), int(pos[2])))
        elif row.kind == "branch" and isinstance(data.get("fan"), list):
            ns, node = tuple(data["fan"][0]), str(data["fan"][1])
            branches[(ns, node)] = branches.get((ns, node), 0) + 1

    def ident(ns: tuple[str, ...], node: str) -> str:
        return "/".join((*ns, node))

    order: list[str] = []
    depth: dict[str, int] = {}
    visits: dict[str, int] = {}
    edges: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, ...], str] = {}
    for ns, node, _step in positions:  # journal order: the order they ran in
        name = ident(ns, node)
        if name not in depth:
            order.append(name)
            depth[name] = len(ns)
        visits[name] = visits.get(name, 0) + 1
    for ns, node, _step in sorted(positions, key=lambda p: (p[0], p[2])):
        name = ident(ns, node)
        before = last.get(ns)
        if before is not None:
            edges[(before, name)] = edges.get((before, name), 0) + 1
        last[ns] = name
    failed = _error(head).get("node") if head.status in ("failed", "paused") else None
    fid = failed if isinstance(failed, str) and failed else None
    if fid is not None and fid not in depth:
        order.append(fid)
        depth[fid] = 0
        before = last.get(())
        if before is not None:
            edges[(before, fid)] = edges.get((before, fid), 0) + 1
    nodes = []
    for col, name in enumerate(order):
        state = "failed" if name == fid else "done"
        fan = branches.get((tuple(name.split("/")[:-1]), name.split("/")[-1]), 0)
        nodes.append(
            {
                "id": name,
                "label": name,
                "state": state,
                "visits": visits.get(name, 0),
                "col": col,
                "row": depth[name],
                "detail": f"{fan} branch(es) finished" if fan else "",
            }
        )
    if nodes and head.status in LIVE_STATUSES and fid is None:
        going = _waiting_state(head, now)
        if going != "next":
            nodes.append(
                {
                    "id": "(next)",
                    "label": "…",
                    "state": going,
                    "visits": 0,
                    "col": len(nodes),
                    "row": 0,
                    "detail": "the node it runs next",
                }
            )
            edges[(order[-1], "(next)")] = 1
    return {
        "kind": "graph",
        "nodes": nodes,
        "edges": [{"from": a, "to": b, "count": n} for (a, b), n in edges.items()],
    }


def _replan(head: RunHead, rows: Sequence[JournalRow], now: float) -> dict[str, Any]:
    rounds: dict[int, dict[str, Any]] = {}
    tasks: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        data = _data(row)
        if not isinstance(data, dict):
            continue
        if row.kind == "round":
            rounds[int(data["round"])] = data.get("plan") or {}
        elif row.kind == "task":
            tasks[(int(data["round"]), int(data["index"]))] = data
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    previous: str | None = None
    for col, number in enumerate(sorted(rounds)):
        plan = rounds[number]
        rid = f"round {number}"
        last = number == max(rounds)
        if plan.get("done"):
            state = "done"
        elif last and head.status != "done":
            state = "failed" if head.status == "failed" else _waiting_state(head, now)
        else:
            state = "done"
        nodes.append(
            {
                "id": rid,
                "label": rid if not plan.get("done") else f"{rid}: answer",
                "state": state,
                "visits": 1,
                "col": col,
                "row": 0,
                "detail": str(plan.get("reasoning") or ""),
            }
        )
        if previous is not None:
            edges.append({"from": previous, "to": rid, "count": 1})
        previous = rid
        for index, task in enumerate(plan.get("tasks") or ()):
            tid = f"{number}.{index}"
            done = tasks.get((number, index))
            if done is None:
                tstate = "failed" if head.status == "failed" and last else "pending"
                if last and head.status in LIVE_STATUSES:
                    tstate = _waiting_state(head, now)
            else:
                tstate = "failed" if done.get("error") else "done"
            nodes.append(
                {
                    "id": tid,
                    "label": str(task.get("tool") if isinstance(task, dict) else task),
                    "state": tstate,
                    "visits": 1 if done is not None else 0,
                    "col": col,
                    "row": index + 1,
                    "detail": json.dumps(task.get("kwargs"), default=str)[:200]
                    if isinstance(task, dict)
                    else "",
                }
            )
            edges.append({"from": rid, "to": tid, "count": 1})
    return {"kind": "replan", "nodes": nodes, "edges": edges}
