"""The durable kernel: claim a run, commit each step atomically, release it.

Every engine (Plan, graph, agent runner) drives its runs through these calls and nothing
else, so they all get the same guarantees:

* **Ownership.** ``claim_run`` records ``run_uid``, host, pid and a lease in one database
  transaction. A live owner is never displaced (``ConcurrentRunError``); a dead one
  (lease expired, or its process gone on this host) is taken over by ``resume=True``.
* **One atomic commit per step.** ``OwnedRun.commit`` replaces the head (compare-and-swap
  on its version and run_uid), appends journal rows and upserts ``writes=`` values in one
  transaction: the checkpoint and the Store never disagree.
* **Append, don't rewrite.** Heads are small and updated in place; history is appended, so
  a step costs the same at step 1,000 as at step 10.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from stepstone.core._ids import new_origin, new_uid
from stepstone.core._serialization import dumps
from stepstone.core._sync import may_block_loop
from stepstone.durable._group import (
    can_group,
    can_group_claims,
    drain,
    group_commit,
    group_transact,
    leave,
    shared_claim,
    shared_commit,
)
from stepstone.durable._leases import (
    LIVE_STATUSES,
    LeasePolicy,
    keeper,
    mark_released,
    owner_alive,
)
from stepstone.durable._records import blocking_call
from stepstone.exceptions import (
    ConcurrentPlanRunError,
    ConcurrentRunError,
    RunCancelledError,
    SerializationError,
    StoreKeyConflictError,
)
from stepstone.store._base import Claim, Decide, JournalRow, RunHead
from stepstone.store._extras import ExtraWrites
from stepstone.store._store import Store, check_key
from stepstone.store._views import has_run_view

__all__ = [
    "ClaimResult",
    "Encoded",
    "OwnedRun",
    "aclaim_empty",
    "aclaim_run",
    "claim_empty",
    "claim_run",
    "describe_owner",
    "ownership_error",
]

log = logging.getLogger("stepstone")

Outcome = Literal["fresh", "resumed", "done"]
LegacyImport = Callable[[str, str], tuple[RunHead, list[JournalRow]] | None]


def _with_origin(meta: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """``meta`` an engine commits, keeping the run's ``origin`` (its stamp, set by the
    claim that started it) when the engine does not give one."""
    origin = old.get("origin")
    if origin is None or "origin" in meta:
        return meta
    return {**meta, "origin": origin}


def ownership_error(kind: str, message: str) -> ConcurrentRunError:
    """The ownership error for a run of ``kind``: Plan runs (kind ``"plan"``) raise
    :class:`ConcurrentPlanRunError`, the name Plan users catch; every other kind raises the
    engine-neutral :class:`ConcurrentRunError`."""
    if kind == "plan":
        return ConcurrentPlanRunError(message)
    return ConcurrentRunError(message)


def describe_owner(head: RunHead) -> str:
    """``run 3f2a... (pid 123 on host h, lease until 12:00:01)`` for error messages."""
    until = time.strftime("%H:%M:%S", time.localtime(head.lease_until))
    return f"run {head.run_uid} (pid {head.pid} on host {head.host}, lease until {until})"


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """A journal row's data or a ``writes=`` value an engine has already encoded as JSON
    text (``dumps`` of a JSON-ready value), committed as it is: an engine that journals a
    value and also writes it (a Plan step's payload) encodes it once, not twice."""

    text: str


def _encode(key: str, value: Any, kind: str | None, name: Any) -> str:
    """JSON text of an engine's already JSON-ready value (a journal row of ``kind`` and
    ``name``, or with ``kind`` None the ``writes=`` value of key ``name``) for the run
    under ``key``; a value that is not one is an engine bug, reported naming the run and
    the value instead of a bare TypeError."""
    if type(value) is Encoded:
        return value.text
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        what = f"writes[{name!r}]" if kind is None else f"journal row {kind} {name!r}"
        raise SerializationError(
            f"run {key!r}: {what} is not JSON-ready ({exc}); nothing was written. "
            "Engines convert values with to_json_value()/to_typed_json() before committing"
        ) from exc


def _journal_rows(
    key: str,
    rows: Sequence[tuple[str, str | None, Any]],
    seq: int,
    started: float | None = None,
    committed: float | None = None,
) -> list[JournalRow]:
    """``(kind, name, json_data)`` rows of the run under ``key`` as journal rows numbered
    from ``seq``, with the times of the work they record."""
    out: list[JournalRow] = []
    for kind, name, data in rows:
        out.append(JournalRow(seq, kind, name, _encode(key, data, kind, name), started, committed))
        seq += 1
    return out


@dataclasses.dataclass(eq=False)
class OwnedRun:
    """A run this process owns: commit steps through it, then :meth:`release` it.

    Its lease follows the store's :class:`LeasePolicy` (``Store(lease_seconds=...)``).
    """

    store: Store
    head: RunHead
    #: The store's lease policy, when the caller has it at hand (a claim does).
    policy: dataclasses.InitVar[LeasePolicy | None] = None
    lease: LeasePolicy = dataclasses.field(init=False)
    #: Whether async commits join the loop's group commit (decided once: a store keeps
    #: its backend).
    _grouped: bool = dataclasses.field(init=False, repr=False)

    def __post_init__(self, policy: LeasePolicy | None) -> None:
        self.lease = policy if policy is not None else LeasePolicy.of(self.store)
        self._grouped = can_group(self.store.backend)

    @property
    def key(self) -> str:
        """The checkpoint key."""
        return self.head.key

    @property
    def run_uid(self) -> str:
        """This run's ownership stamp."""
        return self.head.run_uid

    def derived_key(self, where: str) -> str:
        """A key derived from this run of the key: ``"<key>:<origin>:<where>"`` (a run
        started before origins: ``"<key>:<where>"``). The same on every resume; another
        run of the key (a fresh start, a retry's rewind, a fork) derives other keys."""
        origin = self.head.meta.get("origin")
        return f"{self.key}:{origin}:{where}" if isinstance(origin, str) else f"{self.key}:{where}"

    def _next_head(
        self,
        *,
        status: str,
        next_step: str | None,
        iteration: int | None,
        meta: dict[str, Any] | None,
        n_rows: int,
    ) -> RunHead:
        now = self.store.backend.clock()
        head = self.head
        # Built field by field: ``dataclasses.replace`` costs twice as much, on every step.
        return RunHead(
            key=head.key,
            kind=head.kind,
            status=status,
            next_step=next_step,
            run_uid=head.run_uid,
            version=head.version + 1,
            iteration=head.iteration if iteration is None else iteration,
            journal_len=head.journal_len + n_rows,
            host=head.host,
            pid=head.pid,
            pid_start=head.pid_start,
            lease_until=self.lease.until(now),
            meta=head.meta if meta is None else _with_origin(meta, head.meta),
            created_at=head.created_at,
            updated_at=now,
        )

    def clock(self) -> float:
        """Now, on the database's clock (:meth:`Backend.clock`): when a step starts, for
        the ``started=`` of its commit."""
        return self.store.backend.clock()

    def _prepare(
        self,
        status: str,
        next_step: str | None,
        iteration: int | None,
        meta: dict[str, Any] | None,
        rows: Sequence[tuple[str, str | None, Any]],
        writes: Sequence[tuple[str, Any]],
        started: float | None = None,
    ) -> tuple[RunHead, list[JournalRow], list[tuple[str, str]]]:
        # By default the work began when this run last committed (or was claimed): the
        # head's updated_at, read before it moves on.
        began = self.head.updated_at if started is None else started
        new = self._next_head(
            status=status, next_step=next_step, iteration=iteration, meta=meta, n_rows=len(rows)
        )
        encoded = [
            (check_key(k, "writes= key", new=True), _encode(self.key, v, None, k))
            for k, v in writes
        ]
        journal = _journal_rows(self.key, rows, self.head.journal_len, began, new.updated_at)
        return new, journal, encoded

    def commit_sync(
        self,
        *,
        status: str,
        next_step: str | None,
        iteration: int | None = None,
        meta: dict[str, Any] | None = None,
        rows: Sequence[tuple[str, str | None, Any]] = (),
        writes: Sequence[tuple[str, Any]] = (),
        extras: ExtraWrites | None = None,
        started: float | None = None,
    ) -> None:
        """Commit one step: new head, journal rows (``(kind, name, json_data)``) and
        ``writes`` (``(key, json_value)``), in one transaction. A row's data or a value
        may be :class:`Encoded` (already JSON text). ``extras``: the run's timers,
        messages consumed, events and stream values written in that same transaction
        (``store/_extras.py``). Each row records when its work started (``started``, a
        :meth:`clock` time; by default when this run last committed or was claimed) and
        when it committed (the new head's time).

        Raises:
            ConcurrentRunError: another run took the key over (this run's lease had
                expired); nothing was written (``ConcurrentPlanRunError`` for a Plan).
            CorruptRecordError: a message in ``extras.consume`` is not a pending message
                of this run; nothing was written.
        """
        new, journal, encoded = self._prepare(
            status, next_step, iteration, meta, rows, writes, started
        )
        if not self._write(new, self.head.version, journal, encoded, extras):
            new = self._cancelled(new, journal, encoded, extras)
        self.head = new

    def _write(
        self,
        new: RunHead,
        expected: int,
        journal: list[JournalRow],
        encoded: list[tuple[str, str]],
        extras: ExtraWrites | None,
    ) -> bool:
        """The backend's commit, with the run's extra records when there are any."""
        backend = self.store.backend
        if extras:
            return backend.run_commit_extras(new, expected, journal, encoded, extras)
        if self._grouped:  # shared with the commits other threads make at the same moment
            return shared_commit(backend, (new, expected, journal, encoded))
        return backend.run_commit(new, expected, journal, encoded)

    async def commit(
        self,
        *,
        status: str,
        next_step: str | None,
        iteration: int | None = None,
        meta: dict[str, Any] | None = None,
        rows: Sequence[tuple[str, str | None, Any]] = (),
        writes: Sequence[tuple[str, Any]] = (),
        extras: ExtraWrites | None = None,
        started: float | None = None,
    ) -> None:
        """Async :meth:`commit_sync`. Local files (``Backend.commit_inline``) commit on the
        loop thread, grouped with the commits of other runs on the same loop that are ready
        at the same moment (one transaction, one fsync; each run's compare-and-swap still
        checked on its own); PostgreSQL on an async connection awaited on the loop
        (``Backend.async_commit``); other network backends from a worker thread. A commit
        with ``extras`` is its own transaction (``blocking_call``'s rule)."""
        new, journal, encoded = self._prepare(
            status, next_step, iteration, meta, rows, writes, started
        )
        backend = self.store.backend
        if extras:
            ok = await blocking_call(
                self.store, self._write, new, self.head.version, journal, encoded, extras
            )
            if not ok:
                new = await blocking_call(
                    self.store, self._cancelled, new, journal, encoded, extras
                )
            self.head = new
            return
        if may_block_loop():  # a sync call's private loop: nothing else to run meanwhile
            if self._grouped:  # shared with the commits other threads make meanwhile
                ok = shared_commit(backend, (new, self.head.version, journal, encoded))
            else:
                ok = backend.run_commit(new, self.head.version, journal, encoded)
        elif self._grouped:
            ok = await group_commit(backend, (new, self.head.version, journal, encoded))
        elif backend.async_commit:
            ok = await backend.arun_commit(new, self.head.version, journal, encoded)
        else:
            ok = await blocking_call(
                self.store, backend.run_commit, new, self.head.version, journal, encoded
            )
        if not ok:
            new = await blocking_call(self.store, self._cancelled, new, journal, encoded)
        self.head = new

    def _cancelled(
        self,
        new: RunHead,
        journal: list[JournalRow],
        encoded: list[tuple[str, str]],
        extras: ExtraWrites | None = None,
    ) -> RunHead:
        """A commit missed its version: an operator's cancel (``cancel_run``) or a lost run.

        On a cancel request for this very run, the step is committed all the same (as
        ``failed`` with a ``RunCancelledError``, unless it finished the run) and
        ``RunCancelledError`` stops the engine; otherwise the ownership error.
        Returns the committed head only when the run finished despite the cancel.
        """
        current = self.store.backend.run_get(self.key)
        request = current.meta.get("cancel_requested") if current is not None else None
        if current is None or current.run_uid != self.run_uid or not request:
            raise self._lost()
        from stepstone.durable._operate import cancel_error

        reason = str(request.get("reason", "cancelled"))
        meta = {k: v for k, v in new.meta.items() if k != "cancel_requested"}
        if new.status != "done":
            meta = {**meta, "cancelled": request, "error": cancel_error(new, reason)}
            new = new.replace(status="failed", lease_until=self.store.backend.clock())
        final = new.replace(version=current.version + 1, meta=meta)
        if not self._write(final, current.version, journal, encoded, extras):
            raise self._lost()
        self.head = final
        if final.status != "done":
            keeper.remove(self)
            raise RunCancelledError(
                f"run {self.run_uid} of {self.key!r} was cancelled ({reason}): the step it "
                f"was running was committed and it stopped before {final.next_step!r}. "
                "Resume it to continue (resume=True for a Plan, resume_invocation= for a graph)"
            )
        return final

    def _lost(self) -> ConcurrentRunError:
        current = self.store.backend.run_get(self.key)
        who = describe_owner(current) if current is not None else "a delete"
        return ownership_error(
            self.head.kind,
            f"run {self.run_uid} lost checkpoint {self.key!r} to {who}: its lease had "
            f"expired (lease_seconds={self.lease.seconds}) or the key was deleted; "
            "nothing was written. Raise Store(lease_seconds=...) if steps block the process "
            "for longer than that",
        )

    def journal(self, since_seq: int = 0) -> list[JournalRow]:
        """This run's journal rows (all runs of the key since its last fresh start)."""
        return self.store.backend.run_journal(self.key, since_seq)

    async def ajournal(self, since_seq: int = 0) -> list[JournalRow]:
        """Async :meth:`journal`."""
        return await blocking_call(self.store, self.journal, since_seq, bulk=True)

    def lease_due(self) -> bool:
        """Whether the lease should be renewed now (:meth:`LeasePolicy.due`, judged on the
        database's clock, which set the lease)."""
        return self.lease.due(self.head.lease_until, self.store.backend.clock())

    def renew(self) -> None:
        """Extend the lease (called by the lease keeper thread)."""
        until = self.lease.until(self.store.backend.clock())
        if self.store.backend.run_renew(self.key, self.run_uid, until):
            self.head = self.head.replace(lease_until=until)
        else:
            keeper.remove(self)

    def release(self) -> None:
        """Stop renewing the lease (the run reached a terminal status or crashed).

        A run released before reaching a terminal status (a crash its engine could not
        record, a resume refused after the claim) has its lease expired in the database, so
        the next ``resume=True`` takes it over at once, from any thread or process.
        """
        keeper.remove(self)
        drain(self.store.backend)  # commits of this loop still pending land first
        leave(self.store.backend, self.key)
        if self.head.status not in LIVE_STATUSES:
            return
        try:
            if self.store.backend.run_renew(self.key, self.run_uid, 0.0):
                self.head = self.head.replace(lease_until=0.0)
        except Exception:
            # This process still knows the run is over: a resume from here may take it
            # over at once; other processes wait for the lease to expire.
            mark_released(self.run_uid)
            log.warning("stepstone: expiring the lease of %r failed", self.key, exc_info=True)


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimResult:
    """What :func:`claim_run` found and did.

    Attributes:
        outcome: ``"fresh"`` (new run from the start), ``"resumed"`` (took over a paused,
            failed or dead run where it stopped) or ``"done"`` (``resume=True`` on a
            finished run: nothing claimed).
        head: The head now stored.
        run: The owned run, None when ``outcome == "done"``.
        previous: The head found before the claim, if any.
    """

    outcome: Outcome
    head: RunHead
    run: OwnedRun | None
    previous: RunHead | None


@dataclasses.dataclass(slots=True)
class _Decision:
    """What :func:`claim_run`'s transaction callback decided (it may run more than once;
    the last call wins); ``"occupied"``: a :func:`claim_empty` found the key taken."""

    previous: RunHead | None = None
    outcome: Outcome | Literal["occupied"] = "fresh"


def claim_run(
    store: Store,
    key: str,
    *,
    kind: str,
    resume: bool,
    first_step: str | None,
    meta: dict[str, Any] | None = None,
    legacy_import: LegacyImport | None = None,
    check_resume: Callable[[RunHead], Literal["fresh"] | None] | None = None,
    run_uid: str | None = None,
    what: str = "run",
    first_rows: Sequence[tuple[str, str | None, Any]] = (),
) -> ClaimResult:
    """Claim ``key`` for a new run of ``kind`` (or take over a resumable one).

    Args:
        store: Where the run lives.
        key: The checkpoint key.
        kind: The engine's run kind; a key holding another kind is refused.
        resume: Take over a paused, failed or dead run (and short-circuit a done one)
            instead of starting fresh.
        first_step: ``next_step`` of a fresh run.
        meta: Head meta of a fresh run (merged into a resumed run's meta).
        legacy_import: Turns a plain value found under ``key`` into a run (an older
            checkpoint format); returns None when the value is not one.
        check_resume: Called with the head about to be taken over (or short-circuited as
            done); raising refuses the resume and writes nothing; returning ``"fresh"``
            starts the run over instead (as ``resume=False`` would).
        run_uid: The new run's stamp (default: a fresh one).
        what: How to call the run in messages (``"Plan"``).
        first_rows: Journal rows (``(kind, name, json_data)``, as for
            :meth:`OwnedRun.commit`) a fresh run starts with, written in the claim's own
            transaction: a run whose record means nothing without them (a graph
            invocation's start row) never exists without them, whenever its process dies.
            A run taken over (``"resumed"``) writes none.

    :func:`claim_empty` claims only a key that holds nothing.

    Raises:
        ConcurrentRunError: a live run owns ``key`` (``ConcurrentPlanRunError`` for a
            Plan, whose message also suggests ``on_concurrent='fork'``).
        StoreKeyConflictError: ``key`` holds a plain value or another kind of run.
    """
    decide, finish = _claimer(
        store,
        key,
        kind=kind,
        resume=resume,
        first_step=first_step,
        meta=meta,
        legacy_import=legacy_import,
        check_resume=check_resume,
        run_uid=run_uid,
        what=what,
        first_rows=first_rows,
    )
    claimed = finish(_claim(store, key, decide))
    assert claimed is not None  # only a claim_empty finds the key occupied
    return claimed


def claim_empty(store: Store, key: str, **options: Any) -> ClaimResult | None:
    """:func:`claim_run` of a fresh run (same arguments), only when ``key`` holds nothing:
    None, with nothing written, when it holds a run or a value. One round trip on
    PostgreSQL either way; an engine that must read and check what a key holds before a
    resume claims it (leaving a record it refuses as it was) tries this first, and reads
    only when the key is taken."""
    decide, finish = _claimer(store, key, only_if_empty=True, **options)
    return finish(_claim(store, key, decide))


def _claim(store: Store, key: str, decide: Decide) -> RunHead | None:
    """``run_claim`` of the store's backend; on SQLite through the backend's turns, shared
    with the commits and claims other threads make at the same moment."""
    backend = store.backend
    if can_group_claims(backend):
        return shared_claim(backend, key, decide)
    return backend.run_claim(key, decide)


def _claimer(
    store: Store,
    key: str,
    *,
    kind: str,
    resume: bool,
    first_step: str | None,
    meta: dict[str, Any] | None = None,
    legacy_import: LegacyImport | None = None,
    check_resume: Callable[[RunHead], Literal["fresh"] | None] | None = None,
    run_uid: str | None = None,
    what: str = "run",
    only_if_empty: bool = False,
    first_rows: Sequence[tuple[str, str | None, Any]] = (),
) -> tuple[Decide, Callable[[RunHead | None], ClaimResult | None]]:
    """The transaction callback of :func:`claim_run` and what turns the head it leaves
    into the :class:`ClaimResult` (the claim itself may run in a group commit)."""
    check_key(key, f"{what} key", new=True)
    lease = LeasePolicy.of(store)
    uid = run_uid or new_uid()
    decision = _Decision()
    # encoded once, outside the transaction; they record the claim: its start, and its
    # commit (the claim's time, set inside the transaction)
    start_rows = _journal_rows(key, first_rows, 0, store.backend.clock() if first_rows else None)

    def decide(head: RunHead | None, kv_text: str | None) -> Claim | None:
        if only_if_empty and (head is not None or kv_text is not None):
            decision.outcome = "occupied"
            return None
        now = store.backend.clock()  # leases are judged by the database's clock
        imported: list[JournalRow] = []
        drop_kv = False
        if head is None and kv_text is not None:
            head, imported = _legacy_head(key, kv_text, legacy_import, kind, resume, what)
            drop_kv = True
        decision.previous = head
        if head is not None:
            _refuse_taking(key, head, kind, now)
        base = lease.claim(now, uid)
        verdict = check_resume(head) if head is not None and resume and check_resume else None
        if head is not None and resume and verdict != "fresh":
            return _taken_over(decision, head, imported, drop_kv, meta, base)
        decision.outcome = "fresh"
        new = RunHead(
            key=key,
            kind=kind,
            next_step=first_step,
            version=(head.version + 1) if head is not None else 1,
            iteration=0,
            journal_len=len(start_rows),
            # a stamp of this run of the key, kept by its resumes (an engine may give its
            # own): keys derived from the run differ from those of another run of the key
            meta={"origin": new_origin(), **(meta or {})},
            created_at=now,
            **base,
        )
        stamped = [dataclasses.replace(r, committed_at=now) for r in start_rows]
        return Claim(head=new, reset_journal=True, rows=stamped, drop_kv=drop_kv)

    def finish(head: RunHead | None) -> ClaimResult | None:
        if decision.outcome == "occupied":
            return None
        assert head is not None  # decide either wrote a head or found a done one
        if decision.outcome == "done":
            return ClaimResult("done", head, None, decision.previous)
        run = OwnedRun(store, head, lease)
        keeper.add(run)
        return ClaimResult(decision.outcome, head, run, decision.previous)

    return decide, finish


def _legacy_head(
    key: str,
    kv_text: str,
    legacy_import: LegacyImport | None,
    kind: str,
    resume: bool,
    what: str,
) -> tuple[RunHead, list[JournalRow]]:
    """The head and rows of the older-format record ``key`` holds as a plain value
    (``kv_text``), imported by the engine's ``legacy_import``.

    Raises:
        StoreKeyConflictError: the value is not such a record.
        ConcurrentRunError: a fresh run would overwrite one that may still be running.
    """
    legacy = legacy_import(key, kv_text) if legacy_import is not None else None
    if legacy is None:
        raise StoreKeyConflictError(
            f"checkpoint_key {key!r} already holds a plain value that is not a "
            f"{what} checkpoint; refusing to overwrite it. Use another checkpoint_key "
            f"or remove the value with store.delete({key!r})"
        )
    head, imported = legacy
    if not resume and head.status in ("claimed", "running"):
        # An old-format record names no owner: the process that stored it may be
        # running it still, so a fresh run may not overwrite it.
        raise ownership_error(
            kind,
            f"checkpoint_key {key!r} holds a {what} checkpoint in an older format "
            f"with status {head.status!r}, run {head.run_uid}; a run in that format "
            "names no owner, so it may still be running. Continue it with "
            f"resume=True (it is imported and resumed where it stopped), or, once no "
            f"process runs it, remove it with store.delete({key!r}) to start over",
        )
    return head, imported


def _refuse_taking(key: str, head: RunHead, kind: str, now: float) -> None:
    """Refuse a claim of ``key`` over ``head``: a run of another kind, or a live one.

    Raises:
        StoreKeyConflictError: ``head`` is not a ``kind`` run.
        ConcurrentRunError: its owner is alive at ``now`` (the database's clock).
    """
    if head.kind != kind:
        unknown = (
            ""
            if has_run_view(head.kind)
            else f" (no engine stepstone knows writes {head.kind!r} runs: unless one of "
            "yours does, a damaged byte changed the record's kind)"
        )
        raise StoreKeyConflictError(
            f"checkpoint_key {key!r} holds a {head.kind} run, not a {kind} run{unknown}; "
            f"use another key or remove it with store.delete({key!r})"
        )
    if owner_alive(head, now=now):
        fork = " (on_concurrent='fork' does that for fan-out)" if kind == "plan" else ""
        raise ownership_error(
            kind,
            f"checkpoint_key {key!r} is owned by live {describe_owner(head)}, status "
            f"{head.status!r}. Wait for it to finish, or use a distinct key per run{fork}",
        )


def _taken_over(
    decision: _Decision,
    head: RunHead,
    imported: list[JournalRow],
    drop_kv: bool,
    meta: dict[str, Any] | None,
    base: dict[str, Any],
) -> Claim | None:
    """A resume's claim of ``head``: a done run is only reported (an imported one is
    written in the new format), another is taken over with the owner fields ``base``."""
    if head.status == "done":
        decision.outcome = "done"
        return Claim(head=head, rows=imported, drop_kv=True) if drop_kv else None
    decision.outcome = "resumed"
    merged = {**head.meta, **(meta or {})}
    new = head.replace(version=head.version + 1, meta=merged, **base)
    return Claim(head=new, rows=imported, drop_kv=drop_kv)


async def aclaim_run(store: Store, key: str, **options: Any) -> ClaimResult:
    """Async :func:`claim_run` (same arguments), called by the kernel's one rule for
    backend calls from async code (``blocking_call``); on SQLite, with other tasks on the
    loop, the claim joins the group commit of the loop's runs."""
    claimed = await _aclaim(store, key, options, only_if_empty=False)
    assert claimed is not None
    return claimed


async def aclaim_empty(store: Store, key: str, **options: Any) -> ClaimResult | None:
    """Async :func:`claim_empty`, as :func:`aclaim_run` is :func:`claim_run`'s."""
    return await _aclaim(store, key, options, only_if_empty=True)


async def _aclaim(
    store: Store, key: str, options: dict[str, Any], *, only_if_empty: bool
) -> ClaimResult | None:
    if can_group_claims(store.backend) and not may_block_loop():
        decide, finish = _claimer(store, key, only_if_empty=only_if_empty, **options)
        try:
            claimed = finish(await group_transact(store.backend, key, decide))
        except BaseException:
            leave(store.backend, key)
            raise
        if claimed is None or claimed.run is None:
            leave(store.backend, key)
        return claimed
    if store.backend.async_commit and not may_block_loop():
        decide, finish = _claimer(store, key, only_if_empty=only_if_empty, **options)
        return finish(await store.backend.arun_claim(key, decide))
    claim = claim_empty if only_if_empty else claim_run
    return await blocking_call(store, lambda: claim(store, key, **options))
