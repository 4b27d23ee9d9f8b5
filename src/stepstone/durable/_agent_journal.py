"""An agent run's journal: its phase records, messages and runtime snapshots beside its
effects.

An agent run (a :class:`~stepstone.Runner` run, or an LLM loop inside a durable Plan step
or graph node) journals, through the generic :class:`~stepstone.durable._effects.EffectJournal`:

* its effects: each model completion (``model:T:0``), tool call (``tool:T:I``) and
  subagent call (``subagent:T:I``), intent and outcome;
* ``phase`` records ``{run_id, thread_id, schema_version, phase, payload, timestamp_ms}``,
  named by their phase (``run_started``, ``step_started``, ``pre_llm``, ``post_llm``...);
* ``message`` records (the user message that started the run), named by their role;
* ``snapshot`` records, the runtime counters (usage, cost, context...).

:class:`AgentLog` reads and checks all of it once (effects, records, the latest phase
record); :class:`AgentJournal` appends to it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from stepstone.durable._effects import EffectJournal, EffectLog
from stepstone.durable._kernel import OwnedRun
from stepstone.exceptions import AgentCheckpointCorruptionError
from stepstone.store._base import JournalRow

__all__ = [
    "AGENT_KIND",
    "RECORDS",
    "SCHEMA_VERSION",
    "AgentJournal",
    "AgentLog",
    "corrupt_agent_run",
    "normalize_record",
    "validate_record",
]

AGENT_KIND = "agent"
SCHEMA_VERSION = "1"

#: The kinds of the records an agent run journals beside its effects.
RECORDS = ("phase", "message", "snapshot")

_REQUIRED = ("run_id", "thread_id", "phase", "payload")


def corrupt_agent_run(key: str, run_id: str, what: str) -> AgentCheckpointCorruptionError:
    """The error for the agent run ``run_id`` (under ``key``) whose record is corrupt."""
    return AgentCheckpointCorruptionError(
        f"agent run {run_id!r} (checkpoint {key!r}): {what}. Nothing was re-executed. "
        f"Inspect it with store.read({key!r}) or start a new run under another run_id"
    )


def normalize_record(record: Any) -> Any:
    """Bring an older checkpoint record to the current shape (before validation).

    Older records used ``ts`` (seconds) for ``timestamp_ms`` and ``data`` for ``payload``
    and had no ``schema_version``.
    """
    if not isinstance(record, dict):
        return record
    out = dict(record)
    if "payload" not in out and isinstance(out.get("data"), dict):
        out["payload"] = out.pop("data")
    if "timestamp_ms" not in out and isinstance(out.get("ts"), int | float):
        out["timestamp_ms"] = int(out.pop("ts") * 1000)
    out.setdefault("schema_version", SCHEMA_VERSION)
    return out


def validate_record(key: str, record: Any) -> dict[str, Any]:
    """``record`` (a phase record, normalized), checked.

    Raises:
        AgentCheckpointCorruptionError: not a dict, or a required field missing or of the
            wrong type.
    """
    record = normalize_record(record)
    if not isinstance(record, dict):
        raise AgentCheckpointCorruptionError(
            f"checkpoint {key!r}: the latest record is a {type(record).__name__}, not a dict; "
            "nothing was resumed or written. Start a new run under another run_id"
        )
    missing = [f for f in _REQUIRED if f not in record]
    untyped = [f for f in ("run_id", "thread_id", "phase") if not isinstance(record.get(f), str)]
    if missing or untyped or not isinstance(record.get("payload"), dict):
        what = (
            f"misses {missing}"
            if missing
            else f"has {untyped} that are not text"
            if untyped
            else "has a payload that is not a dict"
        )
        raise AgentCheckpointCorruptionError(
            f"checkpoint {key!r}: the latest record {what}; nothing was resumed or written. "
            "Start a new run under another run_id"
        )
    return record


class AgentLog:
    """An agent run's journal, read and checked once: what a resume starts from.

    Attributes:
        effects: The effect log (every entry, the intents and outcomes by position).
        messages: The message records, in order.
        snapshot: The latest runtime snapshot (None before the first).
        latest: The latest phase record, normalized and checked (None before the first).
    """

    def __init__(self, effects: EffectLog) -> None:
        self.effects = effects
        self.messages: list[dict[str, Any]] = []
        self.snapshot: dict[str, Any] | None = None
        self.latest: dict[str, Any] | None = None

    @classmethod
    def empty(cls, key: str, run_id: str) -> AgentLog:
        """The log of a run with no journal yet."""
        return cls(EffectLog(key, corrupt=lambda what: corrupt_agent_run(key, run_id, what)))

    @classmethod
    def load(cls, key: str, run_id: str, rows: Sequence[JournalRow]) -> AgentLog:
        """Decode and check ``rows``, the journal of the agent run ``run_id`` under ``key``.

        Raises:
            AgentCheckpointCorruptionError: a row that does not decode, is of a kind an
                agent run never writes (skipping it could run an effect again), an effect
                entry or snapshot whose fields are damaged, or a latest phase record that
                misses a required field.
        """
        effects = EffectLog.load(
            key,
            rows,
            records=RECORDS,
            corrupt=lambda what: corrupt_agent_run(key, run_id, what),
            what="an agent run",
        )
        out = cls(effects)
        latest: dict[str, Any] | None = None
        for entry in effects.entries:
            if entry.kind == "phase":
                latest = entry.data
            elif entry.kind == "message":
                out.messages.append(entry.data)
            elif entry.kind == "snapshot":
                started, context = entry.data.get("started_at_s"), entry.data.get("context")
                if not isinstance(started, int | float | None) or not isinstance(
                    context, dict | None
                ):
                    raise corrupt_agent_run(
                        key, run_id, f"journal row {entry.row} (a snapshot) has a damaged field"
                    )
                out.snapshot = entry.data
        out.latest = None if latest is None else validate_record(key, latest)
        return out


class AgentJournal(EffectJournal):
    """The effect journal of one owned agent run, with its phase records, messages and
    runtime snapshots.

    Args:
        run: The owned kernel run (kind ``"agent"``).
        log: The run's journal so far (:meth:`AgentLog.load`).
        run_id: The agent run id (in every phase record).
        thread_id: The conversation thread id (in every phase record).
        async_writes: See :class:`EffectJournal`.
        coalesce: Keep only the latest buffered runtime snapshot.
        flush_interval: See :class:`EffectJournal`.
        queue_maxsize: See :class:`EffectJournal`.
    """

    def __init__(
        self,
        run: OwnedRun,
        log: AgentLog,
        *,
        run_id: str,
        thread_id: str,
        async_writes: bool = False,
        coalesce: bool = True,
        flush_interval: float = 0.05,
        queue_maxsize: int = 1024,
    ) -> None:
        super().__init__(
            run,
            log.effects,
            label=f"agent run {run_id!r}",
            async_writes=async_writes,
            flush_interval=flush_interval,
            queue_maxsize=queue_maxsize,
        )
        self.run_id = run_id
        self.thread_id = thread_id
        self.coalesce = coalesce
        self.messages = log.messages
        self.snapshot = log.snapshot
        self.turn = 0

    @property
    def turn(self) -> int:
        """The turn the run is at (the head's ``next_step`` is ``"turn:N"``)."""
        return self._turn

    @turn.setter
    def turn(self, turn: int) -> None:
        self._turn = turn
        self.next_step = f"turn:{turn}"
        self.iteration = turn

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
        self.record("phase", phase, record)
        return record

    def message(self, message: dict[str, Any]) -> None:
        """Buffer one transcript message (appended, never rewritten)."""
        self.messages.append(message)
        self.record("message", message.get("role"), message)

    def runtime_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Buffer the runtime counters; with ``coalesce`` only the latest is kept."""
        self.snapshot = snapshot
        self.record("snapshot", None, snapshot, latest=self.coalesce)
