"""What ``resume=True`` would do with a stored Plan run, decided without writing anything
(``stepstone migrate --dry-run``).

The verdict is reached by the very checks a resume makes inside its claim (the plan's
``_check_resume``), on the record read and validated as a resume reads it, so it cannot
say one thing while the resume does another.
"""

from __future__ import annotations

from stepstone.durable import database_now, owner_alive
from stepstone.durable._inspect import ResumeVerdict
from stepstone.engines.plan._plan import Plan, _read_checkpoint
from stepstone.exceptions import CorruptRecordError, StaleCheckpointError
from stepstone.store import Store

__all__ = ["resume_verdict"]


def resume_verdict(plan: Plan, store: Store, key: str) -> ResumeVerdict:
    """What ``resume=True`` of ``plan`` on ``key`` would do (nothing is written)."""
    try:
        found = _read_checkpoint(store, key)
    except CorruptRecordError as exc:
        return ResumeVerdict(verdict="corrupt", detail=_first(exc), runs=False)
    if found is None:
        return ResumeVerdict(verdict="gone", detail="no Plan run under this key", runs=False)
    head, rep = found
    if owner_alive(head, now=database_now(store)):
        return ResumeVerdict(
            verdict="live",
            detail=f"owned by live run {head.run_uid}, pid {head.pid} on host {head.host}: "
            "a resume is refused until it stops",
            runs=False,
        )
    try:
        decided = plan._check_resume(head, rep.shape, found)
    except StaleCheckpointError as exc:
        return ResumeVerdict(verdict="stale", detail=_first(exc), runs=False)
    except CorruptRecordError as exc:
        return ResumeVerdict(verdict="corrupt", detail=_first(exc), runs=False)
    if decided == "fresh":
        return ResumeVerdict(
            verdict="restarts",
            detail="written by another version of the plan: on_plan_change='restart' starts "
            "it over",
            runs=True,
        )
    if head.status == "done":
        return ResumeVerdict(
            verdict="done", detail="finished: a resume returns its result", runs=False
        )
    stored = head.meta.get("fingerprint")
    if stored is not None and stored != plan._compiled.fingerprint:
        return ResumeVerdict(
            verdict="changed",
            detail=f"written by another version of the plan: on_plan_change='continue' "
            f"resumes it by step name at {head.next_step!r}",
            runs=True,
        )
    return ResumeVerdict(
        verdict="current", detail=f"resumes at {head.next_step!r} ({head.status})", runs=True
    )


def _first(exc: BaseException) -> str:
    """The first sentence of ``exc``'s message (what is wrong, without the fixes)."""
    text = " ".join(str(exc).split())
    return text.split(". ", 1)[0].rstrip(".")
