"""Read models of durable runs for operators: summaries, timelines, stranded runs, diffs.

Shared by the ``stepstone`` CLI and the web inspector so both show the same facts. Every
function here only reads.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from stepstone.core._serialization import untag
from stepstone.durable._agent_journal import AGENT_KIND
from stepstone.durable._approvals import agent_timeline, agent_view, waiting_calls
from stepstone.durable._journal_format import ENTRIES_KIND, expand
from stepstone.durable._leases import LIVE_STATUSES, database_now, owner_alive
from stepstone.durable._operations import OPERATION_ROWS, operation_rows
from stepstone.durable._queue import existing_queue
from stepstone.durable._shape import run_shape
from stepstone.exceptions import CorruptRecordError
from stepstone.store._base import (
    RUN_STATUSES,
    JournalRow,
    RunHead,
    Salvaged,
    journal_problem,
    read_salvaged,
)
from stepstone.store._queue_base import QueueEntry
from stepstone.store._store import Store, key_problem
from stepstone.store._views import is_internal_kind

__all__ = [
    "LIST_GROUPS",
    "ResumeVerdict",
    "agent_key",
    "damaged_runs",
    "damage_report",
    "diff_runs",
    "filter_heads",
    "missing_run",
    "named_run",
    "query_runs",
    "owner_state",
    "run_detail",
    "run_listing",
    "rewind_steps",
    "run_summary",
    "run_timeline",
    "salvaged_timeline",
    "source_key",
    "stranded_runs",
    "time_and_messages",
    "successors",
    "with_times",
    "timeline",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ResumeVerdict:
    """What resuming one stored run with the current code would do
    (``stepstone migrate --dry-run``: each engine decides it with its resume's own
    checks, nothing written).

    Attributes:
        verdict: ``current`` (resumes where it stopped), ``done`` (finished: runs
            nothing), ``corrupt`` (refused: the record is damaged), ``live`` (refused: a
            live process owns it or resumes it), ``gone`` (no such run), or an engine's
            own: a Plan's ``changed`` (another version of the plan wrote it; resumes by
            step name), ``restarts`` (starts over) and ``stale`` (refused with
            ``StaleCheckpointError``), a graph's ``migrates`` and ``no chain``.
        detail: Why, in a few words (a refusal: the error's first sentence).
        runs: Whether the resume runs steps.
    """

    verdict: str
    detail: str
    runs: bool


def owner_state(
    head: RunHead, *, now: float | None = None, superseded_by: str | None = None
) -> str:
    """``"live"``, ``"dead"`` (a claimed/running run nobody executes: stranded),
    ``"superseded"`` (a claimed/running run whose owner died and that another run took
    over: ``superseded_by``, see :func:`successors`) or ``"none"`` (a paused, failed or
    done run has no owner)."""
    if head.status not in LIVE_STATUSES:
        return "none"
    if owner_alive(head, now=now):
        return "live"
    return "dead" if superseded_by is None else "superseded"


def source_key(head: RunHead) -> str | None:
    """The key of the run that ``head``'s run took over, or None: a graph invocation
    resumed from another records the other's invocation id (``meta["resumed_from"]``),
    and both live under one prefix (``graph:<invocation_id>``)."""
    source, own = head.meta.get("resumed_from"), head.meta.get("invocation_id")
    if not (isinstance(source, str) and source and isinstance(own, str) and own):
        return None
    if not head.key.endswith(own):
        return None
    return head.key[: len(head.key) - len(own)] + source


def successors(
    store: Store, heads: Sequence[RunHead], *, prefix: str | None = None
) -> dict[str, str]:
    """For each run of ``heads`` that another run took over (a graph invocation resumed
    under a new invocation id), the key of the run that did: the latest one, when it was
    resumed more than once. ``heads`` were listed under ``prefix``; the runs that may
    have taken them over are looked up under their own prefix when it lies outside it."""
    pool = list(heads)
    seen = {h.key for h in heads}
    outside: set[str] = set()
    for head in heads:
        own = head.meta.get("invocation_id")
        if isinstance(own, str) and own and head.key.endswith(own):
            where = head.key[: len(head.key) - len(own)]
            if prefix is not None and not where.startswith(prefix):
                outside.add(where)
    for where in sorted(outside):
        pool += [h for h in store.backend.run_list(where) if h.key not in seen]
    wanted = {h.key for h in heads}
    latest: dict[str, RunHead] = {}
    for head in pool:
        source = source_key(head)
        if source is None or source not in wanted or source == head.key:
            continue
        known = latest.get(source)
        if known is None or (head.created_at, head.key) > (known.created_at, known.key):
            latest[source] = head
    return {source: head.key for source, head in latest.items()}


def _error_of(head: RunHead) -> dict[str, Any] | None:
    err = head.meta.get("error")
    return err if isinstance(err, dict) else None


def damaged_runs(store: Store, keys: Sequence[str]) -> dict[str, str]:
    """Those of the runs ``keys`` with a journal row that does not read (a byte changed on
    the disk: its checksum no longer matches), each with what is wrong with its first one;
    its head alone would list it as if nothing were. Reads every row of their journals."""
    return store.backend.journal_faults(keys)


def run_summary(
    head: RunHead,
    *,
    now: float | None = None,
    superseded_by: str | None = None,
    damaged: str | None = None,
) -> dict[str, Any]:
    """One run as a JSON-ready dict (the row of ``stepstone runs --json`` and the web
    list); ``superseded_by``: the run that took it over (:func:`successors`);
    ``damaged``: what is wrong with a journal row of it (:func:`damaged_runs`)."""
    now = time.time() if now is None else now
    err = _error_of(head)
    state = owner_state(head, now=now, superseded_by=superseded_by)
    return {
        "key": head.key,
        "kind": head.kind,
        "status": head.status,
        "next_step": head.next_step,
        "owner": state,
        "lease_expires_in": round(head.lease_until - now, 1) if state == "live" else None,
        "owner_pid": head.pid,
        "owner_host": head.host,
        "run_uid": head.run_uid,
        "steps": steps_done(head),
        "version": head.version,
        "created_at": head.created_at,
        "updated_at": head.updated_at,
        "age_seconds": round(now - head.updated_at, 1),
        "duration_seconds": round(head.updated_at - head.created_at, 3),
        "error_type": None if err is None else err.get("type"),
        "cancel_requested": bool(head.meta.get("cancel_requested")),
        "superseded_by": superseded_by,
        "damaged": damaged,
    }


SORTS = ("updated", "created", "key")


def filter_heads(
    heads: Sequence[RunHead],
    *,
    statuses: Sequence[str] = (),
    kinds: Sequence[str] = (),
    older_than: float | None = None,
    newer_than: float | None = None,
    sort: str = "updated",
    now: float | None = None,
) -> list[RunHead]:
    """``heads`` that match the filters, sorted: ``updated`` and ``created`` put the most
    recent first, ``key`` sorts by key. Ages are seconds since the last commit. Records
    of an internal kind (an engine's bookkeeping, such as a graph's resume lock) are left
    out unless ``kinds`` names theirs.

    Raises:
        ValueError: an unknown status or sort (the message lists the valid ones).
    """
    now = time.time() if now is None else now
    bad = sorted(set(statuses) - set(RUN_STATUSES))
    if bad:
        raise ValueError(f"unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}")
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; pass one of {', '.join(SORTS)}")
    out = [
        h
        for h in heads
        if (not statuses or h.status in statuses)
        and (h.kind in kinds if kinds else not is_internal_kind(h.kind))
        and (older_than is None or now - h.updated_at >= older_than)
        and (newer_than is None or now - h.updated_at <= newer_than)
    ]
    if sort == "key":
        out.sort(key=lambda h: h.key)
    elif sort == "created":
        out.sort(key=lambda h: (h.created_at, h.key), reverse=True)
    else:
        out.sort(key=lambda h: (h.updated_at, h.key), reverse=True)
    return out


def query_runs(
    store: Store,
    *,
    statuses: Sequence[str] = (),
    kinds: Sequence[str] = (),
    prefix: str | None = None,
    older_than: float | None = None,
    newer_than: float | None = None,
    limit: int | None = None,
    offset: int = 0,
    sort: str = "updated",
    now: float | None = None,
    error_text: str | None = None,
    queue: str | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """Runs matching the filters, most recently updated first (or as ``sort`` says):
    ``(total, page)``.

    ``older_than``/``newer_than`` are ages in seconds since the last commit;
    ``error_text``: runs whose error (type and message) holds it, in any case;
    ``queue``: runs submitted to that work queue.

    Raises:
        ValueError: a negative ``limit`` or ``offset``, an unknown status or sort.
    """
    if (limit is not None and limit < 0) or offset < 0:
        raise ValueError(
            f"limit and offset must be >= 0 (limit=None for all runs), got limit={limit!r}, "
            f"offset={offset!r}"
        )
    now = database_now(store) if now is None else now
    out = filter_heads(
        store.backend.run_list(prefix or None),
        statuses=statuses,
        kinds=kinds,
        older_than=older_than,
        newer_than=newer_than,
        sort=sort,
        now=now,
    )
    if error_text:
        needle = error_text.casefold()
        out = [h for h in out if needle in _error_words(h).casefold()]
    if queue is not None:
        found = existing_queue(store)
        keys = {e.run_key for e in found.entries(queue, None)} if found is not None else set()
        out = [h for h in out if h.key in keys]
    page = out[offset : None if limit is None else offset + limit]
    taken = successors(store, page, prefix=prefix or None)
    faults = damaged_runs(store, [h.key for h in page])
    return len(out), [
        run_summary(h, now=now, superseded_by=taken.get(h.key), damaged=faults.get(h.key))
        for h in page
    ]


#: The groups a listing may show instead of a status: runs whose owner died and that
#: nobody took over (``stranded``), runs that sleep or wait for a message (``waiting``),
#: and queued runs that no worker has started yet (``queued``).
LIST_GROUPS = ("stranded", "waiting", "queued")


def run_listing(
    store: Store,
    *,
    statuses: Sequence[str] = (),
    kinds: Sequence[str] = (),
    prefix: str | None = None,
    error_text: str | None = None,
    queue: str | None = None,
    older_than: float | None = None,
    newer_than: float | None = None,
    group: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    now: float | None = None,
) -> dict[str, Any]:
    """A page of runs for the inspector's list, most recently updated first, with counts:
    ``{"total", "runs", "counts"}``.

    The filters are :func:`query_runs`'s; ``group`` (one of :data:`LIST_GROUPS`) shows
    only that group. ``counts`` gives, for the runs the other filters keep (all but
    ``statuses`` and ``group``), how many have each status and how many are in each
    group. Each run is :func:`run_summary`'s, with ``queue`` (the queue it was last
    submitted to, or None), ``entry_status`` (that entry's status), ``waiting`` (what it
    sleeps or waits for, or None) and ``error`` (its error's message); a queued run not
    started yet has status ``queued`` and no kind.

    Raises:
        ValueError: a negative ``limit`` or ``offset``, an unknown status or group.
    """
    _check_listing(statuses, group, limit, offset)
    now = database_now(store) if now is None else now
    every = store.backend.run_list(prefix or None)
    known = {h.key for h in every}
    heads = filter_heads(every, kinds=kinds, older_than=older_than, newer_than=newer_than, now=now)
    if error_text:
        needle = error_text.casefold()
        heads = [h for h in heads if needle in _error_words(h).casefold()]
    found = existing_queue(store)
    entries = found.entries(None, None) if found is not None else []
    latest = {e.run_key: e for e in sorted(entries, key=lambda e: e.created_at)}
    if queue is not None:
        in_queue = {e.run_key for e in entries if e.queue == queue}
        heads = [h for h in heads if h.key in in_queue]
    taken = successors(store, heads, prefix=prefix or None)
    stranded = {h.key for h in heads if _stranded(h, now, taken)}
    timers = _waits(store, now)
    waiting = {h.key for h in heads if h.key in timers}
    queued = []
    if not kinds and not error_text:  # a run not started yet has neither
        queued = [
            e
            for e in latest.values()
            if _not_started(e, known, prefix, queue)
            and (older_than is None or now - e.updated_at >= older_than)
            and (newer_than is None or now - e.updated_at <= newer_than)
        ]
    counts: dict[str, int] = dict.fromkeys(RUN_STATUSES, 0)
    for h in heads:
        counts[h.status] = counts.get(h.status, 0) + 1
    counts.update(stranded=len(stranded), waiting=len(waiting), queued=len(queued))
    if group == "queued":
        queued.sort(key=lambda e: (e.created_at, e.run_key), reverse=True)
        shown = queued[offset : None if limit is None else offset + limit]
        return {
            "total": len(queued),
            "runs": [_queued_summary(e, now) for e in shown],
            "counts": counts,
        }
    if group == "stranded":
        heads = [h for h in heads if h.key in stranded]
    elif group == "waiting":
        heads = [h for h in heads if h.key in waiting]
    if statuses:
        heads = [h for h in heads if h.status in statuses]
    page = heads[offset : None if limit is None else offset + limit]
    faults = damaged_runs(store, [h.key for h in page])
    runs = [
        _listed(
            run_summary(
                head, now=now, superseded_by=taken.get(head.key), damaged=faults.get(head.key)
            ),
            head,
            latest.get(head.key) or latest.get(_agent_run_id(head.key)),
            timers.get(head.key),
        )
        for head in page
    ]
    return {"total": len(heads), "runs": runs, "counts": counts}


def _check_listing(
    statuses: Sequence[str], group: str | None, limit: int | None, offset: int
) -> None:
    """Refuse a listing's bad arguments, naming the value and what it may be."""
    if (limit is not None and limit < 0) or offset < 0:
        raise ValueError(
            f"limit and offset must be >= 0 (limit=None for all runs), got limit={limit!r}, "
            f"offset={offset!r}"
        )
    if group is not None and group not in LIST_GROUPS:
        raise ValueError(f"unknown group {group!r}; pass one of {', '.join(LIST_GROUPS)}")
    bad = sorted(set(statuses) - set(RUN_STATUSES))
    if bad:
        raise ValueError(f"unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}")


def _stranded(head: RunHead, now: float, taken: dict[str, str]) -> bool:
    """Whether ``head`` is a user's run whose owner died and that no resume took over."""
    return (
        head.status in LIVE_STATUSES
        and not owner_alive(head, now=now)
        and head.key not in taken
        and not is_internal_kind(head.kind)
    )


def _waits(store: Store, now: float) -> dict[str, dict[str, Any]]:
    """What each run sleeps or waits for (its first timer), by run key."""
    timers: dict[str, dict[str, Any]] = {}
    for timer in store.backend.timers(None):
        if timer.run_key in timers:
            continue
        due = timer.wake_at is not None and timer.wake_at <= now
        timers[timer.run_key] = {
            "state": "due" if due else ("sleeping" if timer.topic is None else "waiting"),
            "until": timer.wake_at,
            "topic": timer.topic,
            "since": timer.since,
        }
    return timers


def _not_started(entry: QueueEntry, known: set[str], prefix: str | None, queue: str | None) -> bool:
    """Whether ``entry`` is a queued run that has no record yet, within the filters."""
    return (
        entry.status in ("queued", "running")
        and entry.run_key not in known
        and f"agent:{entry.run_key}:checkpoint:latest" not in known  # a queued agent run's
        and (prefix is None or entry.run_key.startswith(prefix))
        and (queue is None or entry.queue == queue)
    )


def _listed(
    summary: dict[str, Any],
    head: RunHead,
    last: QueueEntry | None,
    waiting: dict[str, Any] | None,
) -> dict[str, Any]:
    """``summary`` with what the list adds: queue, entry status, wait and error message."""
    err = _error_of(head)
    summary.update(
        queue=None if last is None else last.queue,
        entry_status=None if last is None else last.status,
        waiting=waiting,
        error=None if err is None else err.get("message"),
    )
    return summary


def _agent_run_id(key: str) -> str:
    """The run id of an agent run's key (:func:`agent_key`), "" for any other key."""
    head, tail = "agent:", ":checkpoint:latest"
    return key[len(head) : -len(tail)] if key.startswith(head) and key.endswith(tail) else ""


def _queued_summary(entry: QueueEntry, now: float) -> dict[str, Any]:
    """A queued run no worker started yet, as a row of :func:`run_listing`."""
    return {
        "key": entry.run_key,
        "kind": None,
        "status": "queued",
        "next_step": None,
        "owner": "none",
        "lease_expires_in": None,
        "steps": 0,
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
        "age_seconds": round(now - entry.updated_at, 1),
        "error_type": None,
        "error": None,
        "cancel_requested": False,
        "superseded_by": None,
        "queue": entry.queue,
        "entry_status": entry.status,
        "target": entry.target,
        "waiting": None,
    }


def _error_words(head: RunHead) -> str:
    """A run's error as one line of text (``type: message``), "" when it has none."""
    err = _error_of(head)
    return "" if err is None else f"{err.get('type')}: {err.get('message')}"


def _decode(row: JournalRow) -> Any:
    try:
        return json.loads(row.data)
    except ValueError:
        return row.data


def steps_done(head: RunHead) -> int:
    """How many steps a run has committed: journal rows, not counting the rows an engine
    journals about the run itself (a Plan's record of its steps, written once); for an
    agent run, its effects done (model turns, tool and subagent calls), which its head
    counts (one written before that count: its turns); for a workflow, its operations
    finished, not its intent and outcome rows."""
    if head.kind == AGENT_KIND:
        effects = head.meta.get("effects")
        return effects if type(effects) is int else head.iteration
    if head.kind == "workflow":
        return head.iteration
    shape_rows = head.meta.get("shape_rows")
    return head.journal_len - (shape_rows if type(shape_rows) is int else 0)


def timeline(rows: Sequence[JournalRow]) -> list[dict[str, Any]]:
    """A run's journal, one JSON-ready entry per row: what happened, its payload, its error.

    Plan ``step`` rows show the step's payload and error; other engines' rows show their
    data as written. ``retries``/``replayed`` are taken from the row where the engine
    records them.
    """
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.kind == "plan":  # the Plan's own record of its steps, not something that ran
            continue
        data = _decode(row)
        if row.kind in OPERATION_ROWS and isinstance(data, list):
            times = {"started_at": row.started_at, "committed_at": row.committed_at}
            out.extend({**entry, **times} for entry in _operation_entries(row.seq, data))
            continue
        entry: dict[str, Any] = {"seq": row.seq, "kind": row.kind, "name": row.name}
        entry["started_at"], entry["committed_at"] = row.started_at, row.committed_at
        if isinstance(data, dict) and isinstance(data.get("envelope"), dict):
            env = data["envelope"]
            entry["payload"] = env.get("payload")
            entry["error"] = env.get("error")
            entry["iteration"] = data.get("iteration")
            if data.get("writes"):
                entry["writes"] = data["writes"]
            if data.get("band"):
                entry["band"] = data["band"]
        else:
            entry["payload"] = data
            entry["error"] = data.get("error") if isinstance(data, dict) else None
        out.append(entry)
    return out


def _operation_entries(seq: int, records: list[Any]) -> list[dict[str, Any]]:
    """The records of a workflow's ``ops`` row (its steps' intents, outcomes and failed
    attempts), one timeline entry each, named by position and step."""
    out: list[dict[str, Any]] = []
    for record in records:
        kind, pos, data = (
            record if isinstance(record, list) and len(record) == 3 else ("damaged", None, {})
        )
        data = data if isinstance(data, dict) else {}
        out.append(
            {
                "seq": seq,
                "kind": kind,
                "name": f"{pos} {data.get('name')}",
                "payload": data.get("args" if kind == "intent" else "value"),
                "error": data.get("error"),
            }
        )
    return out


def salvaged_timeline(found: Salvaged) -> list[dict[str, Any]]:
    """:func:`timeline` of a run read by ``read_salvaged``, each damaged row in its place
    (kind ``"damaged"``, what is wrong with it as its error), to see what is left around
    it. A journal of entries rows (``durable/_journal_format.py``) shows one entry per
    journal entry, as the first format wrote them, numbered in order."""
    damaged = [
        JournalRow(seq, _DAMAGED, None, fault) for seq, fault in sorted(found.damaged.items())
    ]
    rows = sorted([*found.rows, *damaged], key=lambda row: row.seq)
    if not any(row.kind == ENTRIES_KIND for row in rows):
        rows = [*found.rows, *damaged]  # numbered as stored (a damaged row keeps its seq)
        return sorted(timeline_of(rows), key=lambda entry: entry["seq"])
    return timeline_of(expand(rows))


_DAMAGED = "\x00damaged"


def timeline_of(rows: Sequence[JournalRow]) -> list[dict[str, Any]]:
    """:func:`timeline` of ``rows``, in which rows of kind ``_DAMAGED`` stand for damaged
    rows (their data says what is wrong)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.kind != _DAMAGED:
            out += timeline([row])
            continue
        out.append(
            {
                "seq": row.seq,
                "kind": "damaged",
                "name": None,
                "payload": None,
                "error": {"type": "CheckpointCorruptError", "message": row.data},
            }
        )
    return out


def _damaged(found: Salvaged) -> list[dict[str, Any]]:
    """An entry for each journal row of ``found`` that does not read."""
    return [
        {
            "seq": seq,
            "kind": "damaged",
            "name": None,
            "payload": None,
            "error": {"type": "CheckpointCorruptError", "message": fault},
        }
        for seq, fault in found.damaged.items()
    ]


def run_timeline(found: Salvaged) -> list[dict[str, Any]]:
    """A run's timeline as operators see it (``show``, ``history``, ``diff``, the
    inspector): :func:`salvaged_timeline`, then, for a failed or paused run, the step it
    stopped at (which committed no row of its own) with its error, as the last entry
    (``seq`` None, kind ``"failed"`` or ``"paused"``). An agent run's timeline is its
    turns, tool calls and resumes (:func:`agent_timeline`), not its journal rows."""
    head = found.head
    if head.kind == AGENT_KIND:
        steps = agent_timeline(agent_view(head, found.rows)) + _damaged(found)
        steps.sort(key=lambda entry: entry["seq"])
    else:
        steps = salvaged_timeline(found)
    err = _error_of(head)
    if err is not None and head.status in ("failed", "paused"):
        steps.append(
            {
                "seq": None,
                "kind": head.status,
                "name": err.get("step") or err.get("node"),
                "payload": None,
                "error": err,
                "started_at": None,
                "committed_at": head.updated_at,  # when it was recorded
            }
        )
    return with_times(steps, created_at=head.created_at)


def with_times(entries: list[dict[str, Any]], *, created_at: float) -> list[dict[str, Any]]:
    """``entries`` (a timeline, in journal order) with how long each one's work took
    (``duration_seconds``: from its start to its commit) and the gap before it
    (``gap_seconds``: from the last commit made before it started, or the run's creation,
    to its start: time spent between steps, stranded after a crash, or waiting to be
    resumed). None where a time is unknown (rows written before journal rows had times).
    Every entry gets ``started_at`` and ``committed_at`` (None when unknown)."""
    commits: list[float] = []  # the commit times seen so far, sorted
    for entry in entries:
        started, committed = entry.get("started_at"), entry.get("committed_at")
        entry["started_at"], entry["committed_at"] = started, committed
        entry["duration_seconds"] = (
            round(committed - started, 6) if started is not None and committed is not None else None
        )
        gap = None
        if started is not None:
            at = bisect.bisect_right(commits, started)
            before = commits[at - 1] if at else created_at
            gap = round(max(started - before, 0.0), 6)
        entry["gap_seconds"] = gap
        if committed is not None:
            bisect.insort(commits, committed)
    return entries


def run_detail(
    store: Store, key: str, *, now: float | None = None, diagram: bool = False
) -> dict[str, Any] | None:
    """Everything about one run: summary, head meta, its timeline, the tool calls it waits
    on (``pending_approvals``) and, for an agent run, ``agent``: its phases, its effects
    with their replay counts and its final state (see :func:`agent_view`). With
    ``diagram``, also ``diagram``: the shape of a Plan, graph or ReplanEngine run with
    each node's state (:func:`~stepstone.durable._shape.run_shape`; None for other
    kinds)."""
    found = read_salvaged(store.backend, key)
    if found is None:
        return None
    head, rows = found.head, found.rows
    steps = run_timeline(found)
    err = _error_of(head)
    now = database_now(store) if now is None else now
    taken = successors(store, [head], prefix=key).get(key)
    fault = found.damaged[min(found.damaged)] if found.damaged else None
    summary = run_summary(head, now=now, superseded_by=taken, damaged=fault)
    detail = {**summary, "meta": head.meta, "error": err, "timeline": steps}
    problem = damage_report(found) if found.damaged else journal_problem(head, rows)
    if problem is not None:  # shown as it is, to see what is left; a resume refuses it
        detail["corrupt"] = f"the record is corrupt: {problem}"
    # Tool calls it waits on (its own, or those of a paused Plan's LLM steps).
    detail["pending_approvals"] = waiting_calls(store, head, rows)
    detail.update(time_and_messages(store, key, now=now))
    if head.kind == AGENT_KIND:
        detail["agent"] = agent_view(head, rows)
    if head.kind == "workflow" and problem is None:
        detail["operations"] = operation_rows(head, rows)
    if diagram:
        detail["diagram"] = run_shape(head, rows, now=now)
    return detail


def time_and_messages(store: Store, key: str, *, now: float | None = None) -> dict[str, Any]:
    """What a run waits for, its events, its streams and its messages, JSON-ready (what
    ``stepstone show`` and the inspector print under the run):

    * ``waiting``: its timers, each ``{"name", "state", "until", "topic", "since"}``;
      ``state`` is ``"sleeping"`` (a time, no topic), ``"waiting"`` (for a message on
      ``topic``, until ``until`` or without a limit) or ``"due"`` (its time has come: the
      run wakes, or a worker takes it, any moment);
    * ``events``: name to last value (as plain JSON), with ``events_at``, when each was set;
    * ``streams``: ``{"name", "length"}`` for each stream;
    * ``messages``: ``{"pending": [{"id", "topic", "sent_at"}...], "consumed": count}``.

    A value that does not decode is shown as its stored text."""
    now = database_now(store) if now is None else now
    backend = store.backend
    waiting: list[dict[str, Any]] = []
    for timer in backend.timers(key):
        if timer.wake_at is not None and timer.wake_at <= now:
            state = "due"
        else:
            state = "sleeping" if timer.topic is None else "waiting"
        waiting.append(
            {
                "name": timer.name,
                "state": state,
                "until": timer.wake_at,
                "topic": timer.topic,
                "since": timer.since,
            }
        )
    found = backend.events(key)
    messages = backend.messages(key)
    pending = [
        {"id": m.id, "topic": m.topic, "sent_at": m.sent_at}
        for m in messages
        if m.consumed_at is None
    ]
    return {
        "waiting": waiting,
        "events": {e.name: _plain(e.data) for e in found},
        "events_at": {e.name: e.updated_at for e in found},
        "streams": [{"name": name, "length": n} for name, n in backend.streams(key)],
        "messages": {"pending": pending, "consumed": len(messages) - len(pending)},
    }


def _plain(text: str) -> Any:
    """A stored value (typed JSON) as plain JSON, or its text when it does not decode."""
    try:
        return untag(json.loads(text))
    except ValueError:
        return text


def damage_report(found: Salvaged) -> str:
    """What :func:`read_salvaged` found damaged, and how to go on: rewind the run to the
    last step journaled before the first damaged row (``stepstone retry``), or delete it
    when no step comes before."""
    key = found.head.key
    more = len(found.damaged) - 1
    text = found.damaged[min(found.damaged)] + (
        f" (and {more} more damaged row(s))" if more else ""
    )
    before = rewind_steps(found)
    if before:
        return (
            f"{text}; rewind it to before the damage with `stepstone retry {key} --from "
            f"{before[-1]}` (that step and the ones after it run again on resume)"
        )
    return f"{text}; no step was journaled before it: delete it with store.delete({key!r})"


def rewind_steps(found: Salvaged) -> list[str]:
    """The steps a run with damaged rows can be rewound to (``retry_run``): those
    journaled before its first damaged row, each once, ordered by their last execution
    (the last one loses least)."""
    first = min(found.damaged, default=found.head.journal_len)
    names: dict[str, None] = {}
    for row in found.rows:
        if row.seq < first and row.kind == "step" and row.name:
            names.pop(row.name, None)
            names[row.name] = None
    return list(names)


def stranded_runs(store: Store, *, now: float | None = None) -> list[dict[str, Any]]:
    """Runs left ``claimed``/``running`` by an owner that died and nobody resumed, oldest
    first (resume them with ``resume=True``, or delete them). A run another run took
    over (a graph invocation resumed under a new id) is not stranded, and neither is an
    engine's bookkeeping (a resume lock)."""
    now = database_now(store) if now is None else now
    heads = store.backend.run_list(None)
    taken = successors(store, heads)
    out = [
        run_summary(h, now=now)
        for h in heads
        if h.status in LIVE_STATUSES
        and not owner_alive(h, now=now)
        and h.key not in taken
        and not is_internal_kind(h.kind)
    ]
    out.sort(key=lambda s: s["updated_at"])
    return out


def _comparable(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry["kind"], entry["name"], entry.get("payload"), entry.get("error"))


def _end(head: RunHead) -> dict[str, Any]:
    """Where a run stands, beyond its journal: its status, next step and error."""
    return {"status": head.status, "next_step": head.next_step, "error": _error_of(head)}


def agent_key(run_id: str) -> str:
    """The key of the agent run ``run_id`` (``Runner.run(..., run_id=...)``)."""
    return f"agent:{run_id}:checkpoint:latest"


def named_run(store: Store, name: str) -> str:
    """The key of the run an operator names: ``name`` itself when the store holds it;
    else the key of the agent run whose ``run_id`` is ``name`` when there is one (``bill-1``
    for ``agent:bill-1:checkpoint:latest``); else ``name``."""
    if _holds(store, name):
        return name
    key = agent_key(name)
    return key if _holds(store, key) else name


def _holds(store: Store, key: str) -> bool:
    """Whether ``key`` holds a run or a value (one that does not decode holds one too)."""
    if not key or key_problem(key, new=False) is not None:
        return False  # a key no store can hold
    try:
        return store.backend.run_get(key) is not None or store.backend.kv_get(key) is not None
    except CorruptRecordError:
        return True


def missing_run(store: Store, key: str) -> str:
    """The message for a ``key`` that holds no run: it names the key and the store, and the
    runs a hurried operator may have meant, those whose key holds it (``refund-o42`` for
    ``agent:refund-o42:checkpoint:latest``, a prefix for the keys it starts), else those
    starting like it, at most 10."""
    keys = sorted(h.key for h in store.backend.run_list(None))
    needle = key.casefold()
    near = [k for k in keys if needle and needle in k.casefold()]
    how = "whose key holds it"
    if not near and key[:3]:
        near, how = [k for k in keys if k.startswith(key[:3])], "starting like it"
    text = f"no run under key {key!r} in {store!r}"
    entry = _entry_without_run(store, key)
    if entry is not None:
        return (
            f"{text}: its queue entry {entry.id} is {entry.status} and never got a "
            f"checkpoint ({' '.join(str(entry.error).split())[:200]}); once that is fixed, "
            f"put it back in its queue with `stepstone requeue {entry.id[:12]}`"
        )
    if near:
        more = f" (and {len(near) - 10} more)" if len(near) > 10 else ""
        shown = ", ".join(repr(k) for k in near[:10])
        return f"{text}; runs {how}: {shown}{more}"
    return f"{text}; list them with `stepstone runs`"


def _entry_without_run(store: Store, key: str) -> QueueEntry | None:
    """The latest queue entry of ``key`` when it failed or was cancelled (a run with no
    checkpoint: its target did not import), else None."""
    queue = existing_queue(store)
    if queue is None or queue.active_entry(key) is not None:
        return None
    entries = [e for e in queue.entries(None, None) if e.run_key == key]
    if not entries or entries[-1].status not in ("failed", "cancelled"):
        return None
    return entries[-1]


def diff_runs(store: Store, key_a: str, key_b: str) -> dict[str, Any]:
    """Where two runs diverged: their common prefix length and the first differing entries,
    the entries they share (``same``) and those of each after it (``only_a``, ``only_b``).

    Raises:
        KeyError: one of the keys holds no run (the message names it).
    """
    found = {k: read_salvaged(store.backend, k) for k in (key_a, key_b)}
    heads = {k: f.head if f is not None else None for k, f in found.items()}
    for k, f in found.items():
        if f is None:
            raise KeyError(missing_run(store, k))
    fa, fb = found[key_a], found[key_b]
    assert fa is not None and fb is not None
    a, b = run_timeline(fa), run_timeline(fb)
    same = 0
    while same < min(len(a), len(b)) and _comparable(a[same]) == _comparable(b[same]):
        same += 1
    ha, hb = heads[key_a], heads[key_b]
    assert ha is not None and hb is not None
    return {
        "a": run_summary(ha),
        "b": run_summary(hb),
        "same_prefix": same,
        "identical": same == len(a) == len(b) and _end(ha) == _end(hb),
        "ends": {"a": _end(ha), "b": _end(hb)},
        "first_difference": None
        if same == len(a) == len(b)
        else {
            "index": same,
            "a": a[same] if same < len(a) else None,
            "b": b[same] if same < len(b) else None,
        },
        "only_a": a[same:],
        "only_b": b[same:],
        "same": a[:same],
    }
