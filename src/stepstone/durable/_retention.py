"""Applying a :class:`~stepstone.store.Retention` policy: delete old finished runs.

A run is only ever deleted through the kernel's ownership rules: the delete first claims
the run's head with a compare-and-swap on the version it judged (so a run resumed or
restarted in between is left alone), drops its journal in that same transaction, then
removes the head. A live owner is never touched.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Literal

from stepstone.core._ids import new_uid
from stepstone.durable._leases import LeasePolicy, keeper, owner_alive
from stepstone.store._base import Claim, RunHead
from stepstone.store._retention import Retention
from stepstone.store._store import Store

__all__ = ["PruneInterrupted", "PruneReport", "PrunedRun", "Pruner", "plan_prune", "prune"]

log = logging.getLogger("stepstone")

Reason = Literal["ttl", "keep_last", "interrupted"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrunedRun:
    """One run ``prune`` deleted (or, on a dry run, would delete).

    Attributes:
        key: The run's key.
        kind: ``plan``, ``graph``, ``agent``...
        status: Its status when judged.
        updated_at: Unix time of its last commit.
        reason: ``"ttl"`` (older than the ttl), ``"keep_last"`` (beyond the newest N) or
            ``"interrupted"`` (a delete that an earlier prune started and did not finish).
        values: Plain ``writes=`` keys deleted with it (fork runs only).
    """

    key: str
    kind: str
    status: str
    updated_at: float
    reason: Reason
    values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    """What ``prune`` did.

    Attributes:
        deleted: The runs deleted (would be deleted when ``dry_run``).
        skipped_live: Keys that matched the policy but whose owner is alive.
        skipped_changed: Keys that changed between judging and deleting (left alone).
        dry_run: Nothing was written.
        skipped_young: Keys that matched the policy but were updated less than its
            ``min_age`` ago (kept).
        min_age: The policy's ``min_age`` in seconds, which kept ``skipped_young``.
    """

    deleted: list[PrunedRun]
    skipped_live: list[str]
    skipped_changed: list[str]
    dry_run: bool
    skipped_young: list[str] = dataclasses.field(default_factory=list)
    min_age: float = 0.0


class PruneInterrupted(KeyboardInterrupt):
    """A prune stopped by Ctrl-C (a ``KeyboardInterrupt``) before it was done.

    Still a ``KeyboardInterrupt``, so code that stops on one stops on this. The runs
    deleted so far are gone for good; the others are untouched (a delete cut short inside
    one run is finished by the next prune, see :func:`plan_prune`), so running the same
    prune again deletes the rest.

    Attributes:
        report: What was deleted before the interrupt.
        total: How many runs the prune had selected.
    """

    def __init__(self, report: PruneReport, total: int) -> None:
        super().__init__(
            f"prune interrupted after deleting {len(report.deleted)} of {total} run(s)"
        )
        self.report = report
        self.total = total


class _Changed(Exception):
    pass


def _is_fork(head: RunHead) -> bool:
    # A fork run's key is `<checkpoint_key>:<run_uid>` and its writes= live under `<key>:`.
    return head.key.endswith(":" + head.run_uid)


def plan_prune(
    heads: list[RunHead], retention: Retention, *, now: float | None = None
) -> tuple[list[tuple[RunHead, Reason]], list[str]]:
    """Which of ``heads`` ``retention`` deletes, oldest first, and the live ones it spares.

    Pure: reads nothing, writes nothing (``prune`` and ``prune --dry-run`` share it).
    """
    chosen, live, _ = _plan(heads, retention, now=now)
    return chosen, live


def _plan(
    heads: list[RunHead], retention: Retention, *, now: float | None = None
) -> tuple[list[tuple[RunHead, Reason]], list[str], list[str]]:
    """:func:`plan_prune`, and the keys the policy selects but ``min_age`` keeps."""
    now = time.time() if now is None else now
    chosen: dict[str, tuple[RunHead, Reason]] = {}
    live: list[str] = []
    young: list[str] = []
    min_age = retention.min_age.total_seconds()
    ttl = retention.ttl.total_seconds() if retention.ttl is not None else None
    for prefix in retention.prefixes:
        group = [h for h in heads if h.key.startswith(prefix)]
        # A prune that died between claiming a run and deleting it left a claimed, empty
        # head marked "pruning": finish that delete whatever the policy says.
        for head in group:
            if head.meta.get("pruning") and not owner_alive(head):
                chosen[head.key] = (head, "interrupted")
        matching = [
            h for h in group if h.status in retention.statuses and not h.meta.get("pruning")
        ]
        matching.sort(key=lambda h: (h.updated_at, h.key), reverse=True)
        for rank, head in enumerate(matching):
            age = now - head.updated_at
            reason = _reason(age, rank, ttl, retention.keep_last)
            if reason is None or head.key in chosen:
                continue
            if age < min_age:
                if head.key not in young:
                    young.append(head.key)
                continue
            if owner_alive(head):  # liveness is judged on the real clock, whatever ``now`` says
                if head.key not in live:
                    live.append(head.key)
                continue
            chosen[head.key] = (head, reason)
    ordered = sorted(chosen.values(), key=lambda c: (c[0].updated_at, c[0].key))
    return ordered, live, [key for key in young if key not in chosen]


def _reason(age: float, rank: int, ttl: float | None, keep_last: int | None) -> Reason | None:
    """Why the policy selects a matching run ``age`` seconds old, ``rank`` in its group
    (0: the most recently updated), or None when it keeps it."""
    if ttl is not None and age > ttl:
        return "ttl"
    if keep_last is not None and rank >= keep_last:
        return "keep_last"
    return None


def prune(
    store: Store,
    retention: Retention | None = None,
    *,
    dry_run: bool = False,
    now: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PruneReport:
    """Delete the finished runs ``retention`` (default: ``store.retention``) selects.

    Each run goes in its own transactions (its journal with a compare-and-swap claim, then
    its head), so a large prune never holds the store's write lock for long and workers
    keep committing meanwhile. Fork runs take their ``writes=`` values with them.

    Args:
        store: The store to prune.
        retention: The policy; defaults to the one given as ``Store(retention=...)``.
        dry_run: Only report what would be deleted.
        now: The current unix time (for tests and reproducible reports).
        progress: Called as ``progress(0, total)`` before the first delete and
            ``progress(done, total)`` after each run. A ``KeyboardInterrupt`` it raises stops
            the prune between two runs.

    Raises:
        ValueError: no policy given here nor on the store.
        PruneInterrupted: a ``KeyboardInterrupt`` (Ctrl-C) stopped it; its ``report`` says
            what was deleted before.

    Example::

        report = prune(store, Retention(ttl=timedelta(days=30), keep_last=100))
        print(len(report.deleted), "runs deleted")
    """
    policy = retention if retention is not None else store.retention
    if policy is None:
        raise ValueError(
            f"prune() needs a policy: pass Retention(ttl=..., keep_last=...) or open the "
            f"store as Store(..., retention=Retention(...)) ({store!r} has none)"
        )
    groups = policy.prefixes
    heads = store.backend.run_list(groups[0] or None if len(groups) == 1 else None)
    now = store.backend.clock() if now is None else now
    chosen, live, young = _plan(heads, policy, now=now)
    min_age = policy.min_age.total_seconds()
    if dry_run:
        return PruneReport(
            deleted=[_pruned(h, r, _fork_values(store, h)) for h, r in chosen],
            skipped_live=live,
            skipped_changed=[],
            dry_run=True,
            skipped_young=young,
            min_age=min_age,
        )
    done: list[PrunedRun] = []
    changed: list[str] = []
    if progress is not None:
        progress(0, len(chosen))  # the deletes start
    try:
        _delete(store, chosen, progress, done, changed)
    except KeyboardInterrupt as exc:
        if isinstance(exc, PruneInterrupted):
            raise
        # What is gone is gone: say so, rather than lose the report with the interrupt.
        partial = PruneReport(
            deleted=done,
            skipped_live=live,
            skipped_changed=changed,
            dry_run=False,
            skipped_young=young,
            min_age=min_age,
        )
        raise PruneInterrupted(partial, len(chosen)) from exc
    return PruneReport(
        deleted=done,
        skipped_live=live,
        skipped_changed=changed,
        dry_run=False,
        skipped_young=young,
        min_age=min_age,
    )


def _delete(
    store: Store,
    chosen: list[tuple[RunHead, Reason]],
    progress: Callable[[int, int], None] | None,
    done: list[PrunedRun],
    changed: list[str],
) -> None:
    """Delete the ``chosen`` runs one by one, each as it was read: those deleted go to
    ``done``, the keys of those that changed meanwhile to ``changed`` (so that an interrupt
    leaves both saying what happened)."""
    for i, (head, reason) in enumerate(chosen, 1):
        values = prune_run(store, head)
        if values is None:
            changed.append(head.key)
        else:
            done.append(_pruned(head, reason, values))
        if progress is not None:
            progress(i, len(chosen))


def _pruned(head: RunHead, reason: Reason, values: Iterable[str]) -> PrunedRun:
    """What the report says of a run that went (or would go), with its values."""
    return PrunedRun(
        key=head.key,
        kind=head.kind,
        status=head.status,
        updated_at=head.updated_at,
        reason=reason,
        values=tuple(values),
    )


def _fork_values(store: Store, head: RunHead) -> list[str]:
    if not _is_fork(head):
        return []
    return [k for k, _ in store.backend.kv_items(head.key + ":")]


def prune_run(store: Store, head: RunHead) -> list[str] | None:
    """Delete the run ``head`` describes if it is still exactly that run and not live.

    Returns the fork ``writes=`` keys deleted with it, or None when the run changed (a new
    commit, a resume, a restart) or vanished since ``head`` was read: then nothing is
    deleted.
    """
    from stepstone.durable._kernel import OwnedRun

    lease, uid = LeasePolicy.of(store), new_uid()

    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        now = store.backend.clock()  # leases are judged by the database's clock
        if (
            cur is None
            or cur.version != head.version
            or cur.run_uid != head.run_uid
            or owner_alive(cur, now=now)
        ):
            raise _Changed
        # Claimed by this process while the head goes: other processes see a live owner.
        tomb = cur.replace(
            version=cur.version + 1,
            journal_len=0,
            meta={**cur.meta, "pruning": True},
            **lease.claim(now, uid),
        )
        return Claim(head=tomb, reset_journal=True)

    try:
        tomb = store.backend.run_transact(head.key, decide)
    except _Changed:
        return None
    assert tomb is not None
    owned = OwnedRun(store, tomb)
    keeper.add(owned)
    try:
        values = _fork_values(store, head)
        for key in values:
            store.backend.kv_delete(key)
        store.backend.kv_delete(head.key)
    finally:
        keeper.remove(owned)
    return values


def parse_age(text: str) -> timedelta:
    """``"30d"``, ``"12h"``, ``"15m"``, ``"90s"`` or ``"2w"`` as a timedelta.

    Raises:
        ValueError: naming the bad value and the accepted forms.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    raw = text.strip().lower()
    try:
        if not raw or raw[-1] not in units:
            raise ValueError
        value = float(raw[:-1])
        if not 0 <= value * units[raw[-1]] <= _MAX_AGE_SECONDS:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"bad age {text!r}: use a number and a unit, like 30d, 12h, 15m, 90s or 2w "
            "(at most 10000 years)"
        ) from None
    return timedelta(seconds=value * units[raw[-1]])


_MAX_AGE_SECONDS = 10_000 * 365 * 86400  # past it, a unix time of "now minus the age" overflows


class Pruner:
    """Applies a retention policy in the background, every ``every``, from a daemon thread.

    For long-lived workers: ``with Pruner(store): serve()``. Each pass is an ordinary
    :func:`prune` (so it never deletes a live or recent run); a failing pass is logged on
    the ``stepstone`` logger and the next one runs on schedule.

    Args:
        store: The store to prune.
        retention: The policy (default: ``store.retention``).
        every: Time between passes (the first pass runs at once).

    Example::

        store = Store(db="runs.sqlite", retention=Retention(ttl=timedelta(days=30)))
        with Pruner(store, every=timedelta(hours=1)):
            run_workers(store)
    """

    def __init__(
        self,
        store: Store,
        retention: Retention | None = None,
        *,
        every: timedelta = timedelta(hours=1),
    ) -> None:
        if every.total_seconds() <= 0:
            raise ValueError(f"Pruner every= must be > 0, got {every!r}")
        if retention is None and store.retention is None:
            raise ValueError(
                "Pruner needs a policy: pass Retention(...) or open the store with "
                "Store(..., retention=Retention(...))"
            )
        self.store = store
        self.retention = retention
        self.every = every.total_seconds()
        self.passes = 0
        self.deleted = 0
        self.last_report: PruneReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                report = prune(self.store, self.retention)
                self.last_report = report
                self.deleted += len(report.deleted)
            except Exception:
                log.warning("stepstone: a background prune of %r failed", self.store, exc_info=True)
            self.passes += 1
            self._stop.wait(self.every)

    def start(self) -> Pruner:
        """Start the background thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="stepstone-pruner", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current pass (waits for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Pruner:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
