"""The effect journal: intent before, outcome after, replay on resume.

An engine that calls the outside world from inside a durable run (an LLM loop's model
completions, tool calls and subagent calls; a workflow's steps) records each call as an
*effect* in the run's kernel journal, keyed by its position ``(kind, turn, index)`` and
the hash of its input:

* an ``intent`` is committed before a side-effecting call starts;
* an ``outcome`` (the JSON result, or the error, with its ``output_hash``) after it;
* on resume a recorded outcome is replayed instead of called again; a changed input at the
  same position, or an outcome whose hash does not match, is corruption (the engine's
  error, :class:`~stepstone.exceptions.AgentCheckpointCorruptionError` for an agent run),
  never a silent re-run;
* an intent without an outcome is *in doubt* (the process died during the call); the
  caller's policy decides: run it again (``"rerun"``, under the same idempotency key) or
  fail (``"fail"``); an engine may also ask a person before it calls :meth:`effect`.

Beside its effects an engine journals *records* of its own (an agent run's phase records,
messages and runtime snapshots), in the same commits. :class:`EffectLog` reads a run's
journal once and checks it; :class:`EffectJournal` appends to it through the kernel's one
commit path (:meth:`OwnedRun.commit`): records are buffered and ride along with the next
commit, several concurrent calls share one commit (group commit), and effect entries are
never left behind a call that depends on them. How the entries are laid out in journal
rows (one row per commit) is :mod:`stepstone.durable._journal_format`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal

from stepstone.durable._hashing import INPUT_HASH_VERSION, InputHash, hash_json
from stepstone.durable._journal_format import (
    EFFECT_KINDS,
    ENTRIES_KIND,
    HASH_VERSION,
    Entry,
    EntryReader,
    EntryWriter,
    FormatError,
    position,
)
from stepstone.durable._kernel import OwnedRun
from stepstone.durable._settle import not_happened
from stepstone.exceptions import CheckpointFlushError, ConcurrentRunError, EffectInDoubtError
from stepstone.store._base import JournalRow
from stepstone.store._store import Store

if TYPE_CHECKING:
    from stepstone.durable._operations import OperationJournal

__all__ = [
    "DurableScope",
    "EffectJournal",
    "EffectLog",
    "Entry",
    "InDoubtPolicy",
    "bind_scope",
    "current_scope",
    "hash_json",
    "idempotency_key",
    "position",
]

log = logging.getLogger("stepstone")

InDoubtPolicy = Literal["rerun", "fail", "ask"]

#: Makes the engine's corruption error from what is wrong (a sentence naming the row).
Corrupt = Callable[[str], Exception]

Item = tuple[str, str | None, dict[str, Any]]


def idempotency_key(run_id: str, kind: str, turn: int, index: int) -> str:
    """The stable key of the effect at ``(kind, turn, index)`` of run ``run_id``, the same
    on every replay and resume of that call: pass it to external APIs that deduplicate."""
    return f"{run_id}:{kind}:{turn}:{index}"


@dataclasses.dataclass(frozen=True, slots=True)
class DurableScope:
    """Where an engine running inside a durable step should journal its effects.

    A Plan step execution, a graph node visit and a subagent call each bind one, so an
    LLM loop inside them gets a run key derived from that position: the same key on every
    retry and resume of the same execution.

    A workflow's body binds one too, with its operation journal
    (:mod:`stepstone.durable._operations`): the current durable run, whose next operation
    code inside it can record (``@step`` calls, timers, messages, adapters' model calls).

    Attributes:
        store: The store of the enclosing durable run.
        key: The stable key of this execution (the Plan step's idempotency key...).
        approvals: Decisions for pending approvals, by call id (from a resume).
        journal: The operation journal of the workflow run whose body this is (None in a
            Plan step, graph node, subagent call or workflow step).
        address: The key of the run whose messages, events and streams the code in this
            scope receives and writes (the Plan's checkpoint key, the workflow's key; None:
            ``journal``'s key, or no run to address).
        attempt: In a workflow step: the step's attempt, which the stream values it writes
            carry (such a step runs again whole after a crash, so what it writes may
            repeat); None elsewhere.
    """

    store: Store
    key: str
    approvals: dict[str, bool | str] = dataclasses.field(default_factory=dict)
    _uses: list[int] = dataclasses.field(default_factory=lambda: [0], compare=False, repr=False)
    journal: OperationJournal | None = dataclasses.field(default=None, compare=False, repr=False)
    address: str | None = None
    attempt: int | None = None
    #: The operations journal of this step execution's sleeps, receives and stream writes,
    #: with the call that releases it, once one was made (``durable/_time.py``).
    _ops: list[Any] = dataclasses.field(default_factory=list, compare=False, repr=False)

    @property
    def run_address(self) -> str | None:
        """The key of the run this scope's messages, events and streams belong to."""
        if self.address is not None:
            return self.address
        return None if self.journal is None else self.journal.key

    def run_key(self) -> str:
        """The key of the next durable loop started in this scope: ``"{key}:llm"``, then
        ``"{key}:llm2"``... (a step that runs several agents, in a deterministic order); in
        a workflow's body, a key of the loop's own position in the workflow."""
        if self.journal is not None:
            return self.journal.loop_key()
        self._uses[0] += 1
        n = self._uses[0]
        return f"{self.key}:llm" if n == 1 else f"{self.key}:llm{n}"


_scope: contextvars.ContextVar[DurableScope | None] = contextvars.ContextVar(
    "stepstone_durable_scope", default=None
)


def current_scope() -> DurableScope | None:
    """The durable scope the running code is inside, or None."""
    return _scope.get()


class bind_scope:  # noqa: N801 - used as a function: ``with bind_scope(scope):``
    """Make ``scope`` current inside the block (None: outside any durable run).

    A class rather than a generator-based context manager: an engine binds one around
    every step it runs, and this costs a third as much."""

    __slots__ = ("_scope", "_token")

    def __init__(self, scope: DurableScope | None) -> None:
        self._scope = scope

    def __enter__(self) -> None:
        self._token = _scope.set(self._scope)

    def __exit__(self, *exc: object) -> None:
        _scope.reset(self._token)
        scope = self._scope
        if scope is not None and scope._ops:  # its step's operations journal: release it
            close = scope._ops.pop()
            scope._ops.clear()
            close()


class EffectLog:
    """A run's journal, read and checked once: its entries in order, its effects by position.

    Attributes:
        key: The run's key.
        entries: Every entry, in journal order (:class:`Entry`: as the first format stored
            it, whatever format wrote it).
        intents: Intent objects by position.
        outcomes: Outcome objects by position.
        rows: How many journal rows it was read from.
    """

    def __init__(self, key: str, *, corrupt: Corrupt) -> None:
        self.key = key
        self.corrupt = corrupt
        self.entries: list[Entry] = []
        self.intents: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.rows = 0
        self.reader = EntryReader()

    @classmethod
    def load(
        cls,
        key: str,
        rows: Sequence[JournalRow],
        *,
        records: Collection[str],
        corrupt: Corrupt,
        what: str = "run",
    ) -> EffectLog:
        """Decode and check ``rows``, the journal of the run under ``key``.

        Args:
            records: The kinds of the records the engine journals (any other kind is
                corruption: a byte flipped in a row's kind could hide an effect).
            corrupt: Makes the engine's error from what is wrong.
            what: The engine's name for the run, in messages (``"an agent run"``).

        Raises:
            Exception: ``corrupt(...)``'s: a row that does not decode, is of a kind the
                run never writes, or an intent or outcome that does not describe the call
                at its position, or whose data does not match its ``output_hash``.
        """
        out = cls(key, corrupt=corrupt)
        out.rows = len(rows)
        reader = out.reader
        for row in rows:
            if (
                row.kind not in EFFECT_KINDS
                and row.kind != ENTRIES_KIND
                and row.kind not in records
            ):
                raise corrupt(
                    f"journal row {row.seq} is a {row.kind!r} row named {row.name!r}, which "
                    f"{what} never writes"
                )
            try:
                entries = reader.row(row)
            except FormatError as exc:
                raise corrupt(f"journal row {row.seq} ({row.kind}) is {exc}") from exc
            except ValueError as exc:
                raise corrupt(
                    f"journal row {row.seq} ({row.kind}) is not valid JSON: {exc}"
                ) from exc
            where = f"journal row {row.seq}"
            for entry in entries:
                if entry.kind in EFFECT_KINDS:
                    out._effect(where, entry)
                elif entry.kind not in records:
                    raise corrupt(
                        f"{where} holds a {entry.kind!r} record named {entry.name!r}, which "
                        f"{what} never writes"
                    )
            out.entries += entries
        return out

    def _effect(self, where: str, entry: Entry) -> None:
        data, pos = entry.data, str(entry.name)
        _check_effect(self.corrupt, where, entry)
        if entry.kind == "intent":  # a new try at a call settled as not happened
            self.outcomes.pop(pos, None)
        (self.intents if entry.kind == "intent" else self.outcomes)[pos] = data
        intent = self.intents.get(pos)
        if intent is not None and (
            intent["input_hash"] != data["input_hash"]
            or intent.get(HASH_VERSION) != data.get(HASH_VERSION)
        ):
            raise self.corrupt(
                f"{where}: the {entry.kind} of the call at {pos!r} records another "
                "input_hash than its intent"
            )

    def of(self, kind: str) -> list[Entry]:
        """The entries of ``kind``, in order."""
        return [e for e in self.entries if e.kind == kind]


def _check_effect(corrupt: Corrupt, where: str, entry: Entry) -> None:
    """Raise ``corrupt(...)`` unless an intent or outcome describes the call at the position
    it is filed under, and an outcome's data matches its hash: one filed under another
    position would leave its call looking never made (and run again); a damaged outcome
    would be replayed as the call's result."""
    data = entry.data
    kind, turn, index = data.get("kind"), data.get("turn"), data.get("index")
    fields = _EFFECT_FIELDS | ({"output_hash", "data"} if entry.kind == "outcome" else set())
    if not (
        set(data) <= fields
        and isinstance(kind, str)
        and type(turn) is int
        and type(index) is int
        and _is_hash(data.get("input_hash"))
        and _is_hash_version(data.get(HASH_VERSION, INPUT_HASH_VERSION))
        and entry.name == position(kind, turn, index)
    ):
        raise corrupt(
            f"{where} ({entry.kind} {entry.name!r}) does not describe the call at its "
            "position (a field or its name is damaged)"
        )
    if entry.kind == "outcome" and (
        not isinstance(data.get("data"), dict) or hash_json(data["data"]) != data.get("output_hash")
    ):
        raise corrupt(
            f"{where}: the recorded outcome of the {kind} call {data.get('name')!r} at turn "
            f"{turn}, index {index} does not match its output_hash"
        )


#: The fields of an intent (an outcome adds ``output_hash`` and ``data``).
_EFFECT_FIELDS = {"kind", "name", "turn", "index", "call_id", "input_hash", HASH_VERSION}


def _is_hash(value: Any) -> bool:
    """Whether ``value`` can be a :func:`hash_json` digest (64 lowercase hex digits)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.fullmatch(value) is not None


_HEX = re.compile("[0-9a-f]+")


def _is_hash_version(value: Any) -> bool:
    return type(value) is int and value == INPUT_HASH_VERSION


class EffectJournal:
    """The effects and records one owned run appends to its journal.

    Args:
        run: The owned kernel run.
        log: The run's journal so far (:meth:`EffectLog.load`).
        label: The run in messages (``"agent run 'r1'"``).
        async_writes: Records may stay buffered until the next effect commit, the
            background flush or the terminal flush. False: the engine commits them itself
            (:meth:`flush`) before its next call.
        flush_interval: Async mode: buffered records are committed at most this long after
            they were buffered, even when no effect commit comes along.
        queue_maxsize: Buffered entries beyond this are committed at once.

    Attributes:
        next_step: What a commit of the running run writes as its head's ``next_step``.
        iteration: What a commit writes as its head's ``iteration`` (None: unchanged).
        replayed: Effects replayed from the journal by this process.
        commits: Commits this process made.
    """

    def __init__(
        self,
        run: OwnedRun,
        log: EffectLog,
        *,
        label: str,
        async_writes: bool = False,
        flush_interval: float = 0.05,
        queue_maxsize: int = 1024,
    ) -> None:
        self.run = run
        self.label = label
        self.async_writes = async_writes
        self.flush_interval = flush_interval
        self.queue_maxsize = queue_maxsize
        self.intents = log.intents
        self.outcomes = log.outcomes
        self._corrupt_error = log.corrupt
        self._writer = EntryWriter(log.reader)
        self.next_step: str | None = None
        self.iteration: int | None = None
        self.replayed = 0
        self.commits = 0
        self._buffer: list[Item] = []
        self._appended = 0  # entries ever buffered
        self._committed = 0  # entries ever buffered that are now committed
        self._latest: Item | None = None
        self._lock: asyncio.Lock | None = None
        self._lost: BaseException | None = None  # ownership lost: nothing more is written
        self._flusher: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._closed = False
        # Positions whose entries hold a hash version 1 digest this run accepted for the call.
        self._older: dict[str, str] = {}

    def _corrupt(self, what: str) -> Exception:
        return self._corrupt_error(what)

    def has_outcome(self, kind: str, turn: int, index: int = 0) -> bool:
        """Whether the effect at this position has a recorded outcome."""
        return position(kind, turn, index) in self.outcomes

    def has_intent(self, kind: str, turn: int, index: int = 0) -> bool:
        """Whether the effect at this position has a recorded intent."""
        return position(kind, turn, index) in self.intents

    # -- records, buffering and commits ----------------------------------------------------
    def record(
        self, kind: str, name: str | None, data: dict[str, Any], *, latest: bool = False
    ) -> None:
        """Buffer one record of the engine (a JSON-ready object it must not change after);
        the next commit writes it. ``latest``: only the newest such record buffered is
        written (one slot, written last in its commit: a runtime snapshot)."""
        if latest:
            self._latest = (kind, name, data)
        else:
            self._buffer.append((kind, name, data))
            self._appended += 1
        self._kick()

    def _append(self, item: Item) -> None:
        self._buffer.append(item)
        self._appended += 1

    def _kick(self) -> None:
        if len(self._buffer) >= self.queue_maxsize:
            self._spawn_flush(0.0)
        elif self.async_writes:
            self._spawn_flush(self.flush_interval)

    def _spawn_flush(self, delay: float) -> None:
        if self._closed or (self._flusher is not None and not self._flusher.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._closing is None:
            self._closing = asyncio.Event()
        closing = self._closing

        async def later() -> None:
            try:
                await asyncio.wait_for(closing.wait(), delay)
                return  # the run is ending: its final flush takes the entries
            except TimeoutError:
                pass
            try:
                await self.flush()
            except Exception:  # the entries stay buffered: the next flush retries them
                log.debug("stepstone: background checkpoint flush failed", exc_info=True)

        self._flusher = loop.create_task(later())

    async def flush(
        self,
        *,
        status: str = "running",
        meta: dict[str, Any] | None = None,
        force: bool = False,
        upto: int | None = None,
    ) -> None:
        """Commit everything buffered (group commit: one transaction, one journal row).

        ``upto``: only needed until the first ``upto`` entries ever buffered are committed
        (a caller waiting for its own entries returns when another commit took them).
        ``force``: commit the head (``status``, ``meta``) even with nothing buffered.

        Raises:
            ConcurrentRunError: the run lost its ownership; nothing was written.
            CheckpointFlushError: the store failed; the entries stay buffered for a retry.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._lost is not None:
                raise self._lost
            if upto is not None and self._committed >= upto and not force:
                return
            mark = self._appended
            items = self._take()
            if not items and not force:
                return
            rows: list[tuple[str, str | None, Any]] = []
            remember: Callable[[], None] | None = None
            if items:
                data, remember = self._writer.encode(items, self.intents)
                rows.append((ENTRIES_KIND, None, data))
            # The effects done so far (model turns, tool and subagent calls), in the head:
            # what operators count as the run's steps without reading its journal.
            base = meta if meta is not None else self.run.head.meta
            if base.get("effects") != len(self.outcomes):
                meta = {**base, "effects": len(self.outcomes)}
            try:
                await self.run.commit(
                    status=status,
                    next_step=self.next_step if status == "running" else None,
                    iteration=self.iteration,
                    meta=meta,
                    rows=rows,
                )
            except BaseException as exc:
                self._not_committed(exc, items)
                raise
            if remember is not None:
                remember()
            self._committed = mark
            self.commits += 1

    def _not_committed(self, exc: BaseException, items: list[Item]) -> None:
        """A commit of ``items`` raised ``exc`` and wrote nothing: keep them buffered for a
        retry; a store's failure is raised as CheckpointFlushError, a lost ownership
        remembered (every later flush raises it)."""
        self._buffer[:0] = items
        if isinstance(exc, ConcurrentRunError):
            self._lost = exc
        if isinstance(exc, Exception) and not isinstance(exc, ConcurrentRunError):
            raise CheckpointFlushError(
                f"{self.label}: committing {len(items)} journal entr"
                f"{'y' if len(items) == 1 else 'ies'} to {self.run.key!r} failed "
                f"({type(exc).__name__}: {exc}); nothing was lost from the journal "
                "before them. Check the store, then resume the run"
            ) from exc

    def _take(self) -> list[Item]:
        items, self._buffer = self._buffer, []
        if self._latest is not None:
            items.append(self._latest)
            self._latest = None
        return items

    async def _sync_point(self, alone: bool = False) -> None:
        # Let concurrent calls that finish in the same loop tick add their entries first,
        # so one transaction (and one fsync) commits them all (``alone``: there are none).
        mark = self._appended
        if not alone:
            await asyncio.sleep(0)
        await self.flush(upto=mark)

    async def close(self) -> None:
        """Stop the background flusher (its entries stay buffered for the final flush). A
        flush it already started is awaited, never cancelled: a commit cut short in a
        worker thread could still land after the next one started."""
        self._closed = True
        task, self._flusher = self._flusher, None
        if task is None or task.done():
            return
        if self._closing is not None:
            self._closing.set()
        with contextlib.suppress(Exception):
            await task

    # -- effects -------------------------------------------------------------------------
    def recorded(
        self, *, kind: str, turn: int, index: int, name: str, input_hash: str
    ) -> dict[str, Any] | None:
        """The verified outcome recorded at this position, or None.

        Raises:
            Exception: the log's corruption error: the recorded input differs from
                ``input_hash`` (the run is not deterministic: the code or its inputs
                changed).
        """
        pos = position(kind, turn, index)
        intent = self.intents.get(pos)
        outcome = self.outcomes.get(pos)
        row = outcome or intent or {}
        recorded_hash = row.get("input_hash")
        if (
            recorded_hash is not None
            and recorded_hash != input_hash
            and not self._older_hash_matches(pos, row, name, input_hash)
        ):
            was = row.get("name")
            raise self._corrupt(
                f"the {kind} call at turn {turn}, index {index} was recorded as {was!r} "
                f"with input_hash {recorded_hash[:12]}, but this run asks for {name!r} with "
                f"input_hash {input_hash[:12]}; check that the agent's tools, instructions "
                "and model script are the same as when the run started (check determinism)"
            )
        if outcome is None:
            return None
        data: dict[str, Any] = outcome["data"]
        if not_happened(data):  # settled by a person: it runs as a new call
            del self.outcomes[pos]
            self.intents.pop(pos, None)
            return None
        # Its data matched its output_hash when the journal was read (EffectLog.load), or
        # it was recorded by this process.
        return data

    def _older_hash_matches(
        self, pos: str, row: dict[str, Any], name: str, input_hash: str
    ) -> bool:
        """Whether ``row``, journaled by hash version 1, records this call although its
        ``input_hash`` differs: the value holds a part version 1 hashed differently (a set,
        a memory address). True when version 1's digest of the value, computed here, is the
        recorded one, or when that digest depended on the process that wrote it (a set's
        order under its hash seed) and cannot be reproduced: then the tool name is checked
        and the arguments are taken as the same (logged). Version 2 rows are checked
        strictly. The position's later rows keep the recorded digest."""
        if HASH_VERSION in row or not isinstance(input_hash, InputHash):
            return False
        if input_hash.version < INPUT_HASH_VERSION:
            return False
        recorded = row.get("input_hash")
        if recorded != input_hash.legacy:
            if not input_hash.unstable or row.get("name") != name:
                return False
            log.warning(
                "stepstone: %s: the %s call %r at %s was journaled by an older "
                "stepstone, whose hash of its arguments (they hold a set or an object shown "
                "with its memory address) depended on the process that wrote it; it cannot "
                "be checked here, so the arguments are taken as the same",
                self.label,
                row.get("kind"),
                name,
                pos,
            )
        self._older[pos] = str(recorded)
        return True

    def in_doubt(self, kind: str, turn: int, index: int) -> bool:
        """An intent with no outcome: the process died during the call."""
        pos = position(kind, turn, index)
        return pos in self.intents and pos not in self.outcomes

    async def effect(
        self,
        *,
        kind: str,
        turn: int,
        index: int,
        name: str,
        input_hash: str,
        invoke: Callable[[], Awaitable[dict[str, Any]]],
        call_id: str | None = None,
        policy: InDoubtPolicy = "rerun",
        commit_intent: bool = True,
        commit_outcome: bool = True,
        after_outcome: Callable[[], None] | None = None,
        alone: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Run (or replay) one effect; returns ``(outcome_data, replayed)``.

        ``invoke`` returns the outcome as a JSON dict (errors encoded by the caller, so a
        failed call is replayed as the same failure). ``after_outcome`` runs once the
        outcome is buffered, before its commit (to add entries that belong in it).
        ``alone``: no other effect of the run runs at the same time, so its commits do
        not wait a loop iteration for others to join them.

        Raises:
            AgentCheckpointCorruptionError: see :meth:`recorded`.
            EffectInDoubtError: the call is in doubt and ``policy == "fail"``.
        """
        data = self.recorded(kind=kind, turn=turn, index=index, name=name, input_hash=input_hash)
        if data is not None:
            self.replayed += 1
            return data, True
        pos = position(kind, turn, index)
        if pos in self.intents:
            if policy == "fail":
                raise EffectInDoubtError(
                    f"{self.label}: the {kind} call {name!r} (turn {turn}, index {index}, "
                    f"call id {call_id!r}) started before a crash and has no recorded outcome; "
                    "it declares in_doubt='fail', so it is not run again. Check the external "
                    "system for its effect, then start a new run (or declare in_doubt='rerun' "
                    "if the call is idempotent)"
                )
            log.info(
                "stepstone: %s call %r at turn %d is in doubt; running it again", kind, name, turn
            )
        else:
            intent = {
                "kind": kind,
                "name": name,
                "turn": turn,
                "index": index,
                "call_id": call_id,
                "input_hash": input_hash,
            }
            if getattr(input_hash, "version", 1) >= INPUT_HASH_VERSION:
                intent[HASH_VERSION] = INPUT_HASH_VERSION
            self.intents[pos] = intent
            self._append(("intent", pos, intent))
            if commit_intent:
                await self._sync_point(alone)
        data = await invoke()
        self.record_outcome(
            kind=kind,
            turn=turn,
            index=index,
            name=name,
            input_hash=input_hash,
            data=data,
            call_id=call_id,
        )
        if after_outcome is not None:
            after_outcome()
        if commit_outcome:
            await self._sync_point(alone)
        return data, False

    def record_outcome(
        self,
        *,
        kind: str,
        turn: int,
        index: int,
        name: str,
        input_hash: str,
        data: dict[str, Any],
        call_id: str | None = None,
    ) -> None:
        """Buffer an outcome row (committed by the next flush)."""
        pos = position(kind, turn, index)
        input_hash = self._older.get(pos, input_hash)  # the intent's, from hash version 1
        outcome = {
            "kind": kind,
            "name": name,
            "turn": turn,
            "index": index,
            "call_id": call_id,
            "input_hash": input_hash,
        }
        if getattr(input_hash, "version", 1) >= INPUT_HASH_VERSION:
            outcome[HASH_VERSION] = INPUT_HASH_VERSION
        outcome["output_hash"] = hash_json(data)
        outcome["data"] = data
        self.outcomes[pos] = outcome
        self._append(("outcome", pos, outcome))
