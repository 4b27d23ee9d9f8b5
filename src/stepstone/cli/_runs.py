"""Listing runs for `stepstone runs`: one bad record never hides the others."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from stepstone.core._ids import host_id, process_alive
from stepstone.durable import list_runs as kernel_list_runs
from stepstone.durable import owner_alive, run_head
from stepstone.durable._inspect import damaged_runs, filter_heads, steps_done, successors
from stepstone.store import RunHead, Store
from stepstone.store._check import problem_text

__all__ = ["RunLine", "list_runs", "owner_state", "select_runs"]

_LIVE = ("claimed", "running")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunLine:
    """One run as `stepstone runs` shows it: a decoded head, or the reason it is corrupt."""

    key: str
    head: RunHead | None = None
    corrupt: str | None = None
    #: The run that took this one over (a graph invocation resumed under a new id).
    superseded_by: str | None = None
    #: What is wrong with a journal row of it that does not read (its head reads).
    damaged: str | None = None

    @property
    def error(self) -> dict[str, Any] | None:
        """The error the run recorded (``type``, ``message``, step or node), or None."""
        err = self.head.meta.get("error") if self.head is not None else None
        return err if isinstance(err, dict) else None

    def to_json(self, now: float) -> dict[str, Any]:
        """The line as a JSON object (``stepstone runs --json``)."""
        if self.head is None:
            return {"key": self.key, "corrupt": self.corrupt}
        h = self.head
        return {
            "key": h.key,
            "kind": h.kind,
            "status": h.status,
            "next_step": h.next_step,
            "run_uid": h.run_uid,
            "version": h.version,
            "iteration": h.iteration,
            "owner": {
                "state": self.owner(now)[0],
                "host": h.host,
                "pid": h.pid,
                "lease_until": h.lease_until,
            },
            "error": self.error,
            "error_type": (self.error or {}).get("type"),
            "steps": steps_done(h),
            "created_at": h.created_at,
            "updated_at": h.updated_at,
            "superseded_by": self.superseded_by,
            "damaged": self.damaged,
        }

    def owner(self, now: float) -> tuple[str, str]:
        """``(state, detail)`` of the run's owner (:func:`owner_state`), ``superseded``
        with the run that took it over when its owner died and another run did."""
        assert self.head is not None
        state, detail = owner_state(self.head, now)
        if state == "dead" and self.superseded_by is not None:
            return "superseded", f"by {self.superseded_by}"
        return state, detail


def list_runs(store: Store, prefix: str | None) -> list[RunLine]:
    """Every run under ``prefix``; a record that cannot be decoded becomes a corrupt line."""
    try:
        return [
            RunLine(key=h.key, corrupt=f"CheckpointCorruptError: {h.meta.get('corrupt')}")
            if h.status == "corrupt"
            else RunLine(key=h.key, head=h)
            for h in kernel_list_runs(store, prefix)
        ]
    except Exception:  # noqa: BLE001 - one bad row; list the others one by one below
        pass
    lines: list[RunLine] = []
    for key in store.keys(prefix=prefix):
        try:
            head = run_head(store, key)  # None for a plain value
        except Exception as exc:  # noqa: BLE001 - shown on the line, the listing goes on
            lines.append(RunLine(key=key, corrupt=problem_text(exc)))
            continue
        if head is not None:
            lines.append(RunLine(key=key, head=head))
    return lines


def select_runs(
    store: Store,
    prefix: str | None = None,
    *,
    statuses: tuple[str, ...] = (),
    kinds: tuple[str, ...] = (),
    older_than: float | None = None,
    newer_than: float | None = None,
    sort: str = "key",
    limit: int | None = None,
    offset: int = 0,
    now: float | None = None,
) -> tuple[int, list[RunLine]]:
    """``(total, page)`` of the runs matching the filters (the operator read model's
    filters and order). A corrupt record is listed whatever the filters but ``prefix``,
    so a filter never hides a broken run."""
    lines = list_runs(store, prefix)
    heads = [line.head for line in lines if line.head is not None]
    taken = successors(store, heads, prefix=prefix)
    picked: list[RunLine] = [
        RunLine(key=h.key, head=h, superseded_by=taken.get(h.key))
        for h in filter_heads(
            heads,
            statuses=statuses,
            kinds=kinds,
            older_than=older_than,
            newer_than=newer_than,
            sort=sort,
            now=now,
        )
    ]
    picked += [line for line in lines if line.head is None]
    if sort == "key":
        picked.sort(key=lambda line: line.key)
    page = picked[offset : None if limit is None else offset + limit]
    faults = damaged_runs(store, [line.key for line in page if line.head is not None])
    if faults:  # what the page lists: its runs' journals read
        page = [dataclasses.replace(line, damaged=faults.get(line.key)) for line in page]
    return len(picked), page


def owner_state(head: RunHead, now: float | None = None) -> tuple[str, str]:
    """``(state, detail)``: state is ``live``, ``dead`` or ``-`` (the run is not running)."""
    now = time.time() if now is None else now
    if head.status not in _LIVE:
        return "-", "-"
    where = f"pid {head.pid} on {head.host.split('/')[0] or '?'}"
    left = head.lease_until - now
    if owner_alive(head, now=now):
        return "live", f"{where}, lease expires in {_secs(left)}"
    # why it is dead
    if left < 0:
        return "dead", f"{where}, lease expired {_secs(-left)} ago"
    if head.host == host_id() and not process_alive(head.pid, head.pid_start):
        return "dead", f"{where}, process gone"
    return "dead", f"{where}, no longer renewing"


def _secs(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
