"""What ``invoke(resume_invocation=...)`` would do with a stored graph record, decided
without writing anything (``stepstone migrate --dry-run``): the record loaded and mapped
onto the graph as a resume loads and maps it (its state migrated, where it continues
found), then the resume's own refusals (a live owner, a resume under way)."""

from __future__ import annotations

from typing import Any

from stepstone.durable import database_now, owner_alive, run_head
from stepstone.durable._inspect import ResumeVerdict
from stepstone.engines.graph._checkpoint import StoreCheckpointer
from stepstone.engines.graph._compiled import CompiledGraph
from stepstone.exceptions import (
    CheckpointError,
    CheckpointStateMigrationError,
    CorruptRecordError,
)

__all__ = ["graph_resume_verdict"]


def graph_resume_verdict(graph: CompiledGraph[Any], invocation_id: str) -> ResumeVerdict:
    """What resuming ``invocation_id`` with ``graph`` (and its checkpointer) would do:
    ``current``, ``migrates`` (the detail names the chain), ``done`` (a new record that
    runs no node), ``no chain`` (refused: no migration leads to the graph's schema),
    ``corrupt``, ``gone`` or ``live`` (refused)."""
    cp = graph.checkpointer
    if not isinstance(cp, StoreCheckpointer):
        # A checkpointer of the user's own keeps no run records this judgement can read.
        what = "no checkpointer" if cp is None else "a checkpointer that keeps no store records"
        return ResumeVerdict(verdict="gone", detail=f"the graph has {what}", runs=False)
    try:
        raw = cp.load_raw(invocation_id)
        graph._prepare_resume(raw)  # the saved state migrated, where it goes on found
    except CheckpointStateMigrationError as exc:
        return ResumeVerdict(verdict="no chain", detail=_first(exc), runs=False)
    except CorruptRecordError as exc:
        return ResumeVerdict(verdict="corrupt", detail=_first(exc), runs=False)
    except CheckpointError as exc:
        return ResumeVerdict(verdict="gone", detail=_first(exc), runs=False)
    now = database_now(cp.store)
    for key in (cp.key(invocation_id), cp.lock_key(invocation_id)):
        head = run_head(cp.store, key)
        if head is not None and owner_alive(head, now=now):
            what = "being resumed" if key == cp.lock_key(invocation_id) else "still running"
            return ResumeVerdict(
                verdict="live", detail=f"{what} by pid {head.pid}: a resume is refused", runs=False
            )
    stored = raw.head
    assert stored is not None  # a store checkpointer's record always has its head
    saved = stored.meta.get("schema_version")
    target = graph.state_cls.schema_version
    path = ""
    if target and saved not in (None, target):
        chain = graph.migrations.chain(str(saved), target)
        path = " -> ".join([chain[0][0], *(b for _, b, _ in chain)]) if chain else str(saved)
    if stored.status == "done":
        migrated = f" (its state migrates {path})" if path else ""
        return ResumeVerdict(
            verdict="done",
            detail=f"finished: a resume makes a new record and runs no node{migrated}",
            runs=False,
        )
    if path:
        return ResumeVerdict(verdict="migrates", detail=path, runs=True)
    return ResumeVerdict(verdict="current", detail=f"schema {saved or target or '-'}", runs=True)


def _first(exc: BaseException) -> str:
    """The first sentence of ``exc``'s message."""
    text = " ".join(str(exc).split())
    return text.split("; ", 1)[0].rstrip(".")
