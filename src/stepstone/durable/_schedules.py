"""Schedules: a queued run at every tick of a cron expression, started by the workers.

``schedule(store, target, cron="0 3 * * *", name="nightly", queue="etl")`` stores the
schedule in the store's database. Every worker serving ``queue`` looks at the schedules due
about once a second (:func:`fire_due`); the worker that handles a tick moves the
schedule's next tick and queues that tick's run in one transaction, so each tick queues
exactly one run whatever the number of workers (the tick is also the run's dedupe key).

Cron expressions are read by ``cronsim`` (a maintained library, never by hand): the
standard five fields (minute, hour, day of month, month, day of week), or six with a
leading seconds field, in the schedule's time zone (UTC by default).

Ticks that came while no worker ran (the workers were down, or the schedule's queue had
none) are *missed*: a tick is on time while a worker sees it within ``grace`` seconds of
its time, missed after. ``catch_up`` says what missed ticks become: ``"one"`` run (the
latest of them; the default), ``"all"`` (a run each), or ``"none"``. On-time ticks always
run. A paused schedule queues nothing; resumed, it starts from the next tick after now.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from stepstone.core import Envelope
from stepstone.core._ids import new_uid
from stepstone.durable._queue import (
    check_int,
    check_name,
    check_number,
    existing_queue,
    queue_backend,
    resolve_target,
    start_envelope,
    target_path,
)
from stepstone.exceptions import ConfigurationError, ConfigurationTypeError, UserError
from stepstone.store._queue_base import QueueBackend, ScheduleRow, TickEntry
from stepstone.store._store import Store

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "CatchUp",
    "Schedule",
    "ScheduleInfo",
    "fire_due",
    "list_schedules",
    "schedule",
]

CatchUp = Literal["one", "all", "none"]

#: The most ticks one look queues for one schedule (``catch_up="all"`` after a long
#: outage): the rest are queued by the next looks, a second apart.
MAX_TICKS_PER_LOOK = 1000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    """A schedule as stored.

    Attributes:
        name: Its name.
        target: Import path of what each tick runs.
        cron: Its cron expression.
        timezone: The time zone the expression is read in.
        queue: The queue its runs go to.
        catch_up: What missed ticks become (``one``, ``all``, ``none``).
        grace: Seconds within which a tick still counts as on time.
        paused: Whether it is paused.
        next_tick: The next tick not handled yet (aware datetime, UTC).
        last_tick: The last tick that queued a run (None: none yet).
    """

    name: str
    target: str
    cron: str
    timezone: str
    queue: str
    catch_up: str
    grace: float
    paused: bool
    next_tick: datetime
    last_tick: datetime | None

    @classmethod
    def of(cls, row: ScheduleRow) -> ScheduleInfo:
        last = None if row.last_tick is None else datetime.fromtimestamp(row.last_tick, UTC)
        return cls(
            name=row.name,
            target=row.target,
            cron=row.cron,
            timezone=row.timezone,
            queue=row.queue,
            catch_up=row.catch_up,
            grace=row.grace,
            paused=row.paused,
            next_tick=datetime.fromtimestamp(row.next_tick, UTC),
            last_tick=last,
        )


class Schedule:
    """A stored schedule: look at it, pause, resume or delete it.

    ``Schedule(store, name)`` names one (it need not exist: :meth:`info` then raises).
    """

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = check_name("name", name)

    def __repr__(self) -> str:
        return f"Schedule({self.name!r})"

    def _queue(self) -> QueueBackend:
        return queue_backend(self.store)

    def info(self) -> ScheduleInfo:
        """The schedule as stored now.

        Raises:
            UserError: there is no schedule of that name.
        """
        row = self._queue().schedule_get(self.name)
        if row is None:
            raise _missing(self.store, self.name)
        return ScheduleInfo.of(row)

    def pause(self) -> None:
        """Queue nothing until :meth:`resume`."""
        if not self._queue().schedule_pause(self.name, True, None):
            raise _missing(self.store, self.name)

    def resume(self) -> None:
        """Queue runs again, from the next tick after now (ticks while paused are skipped)."""
        queue = self._queue()
        row = queue.schedule_get(self.name)
        if row is None:
            raise _missing(self.store, self.name)
        nxt = next_tick(row.cron, row.timezone, queue.now())
        if not queue.schedule_pause(self.name, False, nxt):
            raise _missing(self.store, self.name)

    def delete(self) -> bool:
        """Delete the schedule (runs it queued stay); False if there was none."""
        return self._queue().schedule_delete(self.name)


def _missing(store: Store, name: str) -> UserError:
    return UserError(
        f"no schedule {name!r} in {store!r}; `stepstone schedules` lists the schedules"
    )


def _cron(cron: Any, timezone: Any) -> ZoneInfo:
    """Check ``cron`` and ``timezone``; the time zone.

    Raises:
        ConfigurationError: either cannot be read, naming it and the fix.
    """
    if not isinstance(timezone, str) or not timezone:
        raise ConfigurationError(
            f"timezone must be an IANA time zone name such as 'UTC' or 'Europe/Paris', "
            f"got {timezone!r:.80}"
        )
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"timezone {timezone!r} is not a time zone this machine knows; use an IANA name "
            "such as 'UTC' or 'Europe/Paris' (on Windows, pip install tzdata)"
        ) from None
    if not isinstance(cron, str) or len(cron.split()) not in (5, 6):
        raise ConfigurationError(
            f"cron must be a cron expression of 5 fields (minute hour day-of-month month "
            f"day-of-week, e.g. '0 3 * * *') or 6 with a leading seconds field "
            f"('*/10 * * * * *'), got {cron!r:.80}"
        )
    try:
        next(CronSim(cron, datetime.now(zone)))
    except (CronSimError, StopIteration) as exc:
        raise ConfigurationError(
            f"cron {cron!r} cannot be read ({exc or 'it never fires'}); fields are "
            "[second] minute hour day-of-month month day-of-week, e.g. '0 3 * * *'"
        ) from None
    return zone


def next_tick(cron: str, timezone: str, after: float) -> float:
    """The first tick of ``cron`` (in ``timezone``) strictly after unix time ``after``."""
    zone = ZoneInfo(timezone)
    start = datetime.fromtimestamp(math.floor(after), zone)
    return next(CronSim(cron, start)).timestamp()


def _latest_tick(cron: str, zone: ZoneInfo, at_or_before: float) -> float | None:
    """The last tick at or before unix time ``at_or_before`` (ticks are whole seconds)."""
    start = datetime.fromtimestamp(math.floor(at_or_before) + 1, zone)
    try:
        return next(CronSim(cron, start, reverse=True)).timestamp()
    except StopIteration:
        return None


def ticks_to_fire(row: ScheduleRow, now: float) -> tuple[list[float], float]:
    """The ticks of ``row`` to queue runs for at unix time ``now``, and its next tick
    after them (see the module docstring for on-time and missed ticks)."""
    zone = ZoneInfo(row.timezone)
    first = row.next_tick
    if first > now:
        return [], first
    on_time_from = max(first, now - row.grace)
    start = first if row.catch_up == "all" else on_time_from
    fired: list[float] = []
    tick = start if _is_tick(row.cron, zone, start) else next_tick(row.cron, row.timezone, start)
    while tick <= now and len(fired) < MAX_TICKS_PER_LOOK:
        fired.append(tick)
        tick = next_tick(row.cron, row.timezone, tick)
    if row.catch_up == "one" and first < on_time_from:
        missed = _latest_tick(row.cron, zone, math.ceil(on_time_from) - 1)
        if missed is not None and missed >= first and missed not in fired:
            fired.insert(0, missed)
    return fired, tick


def _is_tick(cron: str, zone: ZoneInfo, at: float) -> bool:
    return at == math.floor(at) and _latest_tick(cron, zone, at) == at


def _tick_text(tick: float) -> str:
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_entry(row: ScheduleRow, tick: float) -> TickEntry:
    """The queue entry of ``row``'s tick at unix time ``tick``: its run key is
    ``"<name>@<tick, ISO 8601 UTC>"``, its dedupe key the same under ``stepstone.schedule:``,
    and its start envelope the schedule's with ``metadata["schedule"]`` (the name) and
    ``metadata["tick"]`` (the tick, ISO 8601 UTC) added."""
    when = _tick_text(tick)
    env = json.loads(row.task)
    env["metadata"] = {**(env.get("metadata") or {}), "schedule": row.name, "tick": when}
    return TickEntry(
        id=new_uid(),
        tick=tick,
        task=json.dumps(env, separators=(",", ":")),
        run_key=f"{row.name}@{when}",
        dedupe_key=f"stepstone.schedule:{row.name}@{when}",
    )


def fire_due(queue: QueueBackend, queues: Sequence[str]) -> int:
    """Queue the runs of every due tick of the schedules of ``queues``; returns how many
    runs were queued. Safe from any number of workers at once: a schedule's next tick moves
    with its runs in one transaction, which only one of them makes."""
    queued = 0
    for row in queue.schedules_due(queues):
        now = queue.now()
        ticks, nxt = ticks_to_fire(row, now)
        entries = [tick_entry(row, t) for t in ticks]
        got = queue.schedule_fire(row.name, row.next_tick, nxt, entries)
        queued += len(got or ())
    return queued


def schedule(
    store: Store,
    target: Any,
    *,
    cron: str,
    name: str | None = None,
    queue: str = "default",
    task: str | Envelope[Any] | BaseModel = "",
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    priority: int = 0,
    max_attempts: int = 3,
    catch_up: CatchUp = "one",
    grace: float = 60.0,
    timezone: str = "UTC",
    paused: bool = False,
) -> Schedule:
    """Queue a run of ``target`` at every tick of ``cron``; returns the :class:`Schedule`.

    Storing a schedule under a name that exists replaces its definition; its next tick is
    kept when the expression and time zone did not change.

    Args:
        store: The store the workers use (SQLite file or PostgreSQL).
        target: What each tick runs, as for :func:`~stepstone.submit` (an object defined at
            module level, or its import path ``"package.module:name"``).
        cron: Five fields (``"0 3 * * *"``: 03:00 every day), or six with a leading
            seconds field (``"*/10 * * * * *"``: every ten seconds).
        name: The schedule's name (default: the target's import path).
        queue: The queue its runs go to (the workers serving it start them).
        task: Each run's start envelope, or a task string (as for ``submit``); each run's
            envelope also carries ``metadata["schedule"]`` and ``metadata["tick"]``.
        args: For a workflow (``@workflow``), the arguments each run is called with (the
            workflow is imported now to record them as its ``submit`` does).
        kwargs: For a workflow, its keyword arguments.
        priority: Each run's priority.
        max_attempts: Each run's ``max_attempts``.
        catch_up: What ticks missed while no worker ran become: ``"one"`` run (default),
            ``"all"`` (one run each), ``"none"``.
        grace: Seconds after its time within which a tick still counts as on time.
        timezone: The IANA time zone ``cron`` is read in (``"UTC"`` by default).
        paused: Store it paused.

    Raises:
        ConfigurationError: an argument stepstone cannot use, naming it and the fix.
    """
    path = target_path(target)
    name = check_name("name", path if name is None else name)
    check_name("queue", queue)
    check_int("priority", priority, None)
    check_int("max_attempts", max_attempts, 1)
    _check_catch_up(catch_up)
    grace = check_number("grace", grace, 0)
    _cron(cron, timezone)
    text = _task_text(name, target, path, args, kwargs, task)
    qb = queue_backend(store)
    now = qb.now()
    old = qb.schedule_get(name)
    qb.schedule_put(
        ScheduleRow(
            name=name,
            target=path,
            cron=cron,
            timezone=timezone,
            queue=queue,
            task=text,
            priority=priority,
            max_attempts=max_attempts,
            catch_up=catch_up,
            grace=grace,
            paused=paused,
            next_tick=_next_tick_of(old, cron, timezone, now),
            last_tick=None if old is None else old.last_tick,
            created_at=now if old is None else old.created_at,
            updated_at=now,
        )
    )
    return Schedule(store, name)


def _check_catch_up(catch_up: str) -> None:
    if catch_up not in ("one", "all", "none"):
        raise ConfigurationError(
            f"catch_up must be 'one' (one run for the ticks missed while no worker ran), "
            f"'all' (a run each) or 'none', got {catch_up!r:.80}"
        )


def _task_text(name: str, target: Any, path: str, args: Any, kwargs: Any, task: Any) -> str:
    """The JSON text of the start envelope of the runs of schedule ``name``."""
    env = _workflow_envelope(target, path, args, kwargs, task)
    return json.dumps(
        (env or start_envelope(task)).to_dict(where=f"task of schedule {name!r}", strict=True),
        separators=(",", ":"),
    )


def _next_tick_of(old: ScheduleRow | None, cron: str, timezone: str, now: float) -> float:
    """The next tick of a schedule stored now: the one it had (``old``: as stored before)
    when its expression and time zone did not change, else the next after ``now``."""
    if old is not None and (old.cron, old.timezone) == (cron, timezone):
        return old.next_tick
    return next_tick(cron, timezone, now)


def _workflow_envelope(
    target: Any, path: str, args: Any, kwargs: Any, task: Any
) -> Envelope[Any] | None:
    """The start envelope of a scheduled workflow's runs (its arguments recorded as the
    workflow's own ``submit`` records them), or None when the target is not a workflow.

    Raises:
        ConfigurationError: ``args``/``kwargs`` for a target that is not a workflow, or
            with a ``task`` too.
    """
    given = bool(args) or bool(kwargs)
    if not isinstance(args, tuple | list) or not isinstance(kwargs, dict | None):
        raise ConfigurationTypeError(
            f"args must be a tuple or list and kwargs a dict, got {args!r:.60} and {kwargs!r:.60}"
        )
    obj = target
    if isinstance(target, str):
        if not given:
            return None  # a path: imported by the workers, as submit does
        obj = resolve_target(path)
    encode, using = getattr(obj, "encode", None), getattr(obj, "using", None)
    if not (callable(encode) and callable(using) and isinstance(getattr(obj, "name", None), str)):
        if given:
            raise ConfigurationError(
                f"args= and kwargs= are the arguments of a workflow (@workflow); {path!r} is "
                "not one: pass its start envelope or task string as task="
            )
        return None
    if task != "":
        raise ConfigurationError(
            f"schedule a workflow with args= and kwargs= (its arguments), not task=; got "
            f"task={task!r:.60}"
        )
    data = encode(tuple(args), dict(kwargs or {}))
    return Envelope(task=obj.name, payload={"workflow_args": data})


def list_schedules(store: Store) -> list[ScheduleInfo]:
    """Every schedule in ``store``, by name (none in a store without a work queue)."""
    queue = existing_queue(store)
    return [] if queue is None else [ScheduleInfo.of(row) for row in queue.schedules()]
