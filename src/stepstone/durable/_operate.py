"""Operating a run from outside its owner: cancel it, fork it at a step.

Both go through the head's compare-and-swap like every other write. Cancelling a live run
only flags its head (``meta["cancel_requested"]``) and bumps its version: the owner's next
commit then misses the version it expected, finds the flag, commits its step as
``failed`` with a ``RunCancelledError`` and stops (see ``OwnedRun``). Nothing a step did is
lost and no step runs after the cancel is seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

from stepstone.core._ids import new_origin
from stepstone.durable._inspect import missing_run, rewind_steps
from stepstone.durable._kernel import describe_owner, ownership_error
from stepstone.durable._leases import owner_alive
from stepstone.durable._operations import cut_rows
from stepstone.durable._queue import existing_queue
from stepstone.exceptions import (
    CheckpointCorruptError,
    StoreError,
    StoreKeyConflictError,
    UserError,
)
from stepstone.store._base import Claim, JournalRow, RunHead, read_consistent, read_salvaged
from stepstone.store._store import Store, check_key
from stepstone.store._views import render_run

__all__ = [
    "a_kind",
    "cancel_error",
    "cancel_run",
    "fork_run",
    "retry_run",
]


class _Absent(Exception):
    """No run under the key (found inside a transaction)."""


def _missing(store: Store, key: str) -> KeyError:
    return KeyError(missing_run(store, key))


def _read_sound(store: Store, key: str) -> tuple[RunHead, list[JournalRow]]:
    """The run under ``key`` with its journal, decoded as reading it would: a corrupt
    record raises CheckpointCorruptError naming the key, and is never copied or rewound."""
    found = read_consistent(store.backend, key)
    if found is None:
        raise _missing(store, key)
    render_run(*found)
    return found


_ONLY_PLANS = {
    "graph": "resume it where it stopped with `stepstone resume KEY --target module:graph` "
    "(graph.invoke(resume_invocation=...))",
    "agent": "resume it where it stopped with runner.resume(agent, run_id=..., thread_id=...)",
}


def a_kind(kind: str) -> str:
    """``kind`` with its article: ``a graph``, ``an agent``."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _plan_only(head: RunHead, what: str) -> None:
    """Refuse ``what`` (``retry``, ``fork``) on a run that is not a Plan (or workflow) run:
    only their journals are made of steps to cut at. (Before, such a run was said to have
    no steps.)"""
    if head.kind in ("plan", "workflow"):
        return
    how = _ONLY_PLANS.get(head.kind, "resume it with the engine that runs it")
    raise UserError(
        f"run {head.key!r} is {a_kind(head.kind)} run: `stepstone {what}` works on Plan and "
        f"workflow runs, whose journals are made of steps; nothing was changed. To run it "
        f"again, {how}"
    )


def cancel_error(head: RunHead, reason: str) -> dict[str, Any]:
    """The ``meta["error"]`` a cancelled run records (the shape Plan errors have).

    A run that had stopped with an error of its own (a failed run, a paused one) keeps it:
    its message is quoted in the new one and the whole error is ``previous_error``, so a
    cancel never erases why a run failed."""
    error: dict[str, Any] = {
        "step": head.next_step,
        "type": "RunCancelledError",
        "message": f"run {head.key!r} was cancelled: {reason}",
        "retryable": True,
    }
    before = head.meta.get("error")
    if isinstance(before, dict) and head.status in ("failed", "paused"):
        where = before.get("step") or before.get("node")
        at = f" at {where!r}" if where else ""
        error["message"] += (
            f" (it had {head.status}{at} with {before.get('type')}: {before.get('message')})"
        )
        if error["step"] is None and where:
            error["step"] = where
        error["previous_error"] = before
    return error


def _cancelled_already(head: RunHead) -> dict[str, Any] | None:
    """The error of a run an earlier cancel stopped (and nothing ran since), else None."""
    err = head.meta.get("error")
    if head.status != "failed" or not isinstance(err, dict):
        return None
    return err if err.get("type") == "RunCancelledError" else None


def cancel_run(store: Store, key: str, *, reason: str = "cancelled") -> str:
    """Cancel the run under ``key``; returns what happened, in words.

    A live owner is asked to stop (it stops at its next commit, which it records as
    ``failed``); a paused, failed or stranded run is marked ``failed`` with a
    ``RunCancelledError`` at once, keeping the error it had stopped with as the new error's
    ``previous_error`` (see :func:`cancel_error`). A run an earlier cancel already stopped
    is left as it is (the answer says so). ``resume=True`` can still continue it later.

    A run that came from a work queue has its queue entry cancelled too, so no worker
    starts it or takes it over (a queued one ends ``cancelled`` before it started, even
    with no checkpoint yet).

    Raises:
        KeyError: no run under ``key`` (and no queue entry waiting to start it).
        ValueError: the run is already done.
    """
    said = [""]  # what decide() found (it may be called again when a backend retries)
    queue = existing_queue(store)
    entry = queue.active_entry(key) if queue is not None else None

    def decide(head: RunHead | None, _kv: str | None) -> Claim | None:
        if head is None:
            raise _Absent  # named outside the transaction (the message lists other keys)
        if head.status == "done":
            raise ValueError(f"run {key!r} is already done; there is nothing to cancel")
        now = store.backend.clock()  # leases are judged by the database's clock
        request = {"reason": reason, "at": now}
        if owner_alive(head, now=now):
            said[0] = (
                f"cancel requested: the owner (pid {head.pid} on {head.host.split('/')[0]}) "
                "stops at its next commit"
            )
            new = head.replace(
                version=head.version + 1, meta={**head.meta, "cancel_requested": request}
            )
            return Claim(head=new)
        before = _cancelled_already(head)
        if before is not None:  # a second operator, or the same command run twice
            said[0] = f"already cancelled ({before.get('message')}); nothing changed"
            return None
        error = cancel_error(head, reason)
        kept = "; its error is kept as previous_error" if "previous_error" in error else ""
        said[0] = f"cancelled ({head.status} run, no live owner): marked failed{kept}"
        new = head.replace(
            status="failed",
            version=head.version + 1,
            lease_until=now,
            updated_at=now,
            meta={**head.meta, "cancelled": request, "error": error},
        )
        return Claim(head=new)

    outcome: list[str] = []
    try:
        store.backend.run_transact(key, decide)
        outcome.append(said[0])
        if said[0].startswith("cancel requested"):
            # a live owner waiting (a sleep, a receive) looks at its run again now
            with contextlib.suppress(StoreError):
                store.backend.notify_run(key)
    except _Absent:
        if entry is None:
            raise _missing(store, key) from None
        outcome.append(f"no run under {key!r} yet")
    if queue is not None and entry is not None:
        status = queue.cancel(entry)
        outcome.append(
            f"its queue entry {entry} is cancelled: no worker starts it"
            if status == "cancelled"
            else f"its queue entry {entry} is marked cancelled: no worker takes it over"
        )
    return "; ".join(outcome)


def fork_run(store: Store, key: str, *, at: str, to: str) -> RunHead:
    """Copy the run under ``key`` up to and including its step ``at`` into a new run ``to``.

    The copy is ``paused`` at the step that followed ``at``, so the same engine resumes it
    there with ``resume=True`` (``Plan(checkpoint_key=to, resume=True)``). The original is
    not touched.

    Raises:
        KeyError: no run under ``key``, or it never ran a step named ``at``.
        UserError: the run is not a Plan run (a graph, an agent run): nothing is written.
        CheckpointCorruptError: the run's record is corrupt (nothing is written).
        StoreKeyConflictError: ``to`` is already used.
        TypeError, ValueError: ``to`` cannot be a key (not a non-empty string, or holds a
            NUL character); nothing is written.
    """
    check_key(to, "fork's new key (to=)", new=True)
    head, rows = _read_sound(store, key)
    _plan_only(head, "fork")
    if head.kind == "workflow":
        return _fork_workflow(store, head, rows, at, to)
    end = _fork_end(key, rows, at)
    kept = rows[:end]
    following = [r for r in rows[end:] if r.kind == "step"]
    next_step = (_band_of(following[0]) or following[0].name) if following else head.next_step
    iteration = _fork_iteration(key, head, kept, at)
    units = _units(kept)
    now = store.backend.clock()
    new = head.replace(
        key=to,
        status="paused" if next_step is not None else "done",
        next_step=next_step,
        version=1,
        iteration=iteration,
        journal_len=len(kept),
        lease_until=now,
        created_at=now,
        updated_at=now,
        meta={
            **head.meta,
            "position": units,
            "rejoin": None,
            "error": None,
            "forked_from": {"key": key, "at": at, "run_uid": head.run_uid},
            "origin": new_origin(),  # the copy's steps get keys of their own
        },
    )
    # the copies keep their times: the fork's history is the original's up to the fork
    copies = [dataclasses.replace(r, seq=i) for i, r in enumerate(kept)]

    def decide(cur: RunHead | None, kv: str | None) -> Claim:
        if cur is not None or kv is not None:
            raise StoreKeyConflictError(
                f"cannot fork {key!r} to {to!r}: that key is already used; pick a new key "
                f"or delete it with store.delete({to!r})"
            )
        return Claim(head=new, rows=copies)

    written = store.backend.run_transact(to, decide)
    assert written is not None
    return written


def _fork_end(key: str, rows: list[JournalRow], at: str) -> int:
    """How many of the run's ``rows`` a fork at its step ``at`` copies: up to its last
    execution of ``at``, or to the end of the parallel band it ran in."""
    cut = [i for i, r in enumerate(rows) if r.name == at and r.kind == "step"]
    if not cut:
        names = sorted({str(r.name) for r in rows if r.kind == "step"})
        raise KeyError(f"run {key!r} has no step {at!r} in its journal (steps: {names})")
    end = cut[-1] + 1
    band = _band_of(rows[cut[-1]])
    if band is None:
        return end
    # a band is one unit: the copy takes it whole, or not at all
    ends = [i for i in range(end, len(rows)) if rows[i].kind == "band" and rows[i].name == band]
    if not ends:
        raise ValueError(
            f"step {at!r} of run {key!r} ran in the parallel band {band!r}, which did not "
            "finish: fork at the step before the band, or retry the run"
        )
    return ends[0] + 1


def _fork_iteration(key: str, head: RunHead, kept: list[JournalRow], at: str) -> int:
    """The iteration count a fork's copy (``kept``: its rows) starts with: its last step's."""
    last = next(r for r in reversed(kept) if r.kind == "step")
    iteration = json.loads(last.data).get("iteration")
    if iteration is None:  # rows written before steps recorded it
        iteration = head.iteration
    if isinstance(iteration, bool) or not isinstance(iteration, int):
        raise CheckpointCorruptError(
            f"run {key!r} cannot be forked at {at!r}: its journal row {last.seq} records the "
            f"iteration {iteration!r}, not a count; nothing was written"
        )
    return iteration


def _rewind_past_damage(
    store: Store, key: str, from_step: str, error: CheckpointCorruptError
) -> tuple[RunHead, list[JournalRow], str]:
    """The head, the rows to keep and the step to continue at when ``from_step`` was
    journaled before the run's first damaged row: everything before its last execution
    there (:func:`_last_run_of`), which must read and decode. Otherwise ``error`` (or one
    naming the steps it can be rewound to) is raised."""
    found = read_salvaged(store.backend, key)
    if found is None:
        raise _missing(store, key)
    if not found.damaged:
        raise error  # every row reads; the record as a whole does not decode
    steps = rewind_steps(found)
    first = min(found.damaged)
    if from_step not in steps:
        fix = (
            f"rewind it to {steps[-1]!r} (`stepstone retry {key} --from {steps[-1]}`)"
            if steps
            else f"no step was journaled before it: delete it with store.delete({key!r})"
        )
        raise CheckpointCorruptError(
            f"run {key!r} cannot be rewound to {from_step!r}: {found.damaged[first]}, and a "
            f"rewind keeps only the rows before it ({fix}). Nothing was changed"
        ) from error
    cut = _last_run_of([r for r in found.rows if r.seq < first], from_step)
    assert cut is not None  # from_step is one of the steps journaled before the damage
    kept = found.rows[: cut[0]]
    render_run(found.head.replace(journal_len=len(kept)), kept)  # what is kept must decode
    return found.head, kept, cut[1]


def _band_of(row: JournalRow) -> str | None:
    """The parallel band a Plan step row ran in (its first step's name), else None."""
    if row.kind != "step":
        return None
    band = json.loads(row.data).get("band")
    return None if band is None else str(band)


def _units(rows: list[JournalRow]) -> int:
    """How many Plan units ``rows`` completed (a band counts once): the run's position."""
    return sum(1 for r in rows if r.kind == "band" or (r.kind == "step" and _band_of(r) is None))


def _last_run_of(rows: list[JournalRow], step: str) -> tuple[int, str] | None:
    """Where a rewind to ``step`` cuts ``rows`` (before its last execution), and the step the
    run then continues at: ``step`` itself, or, for a step that ran in a parallel band, the
    band's first step, the cut moved to the band's first row (a band runs again whole: its
    steps were applied together and are re-run together)."""
    runs = [i for i, r in enumerate(rows) if r.name == step and r.kind == "step"]
    if not runs:
        return None
    cut = runs[-1]
    band = _band_of(rows[cut])
    if band is None:
        return cut, step
    while cut > 0 and _band_of(rows[cut - 1]) == band:
        cut -= 1
    return cut, band


def retry_run(store: Store, key: str, *, from_step: str) -> RunHead:
    """Rewind the run under ``key`` so that its next resume runs ``from_step`` again.

    The journal rows of ``from_step``'s last execution and of everything after it are
    dropped (in one transaction with the new head); the run is left ``paused`` at
    ``from_step``, and ``resume=True`` re-runs it and what follows. ``writes=`` values the
    dropped steps stored stay in the store until the re-run overwrites them. A run that came
    from a work queue is not put back in it here: :func:`requeue_run` does that (``stepstone
    retry`` calls both), or resume it yourself.

    Raises:
        KeyError: no run under ``key``, or it never ran ``from_step``.
        UserError: the run is not a Plan run (a graph, an agent run): nothing is written.
        CheckpointCorruptError: the run's record is corrupt (nothing is written). A run
            with damaged journal rows (a changed byte) can still be rewound to a step
            journaled before the first of them: what follows is dropped with the damage.
        ConcurrentRunError: a live owner runs it (cancel it first).
    """
    try:
        head, rows = _read_sound(store, key)
    except CheckpointCorruptError as exc:
        head, kept, from_step = _rewind_past_damage(store, key, from_step, exc)
        _plan_only(head, "retry")
    else:
        _plan_only(head, "retry")
        if head.kind == "workflow":
            return _retry_workflow(store, head, rows, from_step)
        cut = _last_run_of(rows, from_step)
        if cut is not None:
            kept, from_step = rows[: cut[0]], cut[1]
        elif from_step == head.next_step:  # the step it stopped at: nothing to drop
            kept = rows
        else:
            names = sorted({str(r.name) for r in rows if r.kind == "step"})
            raise KeyError(f"run {key!r} has no step {from_step!r} in its journal (steps: {names})")
    units = _units(kept)

    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        if cur is None or cur.version != head.version:
            raise ownership_error(
                head.kind,
                f"run {key!r} changed while it was being rewound; run `stepstone retry` again",
            )
        now = store.backend.clock()  # leases are judged by the database's clock
        if owner_alive(cur, now=now):
            raise ownership_error(
                cur.kind,
                f"run {key!r} is live ({describe_owner(cur)}); cancel it first with "
                f"`stepstone cancel {key}`, then retry",
            )
        new = cur.replace(
            status="paused",
            next_step=from_step,
            version=cur.version + 1,
            journal_len=len(kept),
            lease_until=now,
            updated_at=now,
            meta={
                **cur.meta,
                "position": units,
                "rejoin": None,
                "error": None,
                "retry_from": {"step": from_step, "at": now},
                # what runs again is a new execution: new idempotency keys, and its LLM
                # loops ask the model again instead of replaying the dropped answers
                "origin": new_origin(),
            },
        )
        return Claim(head=new, reset_journal=True, rows=kept)

    written = store.backend.run_transact(key, decide)
    assert written is not None
    return written


def _workflow_meta(head: RunHead, **more: Any) -> dict[str, Any]:
    """A rewound or forked workflow run's meta: no error, a new origin (what runs again is
    a new execution: new idempotency keys, agent loops that ask the model again)."""
    meta = {k: v for k, v in head.meta.items() if k not in ("error", "rerun", "cancelled")}
    return {**meta, **more, "origin": new_origin()}


def _retry_workflow(store: Store, head: RunHead, rows: list[JournalRow], spec: str) -> RunHead:
    """:func:`retry_run` of a workflow run: drop the operation ``spec`` names and every one
    after it in position order (and the result), so running the workflow again under its
    key replays what is kept and runs the rest."""
    kept, pos, name = cut_rows(head.key, rows, spec, keep_it=False)

    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        if cur is None or cur.version != head.version:
            raise ownership_error(
                head.kind,
                f"run {head.key!r} changed while it was being rewound; run `stepstone retry` again",
            )
        now = store.backend.clock()
        if owner_alive(cur, now=now):
            raise ownership_error(
                cur.kind,
                f"run {head.key!r} is live ({describe_owner(cur)}); cancel it first with "
                f"`stepstone cancel {head.key}`, then retry",
            )
        new = cur.replace(
            status="paused",
            next_step=f"{pos} {name}",
            version=cur.version + 1,
            journal_len=len(kept),
            iteration=sum(1 for r in kept if r.kind == "outcome"),
            lease_until=now,
            updated_at=now,
            meta=_workflow_meta(cur, retry_from={"step": f"{pos} {name}", "at": now}),
        )
        return Claim(head=new, reset_journal=True, rows=kept)

    written = store.backend.run_transact(head.key, decide)
    assert written is not None
    return written


def _fork_workflow(
    store: Store, head: RunHead, rows: list[JournalRow], spec: str, to: str
) -> RunHead:
    """:func:`fork_run` of a workflow run: a new run under ``to`` holding its journal up to
    and including the operation ``spec`` names (in position order), ``paused``: running
    the workflow under ``to`` replays that and runs the rest."""
    kept, pos, name = cut_rows(head.key, rows, spec, keep_it=True)
    now = store.backend.clock()
    new = head.replace(
        key=to,
        status="paused",
        next_step=None,
        version=1,
        iteration=sum(1 for r in kept if r.kind == "outcome"),
        journal_len=len(kept),
        lease_until=now,
        created_at=now,
        updated_at=now,
        meta=_workflow_meta(
            head, forked_from={"key": head.key, "at": f"{pos} {name}", "run_uid": head.run_uid}
        ),
    )

    def decide(cur: RunHead | None, kv: str | None) -> Claim:
        if cur is not None or kv is not None:
            raise StoreKeyConflictError(
                f"cannot fork {head.key!r} to {to!r}: that key is already used; pick a new "
                f"key or delete it with store.delete({to!r})"
            )
        return Claim(head=new, rows=kept)

    written = store.backend.run_transact(to, decide)
    assert written is not None
    return written
