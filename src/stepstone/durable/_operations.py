"""The operation journal: calls of ordinary code recorded as effects of a durable run.

A workflow (``stepstone.engines.workflow``) is a plain async function whose calls to the
outside world are *operations*: a ``@step`` call, a child workflow, a ``patched`` check,
an agent loop started in its body (and, built on the same call, timers, messages and the
model and tool calls of framework adapters). Each operation is an effect in the run's
kernel journal, as the LLM loop's calls are (:mod:`._effects`):

* its **position** is the order of calls in the code, per asyncio task: the task that runs
  the body numbers its operations ``0``, ``1``, ``2``...; a task started by the body (what
  ``asyncio.gather`` and ``TaskGroup`` do) numbers its own under a branch of its parent,
  ``"<n>.<k>.<i>"``: ``n`` operations of its parent had started when it was created, it
  is the ``k``-th such task to make an operation, and this is its ``i``-th. So the
  positions of one task never depend on the timing of another, and tasks created together
  are numbered in the order they start, which is the order they were created in;
* an ``intent`` record (the operation's name, its JSON input and the input's hash) is
  committed before the operation runs; an ``outcome`` record (its JSON value, or its
  error) after it; a failed attempt that is retried leaves an ``attempt`` record. The
  records of one commit are one journal row of kind ``ops``;
* on resume, the body runs again from its start and every operation whose outcome is
  recorded returns it (or raises its error) without running; another name, or another
  input, at a recorded position is :class:`~stepstone.exceptions.NonDeterministicWorkflowError`;
* an intent with no outcome is *in doubt* (its process died during the call): run it
  again (``in_doubt="rerun"``, with the same idempotency key) or refuse
  (``"fail"``: :class:`~stepstone.exceptions.EffectInDoubtError`).

**One commit per step.** An outcome does not get a commit of its own: it is committed
with the next operation's intent (the body goes on as soon as the step returned, and
its next operation commits both before it runs), or within one turn of the event loop
when the body does something else first. So a workflow of sequential steps costs one
commit per step, and each step's outcome is durable before the next step starts. An
operation that passes ``wait=True`` (an ``in_doubt="fail"`` step, a message consumed)
waits for its outcome's commit before returning.

The primitive other engines and integrations build on is :func:`current_journal` (the
journal of the durable run the calling code is in, through the :class:`DurableScope` its
engine binds) and :meth:`OperationJournal.operation` (record the next operation at the next
position, with replay), or :func:`journaled` for both at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import gc
import importlib
import json
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal

from stepstone.core._serialization import from_typed_json, to_typed_json, untag
from stepstone.core._sync import may_block_loop
from stepstone.durable._effects import DurableScope, current_scope
from stepstone.durable._hashing import hash_json
from stepstone.durable._kernel import OwnedRun
from stepstone.exceptions import (
    ConcurrentRunError,
    EffectInDoubtError,
    NonDeterministicWorkflowError,
    ReplayedStepError,
    RunCancelledError,
    SerializationError,
    WorkflowCorruptError,
)
from stepstone.store._base import Claim, JournalRow, RunHead
from stepstone.store._extras import ExtraWrites
from stepstone.store._store import Store

__all__ = [
    "Call",
    "Entry",
    "InDoubt",
    "OperationJournal",
    "Outcome",
    "current_journal",
    "cut_rows",
    "error_data",
    "journaled",
    "operation_rows",
    "rebuild_error",
    "approve_operation",
    "pending_operation_approvals",
    "settle_operation",
]

log = logging.getLogger("stepstone")

InDoubt = Literal["rerun", "fail"]
Row = tuple[str, str | None, Any]

#: The kind of the journal rows the operation journal writes: one per commit, a JSON list
#: of ``[kind, position, data]`` records, ``kind`` being ``intent``, ``outcome`` or
#: ``attempt`` (an engine adds rows of its own, such as a workflow's ``start`` and
#: ``result`` rows).
OPS = "ops"
OPERATION_ROWS = (OPS,)

#: Seconds a ``lazy`` outcome (and a call recorded after it ran) waits for the next
#: operation's commit to take it before it is committed alone.
LAZY_COMMIT_DELAY = 0.25


@dataclasses.dataclass(slots=True)
class Entry:
    """What a run's journal holds at one position.

    Attributes:
        op: The operation's kind (``"step"``, ``"workflow"``, ``"patch"``...).
        name: The operation's name (the step's name).
        intent: The data of its latest ``intent`` row.
        outcome: The data of its ``outcome`` row (None: not finished, or in doubt).
        starts: How many attempts started (``intent`` rows).
        failures: The failed attempts that were retried (``attempt`` rows' data).
        rerun: Its recorded outcome is an error a failed run stopped on, to run again.
    """

    op: str
    name: str
    intent: dict[str, Any]
    outcome: dict[str, Any] | None = None
    starts: int = 1
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rerun: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """What an operation's function is told about the call it makes.

    Attributes:
        key: The key of the run the operation belongs to.
        position: Its position in the run (``"3"``, ``"5.0.1"``).
        name: The operation's name.
        attempt: 1 for the first attempt, then 2, 3... (retries and re-runs after a crash).
        idempotency_key: The same for every attempt of this call in this run of the key
            (a resume included); another run of the key (a fresh start, a retry's rewind,
            a fork) gets another one.
        note: The ``note`` the first attempt recorded in its intent (a timer's wake time),
            or the one this attempt records.
    """

    key: str
    position: str
    name: str
    attempt: int
    idempotency_key: str
    note: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """What an operation's function may return instead of a bare JSON value: the value to
    record, what the caller gets back, and records committed in the same transaction as
    the outcome (the rows and ``writes=`` of :meth:`OwnedRun.commit`).

    Attributes:
        data: The JSON value recorded as the outcome (replayed on resume).
        value: What the operation returns now (default: ``data``).
        rows: More journal rows of this run, ``(kind, name, json_data)``.
        writes: Store values, ``(key, json_value)``.
        extras: The run's timers, messages consumed, events and stream values
            (:class:`~stepstone.store._extras.ExtraWrites`), written with the outcome.
        summary: A small JSON dict kept beside the outcome for people (a model turn's
            model, tokens, cost and tool calls), shown by ``stepstone show`` and the
            inspector; never replayed.
    """

    data: Any
    value: Any = dataclasses.field(default=None)
    rows: Sequence[Row] = ()
    writes: Sequence[tuple[str, Any]] = ()
    has_value: bool = False
    extras: ExtraWrites | None = None
    summary: dict[str, Any] | None = None

    @classmethod
    def of(cls, data: Any, value: Any, **extra: Any) -> Outcome:
        """An outcome recording ``data`` whose caller gets ``value``."""
        return cls(data=data, value=value, has_value=True, **extra)


class _Cursor:
    """Where the next operation of one asyncio task goes (replaced, never changed, so a
    task created meanwhile keeps the count its creator had then)."""

    __slots__ = ("journal", "n", "prefix", "task")

    def __init__(self, journal: OperationJournal, task: object, prefix: str, n: int) -> None:
        self.journal = journal
        self.task = task
        self.prefix = prefix
        self.n = n


_cursor: contextvars.ContextVar[_Cursor | None] = contextvars.ContextVar(
    "stepstone_operation_cursor", default=None
)

#: ``found=`` not given (:meth:`OperationJournal.operation` looks the position up itself).
_UNSET: Any = object()

#: The context of the journal's own background commits: outside every run's scope.
_BARE = contextvars.Context()


def current_journal() -> OperationJournal | None:
    """The operation journal of the durable run the calling code is in (a workflow's body,
    or a task it started), or None (outside one, or inside one of its steps, where an
    operation is a plain call)."""
    scope = current_scope()
    return None if scope is None else scope.journal


async def journaled(
    op: str,
    name: str,
    input: Any,
    invoke: Callable[[Call], Awaitable[Any]],
    **options: Any,
) -> Any:
    """Record ``invoke`` as the next operation of the current durable run (see
    :meth:`OperationJournal.operation` for the arguments); outside one, just call it.

    Raises:
        RuntimeError: called outside a durable run with ``outside="refuse"``.
    """
    journal = current_journal()
    if journal is None:
        if options.get("outside") == "refuse":
            raise RuntimeError(f"{op} {name!r} can only be called inside a workflow")
        result = await invoke(Call(key="", position="", name=name, attempt=1, idempotency_key=""))
        if isinstance(result, Outcome):
            return result.value if result.has_value else result.data
        return result
    options.pop("outside", None)
    return await journal.operation(op, name, input, invoke, **options)


def error_data(exc: BaseException) -> dict[str, Any]:
    """An exception as the JSON an outcome records: its class (``module:QualName``), its
    text and, when the codec can hold them, its arguments (to rebuild it on replay)."""
    cls = type(exc)
    data: dict[str, Any] = {"type": f"{cls.__module__}:{cls.__qualname__}", "message": str(exc)}
    try:
        data["args"] = to_typed_json(list(exc.args), strict=True)
    except (SerializationError, TypeError, ValueError):
        pass
    return data


def rebuild_error(data: Any) -> BaseException:
    """The exception an outcome recorded (:func:`error_data`): of its class, rebuilt from
    its arguments, when the class can be imported and rebuilt to the same text; else a
    :class:`ReplayedStepError` with the class's name and the text."""
    if not isinstance(data, dict):
        return ReplayedStepError(repr(data), "unknown")
    type_path, message = str(data.get("type", "Exception")), str(data.get("message", ""))
    args = data.get("args")
    module, _, qualname = type_path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type) and issubclass(obj, Exception) and isinstance(args, list):
            exc = obj(*from_typed_json(args))
            if str(exc) == message:
                return exc
    except Exception:  # noqa: BLE001 - any failure to rebuild falls back to the text
        pass
    return ReplayedStepError(message, type_path)


def _corrupt(key: str, what: str) -> WorkflowCorruptError:
    return WorkflowCorruptError(
        f"run {key!r}: {what}. Nothing was run again. Inspect it with `stepstone show {key}`, "
        f"rewind it with `stepstone retry {key} --from POSITION`, or start a new run under "
        "another key"
    )


def load_entries(
    key: str, rows: Sequence[JournalRow], rerun: Sequence[str] = ()
) -> tuple[dict[str, Entry], list[tuple[JournalRow, Any]]]:
    """A run's journal decoded: the entries by position, and the other rows (decoded) for
    the engine. ``rerun``: positions whose recorded error ended a failed run, to run
    again.

    Raises:
        WorkflowCorruptError: a row is not valid JSON, an ``ops`` row is not a list of
            ``[kind, position, data]`` records, or a record lacks its fields or comes
            without its intent.
    """
    with _collector_paused():
        return _load(key, rows, rerun)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a journal is decoded: the decoded
    rows are tens of thousands of new objects that live on, and on every few hundred of
    them the collector would walk all that were made before (measured: two thirds of the
    time a 10,000-step journal took to decode). Nothing decoded here holds a cycle."""
    pause_collector()
    try:
        yield
    finally:
        resume_collector()


class _Collector:
    """Pauses of the cyclic garbage collector, counted (runs resumed at once each hold one
    until they reach their first new operation); it runs again when the last one ends, if
    it ran before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pauses = 0
        self.was_enabled = False


_collector = _Collector()


def pause_collector() -> None:
    """Pause the cyclic garbage collector (see :class:`_Collector`)."""
    with _collector.lock:
        if _collector.pauses == 0:
            _collector.was_enabled = gc.isenabled()
            gc.disable()
        _collector.pauses += 1


def resume_collector() -> None:
    """End one :func:`pause_collector`."""
    with _collector.lock:
        _collector.pauses -= 1
        if _collector.pauses == 0 and _collector.was_enabled:
            gc.enable()


_DECODER = json.JSONDecoder()


def _load(
    key: str, rows: Sequence[JournalRow], rerun: Sequence[str]
) -> tuple[dict[str, Entry], list[tuple[JournalRow, Any]]]:
    entries: dict[str, Entry] = {}
    others: list[tuple[JournalRow, Any]] = []
    loads = _DECODER.decode  # json.loads without its per-call checks (the rows are text)
    for row in rows:
        try:
            data = loads(row.data)
        except ValueError as exc:
            raise _corrupt(
                key, f"journal row {row.seq} ({row.kind}) is not valid JSON: {exc}"
            ) from None
        if row.kind != OPS:
            if type(data) is not dict:
                raise _corrupt(key, f"journal row {row.seq} ({row.kind}) is not a JSON object")
            others.append((row, data))
            continue
        if type(data) is not list:
            raise _corrupt(key, f"journal row {row.seq} (ops) is not a list of records")
        for record in data:
            if (
                type(record) is not list
                or len(record) != 3
                or type(record[1]) is not str
                or type(record[2]) is not dict
            ):
                raise _corrupt(key, f"journal row {row.seq} (ops) holds a damaged record")
            kind, pos, rec = record
            # The two usual records, applied here (a long journal holds one of each per
            # step); anything else goes through _apply, which checks and names it.
            if kind == "outcome":
                entry = entries.get(pos)
                if entry is not None and ("value" in rec or "error" in rec):
                    entry.outcome = rec
                    continue
            elif kind == "intent" and pos not in entries:
                op, name = rec.get("op"), rec.get("name")
                if type(op) is str and type(name) is str:
                    entries[pos] = Entry(op, name, rec)
                    continue
            _apply(key, entries, row.seq, kind, pos, rec)
    for pos in rerun:
        entry = entries.get(pos)
        if entry is not None and entry.outcome is not None and "error" in entry.outcome:
            entry.outcome, entry.rerun = None, True
    return entries, others


def _apply(
    key: str, entries: dict[str, Entry], seq: int, kind: Any, pos: str, data: dict[str, Any]
) -> None:
    """Apply one record (``intent``, ``outcome`` or ``attempt`` at ``pos``) of row ``seq``."""
    if kind == "intent":
        op, name = data.get("op"), data.get("name")
        if not isinstance(op, str) or not isinstance(name, str):
            raise _corrupt(key, f"journal row {seq}: the intent at {pos!r} lacks its op or name")
        entry = entries.get(pos)
        if entry is None:
            entries[pos] = Entry(op, name, data)
        else:  # another attempt: a re-run after a crash, or of a failed run's step
            entry.intent, entry.outcome, entry.starts = data, None, entry.starts + 1
            entry.rerun = False
        return
    entry = entries.get(pos)
    if entry is None or kind not in ("outcome", "attempt"):
        what = f"an {kind} record" if kind in ("outcome", "attempt") else f"a {kind!r} record"
        raise _corrupt(key, f"journal row {seq}: {what} at {pos!r} has no intent")
    if kind == "outcome":
        if "value" not in data and "error" not in data:
            raise _corrupt(key, f"journal row {seq}: the outcome at {pos!r} has no value")
        entry.outcome = data
    elif "cancelled" in data:  # a cancel stopped the run before the call started
        entry.rerun, entry.starts = True, entry.starts - 1
    else:
        entry.failures.append(data)


class OperationJournal:
    """The operations of one owned run: positions, replay, and the commits that record them.

    Args:
        run: The owned kernel run.
        entries: What its journal recorded (:func:`load_entries`), by position.
        what: How to name the run in messages (``"workflow 'checkout'"``).
        iteration: Operations finished before this claim (the head's ``iteration``).
    """

    def __init__(
        self,
        run: OwnedRun,
        entries: dict[str, Entry] | None = None,
        *,
        what: str = "run",
        iteration: int = 0,
    ) -> None:
        self.run = run
        self.key = run.key
        self.store = run.store
        self.what = what
        self.entries: dict[str, Entry] = entries if entries is not None else {}
        self.replayed = 0
        self.done = iteration  # operations finished (the head's iteration)
        self.raised: list[tuple[BaseException, str]] = []  # recorded errors, where raised
        self._branches: dict[str, int] = {}
        self._rows: list[Row] = []  # operation records, committed as one ops row
        self._extra: list[Row] = []  # rows of their own (an Outcome's)
        self._writes: list[tuple[str, Any]] = []
        self._extras: list[ExtraWrites] = []
        self._appended = 0
        self._committed = 0
        self._flushing = False
        self._waiters: list[asyncio.Future[None]] = []
        self._scheduled = False
        self._lazy: asyncio.TimerHandle | None = None
        self._late: asyncio.Task[None] | None = None
        self._lost: BaseException | None = None
        self._next_step: str | None = run.head.next_step
        self.closed = False
        self._paused = False  # holds a collector pause while it replays

    def pause_while_replaying(self) -> None:
        """Pause the cyclic garbage collector until the body reaches its first operation
        with nothing recorded (or ends): a replay makes few cycles, while the collector,
        walking the decoded journal over and over, costs a tenth of a long replay."""
        if not self._paused and self.entries:
            pause_collector()
            self._paused = True

    def end_replay(self) -> None:
        """Resume the collector paused by :meth:`pause_while_replaying`."""
        if self._paused:
            self._paused = False
            resume_collector()

    # -- positions -----------------------------------------------------------------------
    def enter(self) -> contextvars.Token[_Cursor | None]:
        """Start numbering the operations of the calling task (the body's) at ``0``;
        reset with the token when the body returns."""
        return _cursor.set(_Cursor(self, asyncio.current_task(), "", 0))

    def leave(self, token: contextvars.Token[_Cursor | None]) -> None:
        """Stop numbering (the body returned): undo :meth:`enter`."""
        _cursor.reset(token)

    def position(self, *, consume: bool = True) -> str:
        """The position of the calling task's next operation (taken, unless ``consume`` is
        False: what :func:`stepstone.patched` asks before it decides)."""
        cur = _cursor.get()
        task = asyncio.current_task()
        if cur is None or cur.journal is not self:
            raise RuntimeError(
                f"{self.what}: an operation was called from code its body did not start"
            )
        if cur.task is not task:  # the first operation of a task the body started
            base = f"{cur.prefix}{cur.n}."
            k = self._branches.get(base, 0)
            if consume:
                self._branches[base] = k + 1
            cur = _Cursor(self, task, f"{base}{k}.", 0)
            if consume:
                _cursor.set(cur)
        pos = f"{cur.prefix}{cur.n}"
        if consume:
            _cursor.set(_Cursor(self, task, cur.prefix, cur.n + 1))
        return pos

    # -- replay --------------------------------------------------------------------------
    def check(self, pos: str, op: str, name: str, args: Any, *, check_args: bool) -> Entry | None:
        """The entry recorded at ``pos`` for this call, or None (nothing recorded there).

        Raises:
            NonDeterministicWorkflowError: another operation, or (with ``check_args``)
                other arguments, were recorded at ``pos``.
        """
        entry = self.entries.get(pos)
        if entry is None:
            return None
        if entry.op != op or entry.name != name:
            raise NonDeterministicWorkflowError(
                f"{self.what} (key {self.key!r}) called {op} {name!r} at position {pos}, "
                f"where its journal recorded {entry.op} {entry.name!r}: the code changed "
                "under a run that had passed this point. Guard the change with "
                'stepstone.patched("<id>") (old runs keep the old path), or run it under a '
                "new key"
            )
        if check_args and entry.intent.get("args") != args:
            raise NonDeterministicWorkflowError(
                f"{self.what} (key {self.key!r}) called {op} {name!r} at position {pos} with "
                f"other arguments than its journal recorded ({_short(args)} now, "
                f"{_short(entry.intent.get('args'))} then). Make the arguments the same on "
                "every run (compute changing values inside a step), declare the step "
                "with @step(args_may_change=True), guard the change with "
                'stepstone.patched("<id>"), or run it under a new key'
            )
        return entry

    def lookup(
        self, op: str, name: str, args: Any, *, check_args: bool = True
    ) -> tuple[str, Entry | None]:
        """Take the next position and check what is recorded there (:meth:`check`): a
        caller replays a recorded outcome itself (:meth:`recorded_value`, no coroutine of
        :meth:`operation` needed) and passes ``position=`` and ``found=`` otherwise."""
        pos = self.position()
        return pos, self.check(pos, op, name, args, check_args=check_args)

    def recorded_value(self, entry: Entry, decode: Callable[[Any], Any]) -> Any:
        """Replay ``entry``'s outcome: its value, decoded, or its error raised."""
        outcome = entry.outcome
        assert outcome is not None
        self.replayed += 1
        if "error" in outcome:
            raise rebuild_error(outcome["error"])
        return decode(outcome["value"])

    # -- buffering and commits -----------------------------------------------------------
    def add(self, kind: str, pos: str, data: Any) -> int:
        """Buffer one record (``intent``, ``outcome``, ``attempt``) at ``pos``; returns the
        mark :meth:`commit` waits for."""
        self._rows.append((kind, pos, data))
        self._appended += 1
        return self._appended

    def add_row(self, kind: str, name: str | None, data: Any) -> int:
        """Buffer a journal row of its own, committed with the next records."""
        self._extra.append((kind, name, data))
        self._appended += 1
        return self._appended

    def add_writes(self, writes: Sequence[tuple[str, Any]]) -> None:
        """Buffer ``writes=`` values for the next commit."""
        self._writes.extend(writes)

    def add_extras(self, extras: ExtraWrites) -> int:
        """Buffer the run's timers, consumed messages, events or stream values for the next
        commit (an event set by the body goes with the next step's commit); returns the
        mark :meth:`commit` waits for."""
        self._extras.append(extras)
        self._appended += 1
        return self._appended

    def soon(self, delay: float = 0.0) -> None:
        """Commit what is buffered within a turn of the event loop (or, with ``delay``,
        within that many seconds), unless an operation's commit takes it first (the usual
        case: the next step's intent)."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        if delay <= 0:
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._commit_late)
        elif self._lazy is None and not self._scheduled:
            self._lazy = loop.call_later(delay, self._commit_lazily)

    def _commit_late(self) -> None:
        self._scheduled = False
        self._start_late()

    def _commit_lazily(self) -> None:
        self._lazy = None
        self._start_late()

    def _start_late(self) -> None:
        pending = self._rows or self._extra or self._writes or self._extras
        if pending and not self._flushing and self._late is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._late = loop.create_task(self._flush_quietly(), context=_BARE.copy())

    def _drop_lazy(self) -> None:
        if self._lazy is not None:
            self._lazy.cancel()
            self._lazy = None

    async def _flush_quietly(self) -> None:
        try:
            await self.commit()
        except Exception:  # the rows stay buffered: the next commit takes them
            log.debug("stepstone: a background commit of %r failed", self.key, exc_info=True)
        finally:
            self._late = None

    async def commit(self, upto: int | None = None) -> None:
        """Wait until the rows buffered so far (the first ``upto`` ever buffered) are
        committed, committing them (with whatever else is buffered) if no commit in flight
        already took them.

        Raises:
            ConcurrentRunError: the run lost its ownership; nothing more is written.
        """
        mark = self._appended if upto is None else upto
        if self._committed >= mark:
            return
        if not self._flushing and not may_block_loop():
            await asyncio.sleep(0)  # let operations started in the same tick join in
        while self._committed < mark:
            if self._lost is not None:
                raise self._lost
            if self._flushing:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            await self._flush("running")

    async def commit_now(self) -> None:
        """Commit now, even with nothing buffered: a wait that found its run's cancel
        requested lets the kernel's commit record the cancel (the run ``failed``), which
        raises :class:`RunCancelledError` and ends the journal's writes.

        Raises:
            RunCancelledError: the run was cancelled.
            ConcurrentRunError: the run lost its ownership; nothing more is written.
        """
        while self._flushing:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        if self._lost is not None:
            raise self._lost
        await self._flush(self.run.head.status)

    async def _flush(
        self, status: str, rows: Sequence[Row] = (), meta: dict[str, Any] | None = None
    ) -> None:
        taken, extra, writes, extras = self._rows, self._extra, self._writes, self._extras
        self._rows, self._extra, self._writes, self._extras = [], [], [], []
        mark = self._appended
        self._flushing = True
        # This commit takes what a lazy commit was waiting for: a row buffered from now on
        # waits its own LAZY_COMMIT_DELAY (a timer armed by an earlier row would commit it
        # alone, early, in the middle of the next turn of a tool loop).
        self._drop_lazy()
        ops: list[Row] = []
        if taken:
            ops.append((OPS, taken[0][1], [[kind, pos, data] for kind, pos, data in taken]))
        try:
            await self.run.commit(
                status=status,
                next_step=self._next_step if status in ("running", "paused") else None,
                iteration=self.done,
                meta=meta,
                rows=[*ops, *extra, *rows],
                writes=writes,
                extras=_merged(extras),
            )
        except RunCancelledError as exc:
            # An operator's cancel: the kernel committed these rows with the run marked
            # failed. Intents among them never ran: say so, or a resume would take their
            # calls for ones cut short by a crash (in doubt).
            self._committed = max(self._committed, mark)
            self._lost = exc
            await self._not_started(taken, str(exc))
            raise
        except BaseException as exc:
            if isinstance(exc, ConcurrentRunError) or not isinstance(exc, Exception):
                self._lost = self._lost or exc  # nothing more may be written
            self._rows[:0], self._extra[:0], self._writes[:0] = taken, extra, writes
            self._extras[:0] = extras
            raise
        else:
            self._committed = max(self._committed, mark)
        finally:
            self._flushing = False
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _not_started(self, rows: Sequence[Row], why: str) -> None:
        finished = {pos for kind, pos, _ in rows if kind == "outcome"}
        marks: list[list[Any]] = []
        for kind, pos, data in rows:
            if kind == "intent" and pos not in finished and pos is not None:
                entry = self.entries.get(pos)
                if entry is not None:
                    entry.rerun = True
                note = {"op": data["op"], "name": data["name"], "cancelled": why}
                marks.append(["attempt", pos, note])
        if not marks:
            return
        try:
            row = (OPS, marks[0][1], marks)
            await self.run.commit(status=self.run.head.status, next_step=None, rows=[row])
        except Exception:  # noqa: BLE001 - the intents stay, read as in doubt
            log.warning("stepstone: noting the calls a cancel stopped in %r failed", self.key)

    async def finish(
        self, status: str, rows: Sequence[Row] = (), meta: dict[str, Any] | None = None
    ) -> None:
        """The run's last commit: what is buffered, ``rows``, the terminal ``status`` and
        ``meta`` (waits for a commit in flight first)."""
        self.closed = True
        self._drop_lazy()
        while self._flushing:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        if self._lost is not None:
            raise self._lost
        await self._flush(status, rows, meta)

    async def settle(self) -> None:
        """Commit what is buffered (a run stopping without a verdict: cancelled, or its
        process shutting down), best effort."""
        self.closed = True
        self._drop_lazy()
        try:
            await self.commit()
        except BaseException:  # noqa: BLE001 - what is not committed runs again on resume
            log.debug("stepstone: committing the last outcomes of %r failed", self.key)

    # -- operations ----------------------------------------------------------------------
    async def operation(
        self,
        op: str,
        name: str,
        args: Any,
        invoke: Callable[[Call], Awaitable[Any]],
        *,
        in_doubt: InDoubt = "rerun",
        check_args: bool = True,
        retries: int = 0,
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
        note: Any = None,
        wait: bool = False,
        decode: Callable[[Any], Any] | None = None,
        position: str | None = None,
        found: Entry | object | None = _UNSET,
        describe: Callable[[], dict[str, Any]] | None = None,
        lazy: bool = False,
    ) -> Any:
        """Run (or replay) the next operation of the calling task.

        Args:
            op: The operation's kind (``"step"``, ``"workflow"``, ``"sleep"``...).
            name: Its name (a step's name); with ``op``, what a replay checks.
            args: Its input as a JSON value (typed JSON), recorded in the intent; a replay
                checks it is the same, unless ``check_args`` is False.
            invoke: Runs the operation; returns its outcome as a JSON value, or an
                :class:`Outcome` (the value to record, what to return, rows and
                ``writes=`` committed with it). An exception is recorded as its error.
            in_doubt: What a resumed run does with this call when it started before a crash
                and recorded no outcome: ``"rerun"`` it, or ``"fail"``
                (:class:`EffectInDoubtError`).
            retries: Attempts after the first when ``invoke`` raises; each failed attempt
                is recorded. The delay doubles from ``retry_delay`` (at most
                ``max_retry_delay``), jittered down by up to half.
            note: JSON kept in the intent, not checked on replay; a re-run after a crash
                sees the first attempt's (:attr:`Call.note`).
            wait: Return only once the outcome is committed (else it is committed with the
                next operation's intent, or within a turn of the loop).
            decode: Turns a recorded value back into what the caller gets.
            position: Use this position (taken with :meth:`position`) instead of the next.
            found: What :meth:`lookup` found at ``position`` (the check is not made again).
            describe: More fields for the intent row (what a view shows).
            lazy: Leave a value outcome for the next operation's commit for up to
                :data:`LAZY_COMMIT_DELAY` seconds before committing it alone (code that
                makes many operations with a little work between them, such as an agent
                framework's tool loop, then pays one commit per operation).

        Returns:
            The value (``invoke``'s, or the recorded one decoded).

        Raises:
            NonDeterministicWorkflowError: see :meth:`check`.
            EffectInDoubtError: in doubt and ``in_doubt="fail"``.
            Exception: the operation's error (recorded), or the recorded one replayed.
        """
        if self.closed:
            raise self._ended(op, name)
        if found is _UNSET:
            pos = self.position() if position is None else position
            entry = self.check(pos, op, name, args, check_args=check_args)
        else:
            assert position is not None
            pos, entry = position, found  # type: ignore[assignment]
        if entry is not None and entry.outcome is not None:
            return self.recorded_value(entry, decode or _same)
        if self._paused:
            self.end_replay()  # the first operation past what the journal recorded
        attempt = 1
        if entry is not None:  # started before: in doubt, or a failed run's error
            attempt, note = self._again(entry, pos, op, name, in_doubt, note)
        intent = self._intent(pos, entry, op, name, args, attempt, note, in_doubt, describe)
        self._next_step = f"{pos} {name}"
        await self.commit(self.add("intent", pos, intent))
        return await self._attempts(
            pos, op, name, invoke, attempt, note, retries, retry_delay, max_retry_delay, wait, lazy
        )

    def _ended(self, op: str, name: str) -> RuntimeError:
        return RuntimeError(
            f"{self.what} (key {self.key!r}) has ended: {op} {name!r} was called from a "
            "task it started and did not wait for; await every task the body starts"
        )

    def _again(
        self, entry: Entry, pos: str, op: str, name: str, in_doubt: InDoubt, note: Any
    ) -> tuple[int, Any]:
        """An operation that started before (in doubt, or a failed run's error) runs again:
        its attempt number and note (the first attempt's)."""
        if not entry.rerun and in_doubt == "fail":
            raise EffectInDoubtError(
                f"{self.what} (key {self.key!r}): {op} {name!r} at position {pos} started "
                "before a crash and has no recorded outcome; it declares in_doubt='fail', "
                "so it is not run again. Check the external system for its effect, then "
                f"settle it (record its outcome) or start a new run (or declare "
                "in_doubt='rerun' if the call is idempotent)"
            )
        log.info("stepstone: %s %r at %s of %r runs again", op, name, pos, self.key)
        return entry.starts + len(entry.failures) + 1, entry.intent.get("note", note)

    def _intent(
        self,
        pos: str,
        entry: Entry | None,
        op: str,
        name: str,
        args: Any,
        attempt: int,
        note: Any,
        in_doubt: InDoubt,
        describe: Callable[[], dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """An operation's intent row (its keys in this order: the journal's format), set
        as its entry's (a new entry, or the one that runs again)."""
        intent: dict[str, Any] = {"op": op, "name": name, "args": args}
        intent["input_hash"] = hash_json(args)
        if attempt > 1:
            intent["attempt"] = attempt
        if note is not None:
            intent["note"] = note
        if in_doubt != "rerun":
            intent["in_doubt"] = in_doubt
        intent["at"] = round(time.time(), 3)
        if describe is not None:
            intent.update(describe())
        if entry is None:
            self.entries[pos] = Entry(op, name, intent)
        else:
            entry.intent, entry.starts, entry.rerun = intent, entry.starts + 1, False
        return intent

    async def _attempts(
        self,
        pos: str,
        op: str,
        name: str,
        invoke: Callable[[Call], Awaitable[Any]],
        attempt: int,
        note: Any,
        retries: int,
        retry_delay: float,
        max_retry_delay: float,
        wait: bool,
        lazy: bool = False,
    ) -> Any:
        idem = self.run.derived_key(f"{pos}:{name}")
        failed = 0
        while True:
            started = time.perf_counter()
            call = Call(self.key, pos, name, attempt, idem, note)
            try:
                result = await invoke(call)
            except Exception as exc:
                ms = round((time.perf_counter() - started) * 1000, 3)
                if failed < retries:
                    failed += 1
                    self.add(
                        "attempt", pos, {"attempt": attempt, "error": error_data(exc), "ms": ms}
                    )
                    self.soon()
                    delay = min(max_retry_delay, retry_delay * 2 ** (failed - 1))
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                    attempt += 1
                    continue
                self._record(pos, op, name, {"error": error_data(exc)}, attempt, ms, (), ())
                if wait:
                    await self.commit()
                else:
                    self.soon()
                self.raised.append((exc, pos))
                raise
            ms = round((time.perf_counter() - started) * 1000, 3)
            extras = None
            recorded: dict[str, Any]
            if isinstance(result, Outcome):
                data, rows, writes = result.data, result.rows, result.writes
                value = result.value if result.has_value else data
                extras = result.extras or None
                recorded = {"value": data}
                if result.summary:
                    recorded["summary"] = result.summary
            else:
                data, value, rows, writes = result, result, (), ()
                recorded = {"value": data}
            self._record(pos, op, name, recorded, attempt, ms, rows, writes)
            if extras is not None:
                self.add_extras(extras)
            if wait or rows or writes or extras is not None:
                await self.commit()
            else:
                self.soon(LAZY_COMMIT_DELAY if lazy else 0.0)
            return value

    def _record(
        self,
        pos: str,
        op: str,
        name: str,
        outcome: dict[str, Any],
        attempt: int,
        ms: float,
        rows: Sequence[Row],
        writes: Sequence[tuple[str, Any]],
    ) -> None:
        outcome["op"], outcome["name"], outcome["ms"] = op, name, ms
        if attempt > 1:
            outcome["attempt"] = attempt
        self.entries[pos].outcome = outcome
        self.done += 1
        self.add("outcome", pos, outcome)
        for row in rows:
            self.add_row(*row)
        if writes:
            self.add_writes(writes)

    def instant(
        self, pos: str, op: str, name: str, value: Any, extras: ExtraWrites | None = None
    ) -> int:
        """Record at ``pos`` an operation whose whole effect is the commit that records it
        (an event set, a stream value written: ``extras``): its intent and outcome at once,
        buffered with ``extras``; returns the mark :meth:`commit` waits for."""
        intent = {"op": op, "name": name, "args": None, "at": round(time.time(), 3)}
        outcome = {"op": op, "name": name, "value": value}
        self.entries[pos] = Entry(op, name, intent, outcome)
        self.done += 1
        self.add("intent", pos, intent)
        mark = self.add("outcome", pos, outcome)
        if extras:
            mark = self.add_extras(extras)
        return mark

    def conclude(
        self, pos: str, entry: Entry, value: Any, extras: ExtraWrites | None = None
    ) -> int:
        """Record the outcome of the operation at ``pos`` whose intent an earlier attempt
        committed (``entry``, found with :meth:`lookup`, no outcome yet) without running it
        again: for an operation whose work is already over when the run comes back to it
        (a sleep past its wake time, a message waiting for a receive). The outcome (with
        ``extras``) is buffered; returns the mark :meth:`commit` waits for. The caller
        commits it, or leaves it for the next commit when a crash before then may safely
        find the intent again and do the same."""
        self.end_replay()  # the first operation past what the journal recorded
        outcome: dict[str, Any] = {"op": entry.op, "name": entry.name, "value": value, "ms": 0.0}
        entry.outcome = outcome
        self.done += 1
        mark = self.add("outcome", pos, outcome)
        if extras:
            mark = self.add_extras(extras)
        return mark

    def record_done(
        self,
        pos: str,
        op: str,
        name: str,
        args: Any,
        value: Any,
        *,
        ms: float = 0.0,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """Record at ``pos`` (taken with :meth:`lookup`) an operation that already ran,
        without committing its intent first: its intent and outcome are buffered and
        committed with the next operation's intent (or within a turn of the loop). For
        calls a crash may safely repeat (a read, a validation, an event handed to a
        handler, a model answer): a crash before that commit runs them again on resume.
        Committed with the next operation, or alone after :data:`LAZY_COMMIT_DELAY`."""
        intent: dict[str, Any] = {"op": op, "name": name, "args": args}
        intent["at"] = round(time.time(), 3)
        outcome: dict[str, Any] = {"op": op, "name": name, "value": value, "ms": ms}
        if summary:
            outcome["summary"] = summary
        self.entries[pos] = Entry(op, name, intent, outcome)
        self.done += 1
        self.add("intent", pos, intent)
        self.add("outcome", pos, outcome)
        self.soon(LAZY_COMMIT_DELAY)

    def scope(self, key: str) -> DurableScope:
        """The durable scope the body runs in: LLM loops started in it take a position of
        their own (:meth:`loop_key`)."""
        return DurableScope(store=self.store, key=key, journal=self)

    def loop_key(self) -> str:
        """The run key of an LLM loop (an ``Agent`` call) started in the body: a position
        of its own, recorded, so a resume finds the same loop at the same place."""
        return self.child_key("agent", "llm", lambda pos: self.run.derived_key(f"{pos}:llm"))

    def child_key(self, op: str, name: str, make: Callable[[str], str] | None = None) -> str:
        """The key of a durable run of another engine started in the body (an agent loop,
        a Plan): the next position, recorded with the key (``make(position)``, by default
        ``"<this run's key>/<position>"``), so a resume finds the same run at the same
        place; that run resumes itself."""
        pos = self.position()
        entry = self.check(pos, op, name, None, check_args=False)
        if entry is not None and isinstance(entry.intent.get("key"), str):
            self.replayed += 1
            return str(entry.intent["key"])
        key = make(pos) if make is not None else f"{self.key}/{pos}"
        intent: dict[str, Any] = {"op": op, "name": name, "args": None, "key": key}
        intent["at"] = round(time.time(), 3)
        outcome = {"op": op, "name": name, "value": key}
        self.entries[pos] = Entry(op, name, intent, outcome)
        self.add("intent", pos, intent)
        self.add("outcome", pos, outcome)
        self.soon()
        return key


def _merged(extras: list[ExtraWrites]) -> ExtraWrites | None:
    """The extra records of several operations as one commit's (in order)."""
    if not extras:
        return None
    if len(extras) == 1:
        return extras[0]
    return ExtraWrites(
        consume=tuple(c for e in extras for c in e.consume),
        events=tuple(v for e in extras for v in e.events),
        stream=tuple(v for e in extras for v in e.stream),
        timers=tuple(v for e in extras for v in e.timers),
        clear_timers=tuple(v for e in extras for v in e.clear_timers),
    )


def _same(value: Any) -> Any:
    return value


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def operation_rows(head: RunHead, rows: list[JournalRow]) -> list[dict[str, Any]]:
    """One entry per operation of the run, in position order: its position, kind and name,
    status (``done``, ``failed``, ``running``, ``in doubt``), arguments, value or error (as
    plain JSON), attempts, start time and duration in milliseconds.

    Raises:
        ValueError: a row cannot be decoded (the store reports the run as corrupt).
    """
    try:
        entries, _ = load_entries(head.key, rows)
    except WorkflowCorruptError as exc:
        raise ValueError(str(exc)) from None
    return [_operation_row(pos, entry, head.status) for pos, entry in iter_positions(entries)]


def _operation_state(entry: Entry, run_status: str) -> str:
    """What an operation's row in a listing says of it (``run_status``: its run's)."""
    outcome = entry.outcome
    if outcome is None and entry.rerun:
        return "not run"  # a cancel (or a failed run's rewind) stopped it before it ran
    if outcome is None:
        return "running" if run_status in ("claimed", "running") else "in doubt"
    return "failed" if "error" in outcome else "done"


def _operation_row(pos: str, entry: Entry, run_status: str) -> dict[str, Any]:
    """One operation of :func:`operation_rows`."""
    outcome = entry.outcome
    item: dict[str, Any] = {
        "position": pos,
        "op": entry.op,
        "name": entry.name,
        "status": _operation_state(entry, run_status),
        "args": untag(entry.intent.get("args")),
        "attempts": entry.starts + len(entry.failures),
        "started_at": entry.intent.get("at"),
        "ms": None if outcome is None else outcome.get("ms"),
    }
    if outcome is not None and "value" in outcome:
        item["value"] = untag(outcome["value"])
    if outcome is not None and "error" in outcome:
        item["error"] = outcome["error"]
    if outcome is not None and isinstance(outcome.get("summary"), dict):
        item["summary"] = outcome["summary"]
    if entry.failures:
        item["failed_attempts"] = entry.failures
    for extra in ("key", "in_doubt"):
        if extra in entry.intent:
            item[extra] = entry.intent[extra]
    return item


def find_position(key: str, entries: dict[str, Entry], spec: str) -> str:
    """The position ``spec`` names in a run: a position (``"3"``, ``"1.0.0"``), a position
    and its name (``"3 charge"``, as ``stepstone history`` shows them), or a step's name
    (its last call, in position order).

    Raises:
        KeyError: no operation of the run is named so (the message lists them).
    """
    if spec in entries:
        return spec
    pos, _, name = spec.partition(" ")
    if name and pos in entries and entries[pos].name == name:
        return pos
    named = [p for p, entry in iter_positions(entries) if entry.name == spec]
    if named:
        return named[-1]
    shown = ", ".join(f"{p} {e.name}" for p, e in iter_positions(entries))
    raise KeyError(f"run {key!r} has no step {spec!r} (its steps: {shown or 'none'})")


def cut_rows(
    key: str, rows: Sequence[JournalRow], spec: str, *, keep_it: bool
) -> tuple[list[JournalRow], str, str]:
    """The rows of a run that a rewind keeps: every row but those of the operation
    ``spec`` names (kept when ``keep_it``) and of every operation after it in position
    order, and but its result row; renumbered from 0. Returns them with the position and
    the name of that operation.

    Raises:
        KeyError: see :func:`find_position`.
        WorkflowCorruptError: a row does not decode.
    """
    entries, _ = load_entries(key, rows)
    pos = find_position(key, entries, spec)
    bound = _order(pos)
    kept: list[JournalRow] = []
    for row in rows:
        if row.kind == "result":
            continue
        if row.kind == OPS:
            records = [
                r
                for r in json.loads(row.data)
                if _order(r[1]) < bound or (keep_it and _order(r[1]) == bound)
            ]
            if not records:
                continue
            text = json.dumps(records, ensure_ascii=False, separators=(",", ":"))
            kept.append(JournalRow(len(kept), OPS, records[0][1], text))
            continue
        kept.append(JournalRow(len(kept), row.kind, row.name, row.data))
    return kept, pos, entries[pos].name


def settle_operation(
    store: Store, key: str, step: str, *, happened: bool, value: Any = None
) -> RunHead:
    """Settle a workflow step left in doubt (``in_doubt="fail"``): an operator records what
    the call did, and the run goes on from there at its next resume.

    Args:
        store: The run's store.
        key: The run's key.
        step: The step (a position, ``"<position> <name>"`` or a step name).
        happened: True: it took effect and returned ``value`` (replayed as its result);
            False: it did not (the resume runs it as a new call).
        value: Its result when it happened (a JSON value, or one the typed codec holds).

    Returns:
        The run's head, ``paused`` when the run had stopped on that step (``failed``).

    Raises:
        KeyError: no run under ``key``, or no such step.
        UserError: the run is not a workflow run, is live, or the step is not in doubt.
    """
    from stepstone.durable._records import read_run
    from stepstone.exceptions import UserError

    found = read_run(store, key)
    if found is None:
        raise KeyError(f"no run under key {key!r} in {store!r}")
    head, rows = found
    if head.kind != "workflow":
        raise UserError(f"run {key!r} is a {head.kind} run, not a workflow run; nothing changed")
    entries, _ = load_entries(key, rows)
    pos = find_position(key, entries, step)
    entry = entries[pos]
    if entry.outcome is not None or entry.rerun:
        raise UserError(
            f"step {pos} {entry.name!r} of run {key!r} is not in doubt (it has an outcome, or "
            "never started); nothing changed"
        )
    if happened:
        data = to_typed_json(value, strict=True, where=f"the settled value of step {pos}")
        settled = {"happened": True, "at": round(time.time(), 3)}
        outcome = {"op": entry.op, "name": entry.name, "value": data, "settled": settled}
        record: list[Any] = ["outcome", pos, outcome]
    else:
        note = {"op": entry.op, "name": entry.name, "cancelled": "settled: it did not happen"}
        record = ["attempt", pos, note]
    text = json.dumps([record], ensure_ascii=False, separators=(",", ":"))

    written, _ = _append_to_stopped(
        store,
        head,
        JournalRow(0, OPS, pos, text),
        stopped_by="EffectInDoubtError",
        changed="it was being settled",
        live=UserError(f"run {key!r} is live; settle a step only while no process runs it"),
        meta={"settled": {"step": f"{pos} {entry.name}", "happened": happened}},
    )
    return written


def _append_to_stopped(
    store: Store,
    head: RunHead,
    row: JournalRow,
    *,
    stopped_by: str,
    changed: str,
    live: Exception,
    meta: dict[str, Any] | None = None,
) -> tuple[RunHead, bool]:
    """Append ``row`` (its ``seq`` set here) to the run of ``head`` as read, in one
    transaction with its head, while no process runs it: a run that failed with
    ``stopped_by`` is left ``paused`` (its error cleared), ``meta`` is added to the head's.
    Raises ``live`` when an owner holds the run, an ownership error when it changed since
    read. Returns the new head and whether the run had stopped (paused, or failed so)."""
    from stepstone.durable._kernel import ownership_error
    from stepstone.durable._leases import owner_alive

    key = head.key
    stopped: list[bool] = []

    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        if cur is None or cur.version != head.version:
            raise ownership_error(head.kind, f"run {key!r} changed while {changed}; try again")
        now = store.backend.clock()
        if owner_alive(cur, now=now):
            raise live
        error = cur.meta.get("error")
        failed_here = (
            cur.status == "failed"
            and isinstance(error, dict)
            and str(error.get("type", "")).endswith(stopped_by)
        )
        stopped[:] = [failed_here or cur.status == "paused"]
        kept = {k: v for k, v in cur.meta.items() if not (failed_here and k == "error")}
        new = cur.replace(
            status="paused" if failed_here else cur.status,
            version=cur.version + 1,
            journal_len=cur.journal_len + 1,
            updated_at=now,
            meta={**kept, **(meta or {})},
        )
        return Claim(head=new, rows=[dataclasses.replace(row, seq=cur.journal_len)])

    written = store.backend.run_transact(key, decide)
    assert written is not None
    return written, stopped == [True]


def pending_operation_approvals(head: RunHead, rows: Sequence[JournalRow]) -> list[dict[str, Any]]:
    """The tool calls a workflow run asked a person about (its ``approval`` operations,
    recorded by the framework integrations), with their decision when one was given:
    ``[{"call_id", "tool", "arguments", "position", "decision"}]``, the undecided first."""
    try:
        entries, _ = load_entries(head.key, rows)
    except WorkflowCorruptError:
        return []
    out: list[dict[str, Any]] = []
    for pos, entry in iter_positions(entries):
        if entry.op != "approval" or entry.outcome is None:
            continue
        args = entry.intent.get("args") if isinstance(entry.intent.get("args"), dict) else {}
        assert isinstance(args, dict)
        value = entry.outcome.get("value")
        decision = value.get("decision") if isinstance(value, dict) else None
        out.append(
            {
                "call_id": args.get("call_id"),
                "tool": args.get("tool", entry.name),
                "arguments": args.get("arguments"),
                "position": pos,
                "decision": decision,
            }
        )
    out.sort(key=lambda c: c["decision"] is not None)
    return out


def approve_operation(
    store: Store, key: str, call_id: str, decision: bool | str, *, replace: bool = False
) -> dict[str, Any]:
    """Record ``decision`` (True, False or a reason) for the tool call ``call_id`` a
    workflow run asked about: appended as the outcome of its ``approval`` operation, in one
    transaction with the head, while no process runs it; a run that stopped on the question
    (failed with ``ApprovalPendingError``) is left ``paused``. Its next run replays the
    decision. When that was the last call it waited for and the run came from a work queue,
    its queue entry is put back in its queue (``requeue_when_stopped``, which waits for the
    worker that paused the run to finish the entry): a worker continues the run, with no one
    running the key again by hand.

    Returns:
        ``{key, run_key, call_id, tool, arguments, decision, previous, changed,
        requeued}``: ``requeued`` is the id of the queue entry put back, or None.

    Raises:
        ApprovalTargetError: the run does not ask about ``call_id`` (the message lists the
            calls it asks about), it is live, or another decision stands and ``replace``
            is False.
    """
    from stepstone.durable._records import read_run
    from stepstone.exceptions import ApprovalTargetError

    found = read_run(store, key)
    if found is None:
        raise ApprovalTargetError(f"no run under key {key!r} in {store!r}")
    head, rows = found
    asked = pending_operation_approvals(head, rows)
    match = next((c for c in asked if c["call_id"] == call_id), None)
    if match is None:
        waiting = ", ".join(str(c["call_id"]) for c in asked if c["decision"] is None)
        raise ApprovalTargetError(
            f"run {key!r} does not wait for tool call {call_id!r}; "
            + (f"it waits for {waiting} (pass one of those)" if waiting else "it waits for none")
        )
    before = match["decision"]
    result = {
        "key": key,
        "run_key": key,
        "call_id": call_id,
        "tool": match["tool"],
        "arguments": match["arguments"],
        "decision": decision,
        "previous": before,
        "changed": before != decision,
        "requeued": None,
    }
    if before == decision:
        return result
    if before is not None and not replace:
        shown = "approved" if before is True else f"denied ({before})"
        raise ApprovalTargetError(
            f"tool call {call_id!r} of run {key!r} is already {shown}; nothing was changed. "
            "Give the decision again with replace=True (`stepstone approve --replace`) to "
            "change it"
        )
    stopped = _record_approval(store, key, head, rows, match["position"], decision)
    undecided = [c for c in asked if c["decision"] is None and c["call_id"] != call_id]
    if stopped and not undecided:
        from stepstone.durable._queue import requeue_when_stopped

        result["requeued"] = requeue_when_stopped(store, key)
    return result


def _record_approval(
    store: Store,
    key: str,
    head: RunHead,
    rows: Sequence[JournalRow],
    pos: str,
    decision: bool | str,
) -> bool:
    """Append ``decision`` as the outcome of the ``approval`` operation at ``pos`` of the
    run under ``key`` (as read: ``head`` and its journal ``rows``), in one transaction with
    its head; refused when the run changed since read or is live. A run that failed asking
    is left paused. True when the run had stopped (paused, or failed asking)."""
    from stepstone.exceptions import ApprovalTargetError

    entry = load_entries(key, rows)[0][pos]
    outcome = {
        "op": "approval",
        "name": entry.name,
        "value": {"decision": decision},
        "settled": {"happened": True, "at": round(time.time(), 3)},
    }
    text = json.dumps([["outcome", pos, outcome]], ensure_ascii=False, separators=(",", ":"))
    _, stopped = _append_to_stopped(
        store,
        head,
        JournalRow(0, OPS, pos, text),
        stopped_by="ApprovalPendingError",
        changed="the decision was recorded",
        live=ApprovalTargetError(f"run {key!r} is live; approve its calls once it stops"),
    )
    return stopped


def iter_positions(entries: dict[str, Entry]) -> Iterator[tuple[str, Entry]]:
    """``entries`` in position order (``2`` before ``10``, ``3`` before ``3.0.0``)."""
    return iter(sorted(entries.items(), key=lambda item: _order(item[0])))


def _order(pos: str) -> tuple[int, ...]:
    """Sort key of a position: a task's operation ``n`` sorts after the operations of the
    tasks started before it (``"1.0.0"``, made by a task created when its parent had
    made one operation, sorts before the parent's ``"1"``)."""
    out: list[int] = []
    try:
        for part in pos.split("."):
            out.append(int(part))
    except ValueError:
        return (_LAST,)
    keyed: list[int] = []
    for i, n in enumerate(out):
        keyed.append(n)
        if i % 2 == 0 and i == len(out) - 1:
            keyed.append(_LAST)
    return tuple(keyed)


_LAST = 1 << 62
