"""One run of a workflow: claim its key, replay its journal, run the body, record how it
ended.

A run is a kernel run of kind ``"workflow"`` under its key. Its journal starts with a
``start`` row (the workflow's name and arguments, written by the claim that creates the
run), holds the operation journal's ``intent`` / ``attempt`` / ``outcome`` rows of its
steps, child workflows and patches (:mod:`stepstone.durable._operations`), and a
finished run ends with a ``result`` row (the return value). A failed run records its error
in the head's ``meta["error"]``, and in ``meta["rerun"]`` the positions of the step errors
it stopped on, which its resume runs again.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from stepstone.core._serialization import from_typed_json
from stepstone.durable import aclaim_run, blocking_call, journal_since
from stepstone.durable._effects import bind_scope
from stepstone.durable._hashing import hash_json
from stepstone.durable._operations import (
    OperationJournal,
    error_data,
    load_entries,
    rebuild_error,
)
from stepstone.engines.workflow._values import encode_value
from stepstone.exceptions import (
    ApprovalPendingError,
    ConcurrentRunError,
    RunCancelledError,
    RunParked,
    UserError,
    WorkflowCorruptError,
)
from stepstone.store import Store
from stepstone.store._base import RunHead

__all__ = ["FORMAT", "WORKFLOW_KIND", "recorded_result", "run_workflow"]

log = logging.getLogger("stepstone")

WORKFLOW_KIND = "workflow"
#: The version of a workflow run's journal format (in its ``start`` row).
FORMAT = 1

#: Head meta keys a run's last commit replaces.
_ENDING = ("error", "rerun")


def _origin(head: RunHead) -> str | None:
    origin = head.meta.get("origin")
    return origin if isinstance(origin, str) else None


async def run_workflow(
    name: str,
    body: Callable[..., Coroutine[Any, Any, Any]],
    store: Store,
    key: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    argdata: Any,
    *,
    parent: OperationJournal | None = None,
) -> Any:
    """Run the workflow ``name`` (its ``body`` called with ``args``/``kwargs``, recorded as
    ``argdata``) durably under ``key``: a finished run's recorded result, or the run
    resumed (replaying what its journal recorded) or started.

    Raises:
        ConcurrentRunError: a live process runs ``key``.
        UserError: ``key`` holds a run of another workflow.
        Exception: what the body raised (the run is recorded ``failed``).
    """
    what = f"workflow {name!r}"
    parent_ref = None
    if parent is not None:
        parent_ref = {"key": parent.key, "origin": _origin(parent.run.head)}

    def check_resume(head: RunHead) -> str | None:
        recorded = head.meta.get("workflow")
        if recorded != name:
            raise UserError(
                f"key {key!r} holds a run of workflow {recorded!r}, not {name!r}; run "
                f"{name!r} under another key, or remove that run with store.delete({key!r})"
            )
        if parent_ref is not None and head.meta.get("parent") != parent_ref:
            return "fresh"  # a child of an earlier run of the parent's key (rewound, forked)
        return None

    meta: dict[str, Any] = {"workflow": name}
    if parent_ref is not None:
        meta["parent"] = parent_ref
    start = {"workflow": name, "args": argdata, "input_hash": hash_json(argdata), "format": FORMAT}
    claimed = await aclaim_run(
        store,
        key,
        kind=WORKFLOW_KIND,
        resume=True,
        first_step=None,
        meta=meta,
        check_resume=check_resume,
        what=what,
        first_rows=[("start", name, start)],
    )
    if claimed.outcome == "done":
        return await blocking_call(store, recorded_result, store, claimed.head)
    run = claimed.run
    assert run is not None
    try:
        head = run.head
        entries = None
        if claimed.outcome == "resumed":
            rows = await run.ajournal()
            rerun = head.meta.get("rerun")
            entries, others = load_entries(key, rows, rerun if isinstance(rerun, list) else ())
            _check_start(key, name, others, start)
        journal = OperationJournal(run, entries, what=what, iteration=head.iteration)
        journal.pause_while_replaying()
        try:
            return await _drive(journal, body, args, kwargs, name)
        finally:
            journal.end_replay()
    finally:
        run.release()


def _check_start(key: str, name: str, others: list[tuple[Any, Any]], start: dict[str, Any]) -> None:
    """Refuse a resume with other arguments than the run was started with."""
    first = next((data for row, data in others if row.kind == "start"), None)
    if first is None:
        raise WorkflowCorruptError(
            f"workflow run {key!r} has no start row; it cannot be resumed. Remove it with "
            f"store.delete({key!r}) or run {name!r} under another key"
        )
    if first.get("input_hash") != start["input_hash"]:
        raise UserError(
            f"workflow run {key!r} was started with other arguments ({_short(first.get('args'))}, "
            f"now {_short(start['args'])}); resume it with the same arguments, or start "
            "this call under another key"
        )


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


@contextlib.contextmanager
def _inside(journal: OperationJournal) -> Iterator[None]:
    token = journal.enter()
    try:
        with bind_scope(journal.scope(journal.run.derived_key("body"))):
            yield
    finally:
        journal.leave(token)


async def _drive(
    journal: OperationJournal,
    body: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str,
) -> Any:
    """Run the body in the journal's scope and commit how it ended."""
    kept = {k: v for k, v in journal.run.head.meta.items() if k not in _ENDING}
    try:
        with _inside(journal):
            value = await body(*args, **kwargs)
        data = encode_value(f"workflow {name!r}", value)
    except Exception as exc:
        if journal.closed or isinstance(exc, RunCancelledError | ConcurrentRunError):
            raise  # the kernel already recorded the cancel, or the run is lost
        rerun = _rerun_positions(journal, exc)
        error = {**error_data(exc), "step": _failed_step(journal, exc)}
        meta = {**kept, "error": error}
        if rerun:
            meta["rerun"] = rerun
        # A run that stopped to ask a person (its agent's tool call needs an approval)
        # is paused: approving the call and running the key again continues it.
        status = "paused" if isinstance(exc, ApprovalPendingError) else "failed"
        try:
            await journal.finish(status, meta=meta)
        except RunCancelledError:
            raise
        except Exception:
            log.warning(
                "stepstone: recording that %r failed did not work", journal.key, exc_info=True
            )
        raise
    except RunParked:
        # It waits longer than its worker keeps a slot for: paused at its wait (with what
        # it committed), resumed into the same wait when a worker takes it again.
        try:
            await journal.finish("paused", meta=kept)
        except Exception:
            log.warning("stepstone: recording that %r waits failed", journal.key, exc_info=True)
        raise
    except BaseException:
        await journal.settle()  # cancelled: what finished is kept, the rest runs on resume
        raise
    await journal.finish("done", rows=[("result", None, {"value": data})], meta=kept)
    return value


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it carries (its cause, context, group members)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


def _rerun_positions(journal: OperationJournal, exc: BaseException) -> list[str]:
    """The positions of the recorded step errors ``exc`` carries: the body did not handle
    them, so a resume of the failed run runs those steps again."""
    ids = {id(e) for e in _chain(exc)}
    return [pos for raised, pos in journal.raised if id(raised) in ids]


def _failed_step(journal: OperationJournal, exc: BaseException) -> str | None:
    """``"<position> <name>"`` of the step whose error ended the run, if one did."""
    ids = {id(e) for e in _chain(exc)}
    for raised, pos in reversed(journal.raised):
        if id(raised) in ids:
            return f"{pos} {journal.entries[pos].name}"
    return None


def recorded_result(store: Store, head: RunHead) -> Any:
    """The return value a finished run recorded (its journal's last row), decoded.

    Raises:
        WorkflowCorruptError: the last row is not the run's result.
    """
    rows = journal_since(store, head.key, max(0, head.journal_len - 1))
    if rows and rows[-1].kind == "result":
        try:
            data = json.loads(rows[-1].data)
        except ValueError:
            data = None
        if isinstance(data, dict) and "value" in data:
            return from_typed_json(data["value"])
        if isinstance(data, dict) and "error" in data:  # pragma: no cover - not written yet
            raise rebuild_error(data["error"])
    raise WorkflowCorruptError(
        f"workflow run {head.key!r} is done but its journal does not end with its result; "
        f"inspect it with `stepstone show {head.key}`"
    )
