"""The effect journal: intent before, outcome after, replay on resume.

An engine that calls the outside world from inside a durable run (an LLM loop's model
completions, tool calls and subagent calls) records each call as an *effect* in the run's
kernel journal, keyed by its position ``(kind, turn, index)`` and the hash of its input:

* an ``intent`` row is committed before a side-effecting call starts;
* an ``outcome`` row (the JSON result, or the error, with its ``output_hash``) after it;
* on resume a recorded outcome is replayed instead of called again; a changed input at the
  same position, or an outcome whose hash does not match, is
  :class:`~stepstone.exceptions.AgentCheckpointCorruptionError` (never a silent re-run);
* an intent without an outcome is *in doubt* (the process died during the call); the
  caller's policy decides: run it again, fail, or ask a person.

Rows go through the kernel's one commit path (:meth:`OwnedRun.commit`): phase records and
snapshots are buffered and ride along with the next commit, several concurrent calls share
one commit (group commit), and effect rows are never left behind a call that depends on
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from stepstone.durable._hashing import INPUT_HASH_VERSION, InputHash, hash_json
from stepstone.durable._kernel import OwnedRun
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    ConcurrentRunError,
    EffectInDoubtError,
)
from stepstone.store._base import JournalRow
from stepstone.store._store import Store

if TYPE_CHECKING:
    from stepstone.durable._operations import OperationJournal

__all__ = [
    "AGENT_KIND",
    "SCHEMA_VERSION",
    "DurableScope",
    "EffectJournal",
    "InDoubtPolicy",
    "JournalContents",
    "bind_scope",
    "corrupt_agent_run",
    "current_scope",
    "hash_json",
]

log = logging.getLogger("stepstone")

AGENT_KIND = "agent"
SCHEMA_VERSION = "1"

InDoubtPolicy = Literal["rerun", "fail", "ask"]

Row = tuple[str, str | None, Any]


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
    """

    store: Store
    key: str
    approvals: dict[str, bool | str] = dataclasses.field(default_factory=dict)
    _uses: list[int] = dataclasses.field(default_factory=lambda: [0], compare=False, repr=False)
    journal: OperationJournal | None = dataclasses.field(default=None, compare=False, repr=False)

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


def _pos(kind: str, turn: int, index: int) -> str:
    return f"{kind}:{turn}:{index}"


@dataclasses.dataclass
class JournalContents:
    """An agent run's journal, decoded: what :class:`EffectJournal` resumes from."""

    intents: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    outcomes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    count: int = 0  # rows decoded

    @classmethod
    def load(cls, key: str, run_id: str, rows: Sequence[JournalRow]) -> JournalContents:
        """Decode ``rows``, the journal of the agent run ``run_id`` under ``key``.

        Raises:
            AgentCheckpointCorruptionError: a row is not a JSON object, is of a kind an
                agent run never writes (skipping it could run an effect again), or is an
                effect row or snapshot whose fields are damaged.
        """
        out = cls(count=len(rows))
        for row in rows:
            try:
                data = json.loads(row.data)
            except ValueError as exc:
                raise corrupt_agent_run(
                    key, run_id, f"journal row {row.seq} ({row.kind}) is not valid JSON: {exc}"
                ) from exc
            if not isinstance(data, dict):
                raise corrupt_agent_run(
                    key,
                    run_id,
                    f"journal row {row.seq} ({row.kind}) is a JSON {type(data).__name__}, "
                    "not an object",
                )
            if row.kind in ("intent", "outcome"):
                _check_effect_row(key, run_id, row, data)
                (out.intents if row.kind == "intent" else out.outcomes)[str(row.name)] = data
                intent = out.intents.get(str(row.name))
                if intent is not None and (
                    intent["input_hash"] != data["input_hash"]
                    or intent.get(_HASH_VERSION) != data.get(_HASH_VERSION)
                ):
                    raise corrupt_agent_run(
                        key,
                        run_id,
                        f"journal row {row.seq}: the {row.kind} of the call at {row.name!r} "
                        "records another input_hash than its intent",
                    )
            elif row.kind == "phase":
                out.phases.append(data)
            elif row.kind == "message":
                out.messages.append(data)
            elif row.kind == "snapshot":
                started, context = data.get("started_at_s"), data.get("context")
                if not isinstance(started, int | float | None) or not isinstance(
                    context, dict | None
                ):
                    raise corrupt_agent_run(
                        key, run_id, f"journal row {row.seq} (a snapshot) has a damaged field"
                    )
                out.snapshot = data
            else:  # a byte flipped in its kind or name: skipping it could run an effect again
                raise corrupt_agent_run(
                    key,
                    run_id,
                    f"journal row {row.seq} is a {row.kind!r} row named {row.name!r}, which "
                    "an agent run never writes",
                )
        return out


def _check_effect_row(key: str, run_id: str, row: JournalRow, data: dict[str, Any]) -> None:
    """Raise AgentCheckpointCorruptionError unless an ``intent``/``outcome`` row describes
    the call at the position it is filed under, and an outcome's data matches its hash: a
    row filed under another position would leave its call looking never made (and run
    again); a damaged outcome would be replayed as the call's result."""
    kind, turn, index = data.get("kind"), data.get("turn"), data.get("index")
    fields = _EFFECT_FIELDS | ({"output_hash", "data"} if row.kind == "outcome" else set())
    if not (
        set(data) <= fields
        and isinstance(kind, str)
        and type(turn) is int
        and type(index) is int
        and _is_hash(data.get("input_hash"))
        and _is_hash_version(data.get(_HASH_VERSION, INPUT_HASH_VERSION))
        and row.name == _pos(kind, turn, index)
    ):
        raise corrupt_agent_run(
            key,
            run_id,
            f"journal row {row.seq} ({row.kind} {row.name!r}) does not describe the call at "
            "its position (a field or its name is damaged)",
        )
    if row.kind == "outcome" and (
        not isinstance(data.get("data"), dict) or hash_json(data["data"]) != data.get("output_hash")
    ):
        raise corrupt_agent_run(
            key,
            run_id,
            f"journal row {row.seq}: the recorded outcome of the {kind} call "
            f"{data.get('name')!r} at turn {turn}, index {index} does not match its output_hash",
        )


#: Written only by a call whose input hash is of version 2 (:mod:`._hashing`): its input
#: held a set, or another value hash version 1 wrote by an unstable ``str()``. A row without
#: it records a digest both versions agree on, or one version 1 wrote.
_HASH_VERSION = "input_hash_version"

#: The fields of an intent row (an outcome row adds ``output_hash`` and ``data``).
_EFFECT_FIELDS = {"kind", "name", "turn", "index", "call_id", "input_hash", _HASH_VERSION}


def _is_hash(value: Any) -> bool:
    """Whether ``value`` can be a :func:`hash_json` digest (64 lowercase hex digits)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.fullmatch(value) is not None


_HEX = re.compile("[0-9a-f]+")


def _is_hash_version(value: Any) -> bool:
    return type(value) is int and value == INPUT_HASH_VERSION


def _version_field(input_hash: str) -> dict[str, int]:
    """The ``input_hash_version`` field of a row recording ``input_hash`` (none for a
    digest hash version 1 gives too)."""
    version = getattr(input_hash, "version", 1)
    return {_HASH_VERSION: version} if version >= INPUT_HASH_VERSION else {}


def corrupt_agent_run(key: str, run_id: str, what: str) -> AgentCheckpointCorruptionError:
    """The error for the agent run ``run_id`` (under ``key``) whose record is corrupt."""
    return AgentCheckpointCorruptionError(
        f"agent run {run_id!r} (checkpoint {key!r}): {what}. Nothing was re-executed. "
        f"Inspect it with store.read({key!r}) or start a new run under another run_id"
    )


class EffectJournal:
    """The effect journal and phase buffer of one owned agent run.

    Args:
        run: The owned kernel run (kind ``"agent"``).
        contents: The run's journal so far, decoded (:meth:`JournalContents.load`).
        run_id: The agent run id (in every phase record).
        thread_id: The conversation thread id (in every phase record).
        async_writes: Phase records and snapshots may stay buffered until the next effect
            commit, the background flush or the terminal flush. False: they are committed
            before the next model call.
        coalesce: Keep only the latest buffered runtime snapshot.
        flush_interval: Async mode: buffered records are committed at most this long after
            they were buffered, even when no effect commit comes along.
        queue_maxsize: Buffered rows beyond this are committed at once.
    """

    def __init__(
        self,
        run: OwnedRun,
        contents: JournalContents,
        *,
        run_id: str,
        thread_id: str,
        async_writes: bool = False,
        coalesce: bool = True,
        flush_interval: float = 0.05,
        queue_maxsize: int = 1024,
    ) -> None:
        self.run = run
        self.run_id = run_id
        self.thread_id = thread_id
        self.async_writes = async_writes
        self.coalesce = coalesce
        self.flush_interval = flush_interval
        self.queue_maxsize = queue_maxsize
        self.intents = contents.intents
        self.outcomes = contents.outcomes
        self.phases = contents.phases
        self.messages = contents.messages
        self.snapshot = contents.snapshot
        self.replayed = 0
        self.commits = 0
        self._buffer: list[Row] = []
        self._appended = 0  # rows ever buffered
        self._committed = 0  # rows ever buffered that are now committed
        self._pending_snapshot: dict[str, Any] | None = None
        self._lock: asyncio.Lock | None = None
        self._lost: BaseException | None = None  # ownership lost: nothing more is written
        self._flusher: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._closed = False
        # Positions whose rows hold a hash version 1 digest this run accepted for the call.
        self._older: dict[str, str] = {}
        self.turn = 0

    def _corrupt(self, what: str) -> AgentCheckpointCorruptionError:
        return corrupt_agent_run(self.run.key, self.run_id, what)

    def has_outcome(self, kind: str, turn: int, index: int = 0) -> bool:
        """Whether the effect at this position has a recorded outcome."""
        return _pos(kind, turn, index) in self.outcomes

    def has_intent(self, kind: str, turn: int, index: int = 0) -> bool:
        """Whether the effect at this position has a recorded intent."""
        return _pos(kind, turn, index) in self.intents

    # -- buffering and commits -------------------------------------------------------------
    def phase(self, phase: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Buffer one phase record; returns it."""
        record = {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "schema_version": SCHEMA_VERSION,
            "phase": phase,
            "payload": payload,
            "timestamp_ms": int(time.time() * 1000),
        }
        self.phases.append(record)
        self._append(("phase", phase, record))
        self._kick()
        return record

    def message(self, message: dict[str, Any]) -> None:
        """Buffer one transcript message (appended, never rewritten)."""
        self.messages.append(message)
        self._append(("message", message.get("role"), message))
        self._kick()

    def runtime_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Buffer the runtime counters; with ``coalesce`` only the latest is kept."""
        self.snapshot = snapshot
        if self.coalesce:
            self._pending_snapshot = snapshot
        else:
            self._append(("snapshot", None, snapshot))
        self._kick()

    def _append(self, row: Row) -> None:
        self._buffer.append(row)
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
                return  # the run is ending: its final flush takes the rows
            except TimeoutError:
                pass
            try:
                await self.flush()
            except Exception:  # the rows stay buffered: the next flush retries them
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
        """Commit everything buffered (group commit: one transaction for all of it).

        ``upto``: only needed until the first ``upto`` rows ever buffered are committed
        (a caller waiting for its own rows returns when another commit took them).

        Raises:
            ConcurrentRunError: the run lost its ownership; nothing was written.
            CheckpointFlushError: the store failed; the rows stay buffered for a retry.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._lost is not None:
                raise self._lost
            if upto is not None and self._committed >= upto and not force:
                return
            mark = self._appended
            rows = self._take()
            if not rows and not force:
                return
            # The effects done so far (model turns, tool and subagent calls), in the head:
            # what operators count as the run's steps without reading its journal.
            base = meta if meta is not None else self.run.head.meta
            if base.get("effects") != len(self.outcomes):
                meta = {**base, "effects": len(self.outcomes)}
            try:
                await self.run.commit(
                    status=status,
                    next_step=f"turn:{self.turn}" if status == "running" else None,
                    iteration=self.turn,
                    meta=meta,
                    rows=rows,
                )
            except BaseException as exc:
                self._buffer[:0] = rows  # nothing was written: keep them for a retry
                if isinstance(exc, ConcurrentRunError):
                    self._lost = exc
                if isinstance(exc, Exception) and not isinstance(exc, ConcurrentRunError):
                    raise CheckpointFlushError(
                        f"agent run {self.run_id!r}: committing {len(rows)} checkpoint "
                        f"record(s) to {self.run.key!r} failed ({type(exc).__name__}: {exc}); "
                        "nothing was lost from the journal before them. Check the store, then "
                        "resume the run"
                    ) from exc
                raise
            self._committed = mark
            self.commits += 1

    def _take(self) -> list[Row]:
        rows, self._buffer = self._buffer, []
        if self._pending_snapshot is not None:
            rows.append(("snapshot", None, self._pending_snapshot))
            self._pending_snapshot = None
        return rows

    async def _sync_point(self) -> None:
        # Let concurrent calls that finish in the same loop tick add their rows first, so
        # one transaction (and one fsync) commits them all.
        mark = self._appended
        await asyncio.sleep(0)
        await self.flush(upto=mark)

    async def close(self) -> None:
        """Stop the background flusher (its rows stay buffered for the final flush). A
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
            AgentCheckpointCorruptionError: the recorded input differs from ``input_hash``
                (the run is not deterministic: the code or its inputs changed), or the
                outcome's ``output_hash`` does not match its data.
        """
        pos = _pos(kind, turn, index)
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
        data = outcome.get("data")
        if hash_json(data) != outcome.get("output_hash"):
            raise self._corrupt(
                f"the recorded outcome of the {kind} call {name!r} at turn {turn}, index "
                f"{index} does not match its output_hash"
            )
        if not isinstance(data, dict):
            raise self._corrupt(f"the recorded outcome of {name!r} at turn {turn} is not a dict")
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
        if _HASH_VERSION in row or not isinstance(input_hash, InputHash):
            return False
        if input_hash.version < INPUT_HASH_VERSION:
            return False
        recorded = row.get("input_hash")
        if recorded != input_hash.legacy:
            if not input_hash.unstable or row.get("name") != name:
                return False
            log.warning(
                "stepstone: agent run %r: the %s call %r at %s was journaled by an older "
                "stepstone, whose hash of its arguments (they hold a set or an object shown "
                "with its memory address) depended on the process that wrote it; it cannot "
                "be checked here, so the arguments are taken as the same",
                self.run_id,
                row.get("kind"),
                name,
                pos,
            )
        self._older[pos] = str(recorded)
        return True

    def in_doubt(self, kind: str, turn: int, index: int) -> bool:
        """An intent with no outcome: the process died during the call."""
        pos = _pos(kind, turn, index)
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
    ) -> tuple[dict[str, Any], bool]:
        """Run (or replay) one effect; returns ``(outcome_data, replayed)``.

        ``invoke`` returns the outcome as a JSON dict (errors encoded by the caller, so a
        failed call is replayed as the same failure). ``after_outcome`` runs once the
        outcome is buffered, before its commit (to add rows that belong in it).

        Raises:
            AgentCheckpointCorruptionError: see :meth:`recorded`.
            EffectInDoubtError: the call is in doubt and ``policy == "fail"``.
        """
        data = self.recorded(kind=kind, turn=turn, index=index, name=name, input_hash=input_hash)
        if data is not None:
            self.replayed += 1
            return data, True
        pos = _pos(kind, turn, index)
        if pos in self.intents:
            if policy == "fail":
                raise EffectInDoubtError(
                    f"agent run {self.run_id!r}: the {kind} call {name!r} (turn {turn}, index "
                    f"{index}, call id {call_id!r}) started before a crash and has no recorded "
                    "outcome; its tool declares in_doubt='fail', so it is not run again. Check "
                    "the external system for its effect, then start a new run (or declare "
                    "in_doubt='rerun' if the call is idempotent)"
                )
            log.info(
                "stepstone: %s call %r at turn %d is in doubt; running it again", kind, name, turn
            )
        else:
            intent = {"kind": kind, "name": name, "turn": turn, "index": index}
            intent.update({"call_id": call_id, "input_hash": input_hash})
            intent.update(_version_field(input_hash))
            self.intents[pos] = intent
            self._append(("intent", pos, intent))
            if commit_intent:
                await self._sync_point()
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
            await self._sync_point()
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
        pos = _pos(kind, turn, index)
        input_hash = self._older.get(pos, input_hash)  # the intent's, from hash version 1
        outcome = {
            "kind": kind,
            "name": name,
            "turn": turn,
            "index": index,
            "call_id": call_id,
            "input_hash": input_hash,
            **_version_field(input_hash),
            "output_hash": hash_json(data),
            "data": data,
        }
        self.outcomes[pos] = outcome
        self._append(("outcome", pos, outcome))
