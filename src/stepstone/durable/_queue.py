"""Submitting runs to a work queue, and the handle that follows one.

``submit(store, target, task)`` stores one queue entry; a :class:`~stepstone.Worker` (in
any process attached to the same store) takes it and runs it. ``target`` names the engine
by import path (``"myapp.pipelines:etl_plan"``), so the worker needs nothing but the code:
the same way :meth:`Plan.from_dict` rebinds callables by name.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import sys
import time
import weakref
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepstone.core import Envelope
from stepstone.core._ids import new_uid
from stepstone.core._serialization import is_model
from stepstone.core._threads import to_thread
from stepstone.exceptions import (
    ConfigurationError,
    ConfigurationTypeError,
    QueuedRunError,
    UserError,
)
from stepstone.store._queue_base import FINAL_STATUSES, QueueBackend, QueueEntry
from stepstone.store._store import Store, key_problem, shown_key

if TYPE_CHECKING:
    from pydantic import BaseModel

    from stepstone.durable._messages import StreamReader

__all__ = [
    "INT_BOUND",
    "RunHandle",
    "check_int",
    "check_name",
    "check_number",
    "import_path_of",
    "prune_queue",
    "queue_backend",
    "requeue_entry",
    "set_queue_limits",
    "submit",
]

_queues: weakref.WeakKeyDictionary[Store, QueueBackend] = weakref.WeakKeyDictionary()
_paths: dict[int, tuple[weakref.ref[Any], str]] = {}

#: The integers the queue stores (a priority, max_attempts, a queue's concurrency) are
#: 32-bit on PostgreSQL (INTEGER columns): each must be below this in magnitude.
INT_BOUND = 2**31


def check_name(name: str, value: Any) -> str:
    """``value`` if it can name a queue, a run key or a worker in every store: a non-empty
    str without NUL characters or lone surrogates (which no database keeps in text), of at
    most ``MAX_KEY_BYTES`` bytes (PostgreSQL indexes queue names and keys).

    Raises:
        ConfigurationError: it cannot, naming it (ConfigurationTypeError: not a str).
    """
    if not isinstance(value, str) or not value or "\0" in value or not _unicode(value):
        error = ConfigurationError if isinstance(value, str) else ConfigurationTypeError
        raise error(
            f"{name} must be a non-empty str without NUL characters or lone surrogates "
            f"(text that is not Unicode), got {value!r:.200}"
        )
    problem = key_problem(value, new=True)
    if problem is not None:
        raise ConfigurationError(f"{name} {shown_key(value)} {problem}")
    return value


def check_int(name: str, value: Any, least: int | None) -> int:
    """``value`` if it is an int (not a bool) from ``least`` to below :data:`INT_BOUND`
    (``least`` None: of magnitude below it).

    Raises:
        ConfigurationError: it is not, naming it and the range (ConfigurationTypeError:
            not an int).
    """
    bounds = f"|{name}| < 2**31" if least is None else f"{least} <= {name} < 2**31"
    error = f"{name} must be an int with {bounds}, got {value!r:.80}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationTypeError(error)
    if not (1 - INT_BOUND if least is None else least) <= value < INT_BOUND:
        raise ConfigurationError(error)
    return value


def check_number(
    name: str, value: Any, least: float, *, above: bool = False, unit: str = "seconds"
) -> float:
    """``value`` as a float if it is a finite number (an int or a float, not a bool) of at
    least ``least`` (with ``above``: more than ``least``; ``-math.inf``: any).

    Raises:
        ConfigurationError: it is not, naming it (ConfigurationTypeError: not a number).
    """
    bound = "" if least == -math.inf else f" {'>' if above else '>='} {least:g}"
    error = f"{name} must be a finite number of {unit}{bound}, got {value!r:.80}"
    number = _number(value)
    if number is None:
        raise ConfigurationTypeError(error)
    if not math.isfinite(number) or number < least or (above and number == least):
        raise ConfigurationError(error)
    return number


def _number(value: Any) -> float | None:
    """``value`` as a float if it is an int or a float (not a bool; an int too large for a
    float is infinite), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _finite(value: Any) -> bool:
    number = _number(value)
    return number is not None and math.isfinite(number)


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def queue_backend(store: Store) -> QueueBackend:
    """The work queue that lives in ``store``'s database (created on first use).

    Raises:
        ConfigurationTypeError: ``store`` is not a Store.
        UserError: a store without a work queue (the memory store).
    """
    _check_store(store)
    found = _queues.get(store)
    if found is not None:
        return found
    backend = store.backend
    queue: QueueBackend
    pg = sys.modules.get("stepstone.store._postgres")
    from stepstone.store._sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        from stepstone.store._queue_sqlite import SQLiteQueue

        queue = SQLiteQueue(backend.path, busy_timeout=backend.busy_timeout)
    elif pg is not None and isinstance(backend, pg.PostgresBackend):
        from stepstone.store._queue_postgres import PostgresQueue

        queue = PostgresQueue(backend)
    else:
        raise UserError(
            f"the work queue needs a store that worker processes can share: "
            f"Store(db='file.sqlite') or Store(url='postgresql://...'), not {store!r}"
        )
    _queues[store] = queue
    return queue


def import_path_of(obj: Any) -> str:
    """``"module:attribute"`` under which ``obj`` can be imported (a module-level name).

    Raises:
        UserError: ``obj`` is not a module-level attribute of any imported module.
    """
    cached = _paths.get(id(obj))
    if cached is not None and cached[0]() is obj:
        return cached[1]
    # An object a script imported from a module is named by that module: naming it by the
    # script would make every worker import (and so run) the script.
    found: str | None = None
    in_script: str | None = None
    for mod_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        names = [a for a, v in list(namespace.items()) if v is obj and not a.startswith("__")]
        if not names:
            continue
        path = f"{_importable_name(mod_name, module)}:{names[0]}"
        if mod_name != "__main__":
            found = path
            break
        in_script = path
    found = found or in_script
    if found is not None:
        try:
            _paths[id(obj)] = (weakref.ref(obj), found)
        except TypeError:  # not weak-referenceable: just do not cache
            pass
        return found
    raise UserError(
        f"cannot find an import path for {obj!r}: workers import the engine they run, so "
        "define it at module level (plan = Plan(...)) or pass target='package.module:name'"
    )


def _importable_name(mod_name: str, module: Any) -> str:
    if mod_name != "__main__":
        return mod_name
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)  # python -m package.module
    # python path/to/script.py: workers import it as "script" (with its folder on the path)
    return Path(str(getattr(module, "__file__", "__main__"))).stem


def resolve_target(target: str, registry: dict[str, Any] | None = None) -> Any:
    """The object ``target`` names: from ``registry`` first, else imported.

    Raises:
        UserError: the name is malformed, or its module or attribute cannot be imported.
    """
    if registry and target in registry:
        return registry[target]
    mod_name, attr = _split_path(target)
    main = sys.modules.get("__main__")
    try:
        if main is not None and mod_name == _importable_name("__main__", main):
            # the running script itself (a worker in the process that submitted): imported
            # again under its own name, it would run its top-level code a second time
            obj: Any = main
        else:
            obj = importlib.import_module(mod_name)
    except Exception as exc:
        missing = isinstance(exc, ModuleNotFoundError) and _is_part_of(exc.name, mod_name)
        fix = (
            "start the worker where that module is importable (--import-path DIR or "
            "PYTHONPATH) or register it: Worker(registry={...})"
            if missing
            else "the module was found but its code failed: fix it (or what it needs at "
            "import, such as a setting or a package) and the run can be retried"
        )
        raise UserError(
            f"target {target!r}: cannot import module {mod_name!r} ({type(exc).__name__}: "
            f"{exc}); {fix}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(
                f"target {target!r}: module {mod_name!r} has no attribute {attr!r}; check the "
                "name, or register it: Worker(registry={...})"
            ) from None
    return obj


def _is_part_of(missing: str | None, mod_name: str) -> bool:
    """Whether the module a ModuleNotFoundError names is ``mod_name`` or a package of it
    (the target's module is not there, not one its code imports)."""
    return missing is not None and (mod_name == missing or mod_name.startswith(missing + "."))


def _split_path(path: str) -> tuple[str, str]:
    """The module and attribute an import path (``"package.module:name"``) names.

    Raises:
        UserError: either part is not a dotted Python name.
    """
    mod_name, _, attr = path.partition(":")
    if not all(part.isidentifier() for part in (*mod_name.split("."), *attr.split("."))):
        raise UserError(
            f"target {path!r} is not an import path; write it as 'package.module:name' "
            "(dotted Python names)"
        )
    return mod_name, attr


def target_path(target: Any) -> str:
    """The import path of what ``submit`` was given to run: the path itself, or that of
    a Plan, a compiled graph, an Agent (the objects with a ``submit`` method) or a
    function.

    Raises:
        UserError: ``target`` is none of them, or has no import path.
    """
    if isinstance(target, str):
        path = target
    elif inspect.isfunction(target) or callable(getattr(target, "submit", None)):
        path = import_path_of(target)
    else:
        raise ConfigurationTypeError(
            f"target must be a Plan, a compiled graph, an Agent, a zero-argument function "
            f"returning one, or its import path 'package.module:name', got "
            f"{type(target).__name__} {target!r:.80}"
        )
    _split_path(path)
    return path


def start_envelope(task: Any) -> Envelope[Any]:
    """The start envelope of a queued run of ``task``: the Envelope itself, one made of a
    task string, or (for a graph) of its initial state model.

    Raises:
        UserError: ``task`` is none of them.
    """
    if not (isinstance(task, str | Envelope) or is_model(task)):
        raise UserError(
            f"task must be a str, an Envelope or (for a graph) its state model instance, got "
            f"{type(task).__name__} {task!r:.80}; wrap other values in Envelope(task=..., "
            "payload=...)"
        )
    if is_model(task):  # a graph's initial state
        return Envelope(task=type(task).__name__, payload=task.model_dump(mode="json"))
    if isinstance(task, Envelope):
        return task
    return Envelope.from_task(str(task))


def submit(
    store: Store,
    target: Any,
    task: str | Envelope[Any] | BaseModel,
    *,
    key: str | None = None,
    queue: str = "default",
    priority: int = 0,
    delay: float = 0.0,
    not_before: float | datetime | None = None,
    dedupe_key: str | None = None,
    max_attempts: int = 3,
) -> RunHandle:
    """Queue a run of ``target`` on ``task`` for a worker; returns its handle.

    Args:
        store: The store the workers use (SQLite file or PostgreSQL).
        target: What to run, as an object defined at module level or its import path
            (``"package.module:name"``): a Plan, a compiled graph, an Agent over a Plan,
            an LLM Agent (run as by :class:`~stepstone.Runner`), an Agent over a
            ``ReplanEngine``, or a zero-argument function returning one of them.
        task: The start envelope, or a task string; for a graph, its initial state.
        key: The run's checkpoint key (default: ``"<queue>/<entry id>"``). Refused while
            another entry under it is queued or running; once that one ended, the new
            entry continues its run (a done run returns its result again).
        queue: Which queue; workers serve the queues they are given.
        priority: Higher runs first (``|priority| < 2**31``).
        delay: Seconds before any worker may start it.
        not_before: Unix time (the database's clock), or a ``datetime``, before which no
            worker starts it.
        dedupe_key: A second submit with the same dedupe key returns the first handle.
        max_attempts: A run whose worker died this many times is marked failed
            (``1 <= max_attempts < 2**31``).

    Raises:
        UserError: an argument no worker could run (naming it), or ``key`` belongs to a
            run still queued or running.
    """
    check_name("queue", queue)
    for name, text in (("key", key), ("dedupe_key", dedupe_key)):
        if text is not None:
            check_name(name, text)
    check_int("priority", priority, None)
    check_int("max_attempts", max_attempts, 1)
    delay = check_number("delay", delay, 0)
    if isinstance(not_before, datetime):
        not_before = not_before.timestamp()  # a naive datetime is local time, as Python says
    elif not_before is not None and not _finite(not_before):
        raise UserError(
            f"not_before must be a unix time (seconds, the database's clock) or a datetime, "
            f"got {not_before!r}"
        )
    env = start_envelope(task)
    path = target_path(target)
    text = json.dumps(env.to_dict(where="submitted task", strict=True), separators=(",", ":"))
    qb = queue_backend(store)
    uid = new_uid()
    entry_id, _ = qb.enqueue(
        id=uid,
        queue=queue,
        target=path,
        task=text,
        run_key=key or f"{queue}/{uid}",
        priority=priority,
        delay=delay,
        not_before=not_before,
        dedupe_key=dedupe_key,
        max_attempts=max_attempts,
    )
    return RunHandle(store, entry_id)


def set_queue_limits(
    store: Store, queue: str, *, concurrency: int | None = None, rate: float | None = None
) -> None:
    """Limits every worker obeys for ``queue``, across all processes and hosts.

    Args:
        store: The store the workers use.
        queue: The queue's name.
        concurrency: At most this many of its runs running at once (None: no limit;
            below 2**31).
        rate: At most this many of its runs started per second on average, any finite
            number > 0 (None: no limit): at most ``ceil(rate)`` starts in any window of
            ``ceil(rate) / rate`` seconds, so 10 allows 10 starts in any second and 0.25
            one start in any 4 seconds.

    Per-worker limits are the workers' own (``Worker(concurrency=...)``).
    """
    check_name("queue", queue)
    if concurrency is not None:
        check_int("concurrency", concurrency, 1)
    if rate is not None:
        rate = check_number("rate", rate, 0, above=True, unit="runs per second")
    queue_backend(store).set_limits(queue, concurrency=concurrency, rate=rate)


def prune_queue(store: Store, older_than: float | timedelta, *, queue: str | None = None) -> int:
    """Delete finished queue entries (``done``, ``failed``, ``cancelled``) that ended more
    than ``older_than`` ago (seconds or a ``timedelta``, judged on the database's clock);
    returns how many were deleted.

    Their dedupe keys are free again afterwards (a new submit with one queues a new run),
    and handles of deleted entries raise ``QueuedRunError``. Queued and running
    entries are never touched; the runs' checkpoints are not either (``prune()`` and
    ``Retention`` govern those).

    Args:
        store: The store the workers use.
        older_than: Keep entries that ended more recently than this.
        queue: Only this queue's entries (None: every queue).
    """
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise UserError(
            f"older_than must be >= 0 seconds or a timedelta, got {older_than!r}; "
            "e.g. prune_queue(store, timedelta(days=7))"
        )
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise UserError(f"queue must be a non-empty str or None, got {queue!r}")
    return queue_backend(store).prune(float(seconds), queue)


def requeue_run(store: Store, key: str) -> str | None:
    """Put the queue entry of the run under ``key`` back in its queue, for a worker to run
    it again: what ``stepstone retry`` does after rewinding a run that came from a queue.

    Only a finished entry (done, failed or cancelled) is put back, runnable at once, its
    attempts, result and error cleared; its handle waits for the new outcome. Returns the
    entry's id, or None when no queue entry holds the run (it was not submitted, or its
    entry was pruned) or its entry is still queued or running. A store whose file has no
    queue is left as it is.
    """
    queue = existing_queue(store)
    return None if queue is None else queue.requeue(key)


def requeue_when_stopped(store: Store, key: str, limit: float = 30.0) -> str | None:
    """:func:`requeue_run`, for a decision that lets a paused run go on (an approval): the
    worker that paused the run may still be finishing its queue entry (``running`` a
    moment longer), so the entry is put back once it stopped, waited for up to ``limit``
    seconds; the decision is never left for nobody to apply. Returns the entry's id, or
    None (no entry holds the run, or it is still running after ``limit``)."""
    deadline = time.monotonic() + limit
    while True:
        requeued = requeue_run(store, key)
        queue = existing_queue(store)
        entry = None if queue is None else queue.latest_entry(key)
        if requeued or entry is None or entry.status not in ("running", "claimed"):
            return requeued
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


#: The fewest characters of an entry id that name it (``stepstone queue`` prints 12).
MIN_ID_CHARS = 6


def requeue_entry(store: Store, ref: str) -> QueueEntry:
    """Put a failed or cancelled queue entry back in its queue, runnable at once, its
    attempts, result and error cleared: what ``stepstone requeue`` does. Unlike
    :func:`requeue_run`, it needs no run under the entry's key, so it also sends back an
    entry that never got a checkpoint (its target failed to import, and the fix is
    deployed now).

    Args:
        store: The store holding the queue.
        ref: The entry's id, the start of it that ``stepstone queue`` prints (at least
            :data:`MIN_ID_CHARS` characters, naming one entry), or the run key of its
            latest entry.

    Returns:
        The entry as it is now (``queued``).

    Raises:
        UserError: no entry answers to ``ref`` (or several do), it is still queued or
            running, it is done, or it is not the latest entry of its run; the message
            says what to do. Nothing was changed.
    """
    queue = existing_queue(store)
    if queue is None:
        raise UserError(
            f"{store!r} has no work queue (no run was ever submitted to it), so no entry "
            f"{ref!r}; list entries with `stepstone queue`"
        )
    entries = queue.entries(None, None)
    entry = _entry_named(entries, ref)
    shown = f"queue entry {entry.id} (run {entry.run_key!r})"
    if entry.status in ("queued", "running"):
        raise UserError(f"{shown} is {entry.status}: a worker runs it; nothing was changed")
    latest = [e for e in entries if e.run_key == entry.run_key][-1]
    if latest.id != entry.id:
        raise UserError(
            f"{shown} is not the latest entry of its run; the latest is {latest.id} "
            f"({latest.status}): requeue that one. Nothing was changed"
        )
    if entry.status == "done":
        raise UserError(
            f"{shown} is done; nothing was changed. To run some of its steps again, rewind "
            f"the run with `stepstone retry {entry.run_key} --from STEP`, which puts the "
            "entry back in the queue"
        )
    requeued = queue.requeue(entry.run_key)
    after = queue.get(entry.id) if requeued is not None else None
    if after is None:
        raise UserError(f"{shown} changed while it was being requeued; look at it again")
    return after


def _entry_named(entries: list[QueueEntry], ref: str) -> QueueEntry:
    """The entry ``ref`` names: by id, by the start of its id, or by its run key (the
    latest entry of that run)."""
    for entry in entries:
        if entry.id == ref:
            return entry
    by_id = [e for e in entries if len(ref) >= MIN_ID_CHARS and e.id.startswith(ref)]
    if len(by_id) > 1:
        raise UserError(
            f"{ref!r} starts the ids of {len(by_id)} queue entries; give more of the id"
        )
    if by_id:
        return by_id[0]
    by_key = [e for e in entries if e.run_key == ref]
    if by_key:
        return by_key[-1]
    raise UserError(
        f"no queue entry {ref!r}: give an entry id (at least {MIN_ID_CHARS} characters, "
        "as `stepstone queue` prints it) or the run key of an entry"
    )


def _check_store(store: Any) -> Store:
    if not isinstance(store, Store):
        raise ConfigurationTypeError(
            "the work queue lives in a Store: pass Store(db='app.sqlite') or "
            f"Store(url='postgresql://...'), got {store!r:.80}"
        )
    return store


def existing_queue(store: Store) -> QueueBackend | None:
    """The work queue in ``store``'s database, or None when it has none (a SQLite file no
    run was ever submitted to is left without one; the memory store has none)."""
    backend = _check_store(store).backend
    from stepstone.store._sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        from stepstone.store._queue_sqlite import has_queue

        if not has_queue(backend.path):
            return None
    try:
        return queue_backend(store)
    except UserError:  # a store without a queue (the memory store)
        return None


class RunHandle:
    """A run: ask its status, wait for its result, cancel it, send it messages, read its
    events and streams.

    Handles are cheap: ``RunHandle(store, id)`` rebuilds one from a queue entry's id (in
    another process, say); ``RunHandle(store, key="o-42")`` names a run by its key, queued
    or not (its queue entry, for :meth:`status`, :meth:`result` and :meth:`cancel`, is the
    one submitted last under that key).
    """

    def __init__(self, store: Store, id: str | None = None, *, key: str | None = None) -> None:
        if (id is None) == (key is None):
            raise ConfigurationError(
                "RunHandle takes a queue entry's id or a run's key: RunHandle(store, id) or "
                f"RunHandle(store, key='o-42'), got id={id!r:.80}, key={key!r:.80}"
            )
        if key is not None:
            check_name("key", key)
        self.store = _check_store(store)
        self.id = id
        self._key = key

    def __repr__(self) -> str:
        return f"RunHandle({self.id!r})" if self.id is not None else f"RunHandle(key={self._key!r})"

    def _identity(self) -> tuple[str, str | None]:
        return ("id", self.id) if self.id is not None else ("key", self._key)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RunHandle)
            and other._identity() == self._identity()
            and other.store is self.store
        )

    def __hash__(self) -> int:
        return hash(self._identity())

    def entry(self) -> QueueEntry:
        """The queue entry as stored now."""
        if self.id is None:
            assert self._key is not None
            found = queue_backend(self.store).latest_entry(self._key)
            if found is None:
                raise QueuedRunError(
                    f"run {self._key!r} has no queue entry in {self.store!r} (it was not "
                    "submitted, or its entry was pruned); its events and streams are still "
                    "there to read"
                )
            return found
        found = queue_backend(self.store).get(self.id)
        if found is None:
            raise QueuedRunError(f"no queued run {self.id!r} in {self.store!r}")
        return found

    @property
    def key(self) -> str:
        """The run's checkpoint key (``store.read(handle.key)`` shows its progress)."""
        if self._key is None:
            self._key = self.entry().run_key  # fixed at submission: read once
        return self._key

    # -- messages, events, streams -------------------------------------------------------
    def send(self, topic: str, value: Any) -> int:
        """Send ``value`` to this run on ``topic`` (:func:`stepstone.send`)."""
        from stepstone.durable._messages import send

        return send(self.store, self.key, topic, value)

    async def asend(self, topic: str, value: Any) -> int:
        """Async :meth:`send`."""
        from stepstone.durable._messages import asend

        return await asend(self.store, await to_thread(lambda: self.key), topic, value)

    def get_event(
        self, name: str, timeout: float | None = 60.0, *, poll: float | None = None
    ) -> Any:
        """The value the run last set for the event ``name``; when there is none yet, waits
        up to ``timeout`` seconds (None: until it is set or the run ends) and gives None if
        none came. A run that ended gives its final value (or None) at once."""
        from stepstone.durable._messages import get_event

        return get_event(self.store, self.key, name, timeout=timeout, poll=poll)

    async def aget_event(
        self, name: str, timeout: float | None = 60.0, *, poll: float | None = None
    ) -> Any:
        """Async :meth:`get_event`."""
        from stepstone.durable._messages import aget_event

        key = await to_thread(lambda: self.key)
        return await aget_event(self.store, key, name, timeout=timeout, poll=poll)

    def events(self) -> dict[str, Any]:
        """Every event the run set, with its last value, by name."""
        from stepstone.durable._messages import events

        return events(self.store, self.key)

    def read_stream(
        self,
        name: str,
        start: int = 0,
        *,
        follow: bool = True,
        timeout: float | None = None,
        poll: float | None = None,
    ) -> StreamReader:
        """Follow the run's stream ``name`` from offset ``start`` (inclusive): iterate the
        reader (``for offset, value in ...`` or ``async for``) for ``(offset, value)``
        pairs in offset order; the iteration ends once the run ended and every value was
        read, and the reader's ``outcome`` then says how the run ended (see
        :class:`~stepstone.durable.StreamReader` for ``follow``, ``timeout``, ``poll``)."""
        from stepstone.durable._messages import StreamReader

        return StreamReader(
            self.store, self.key, name, start, follow=follow, timeout=timeout, poll=poll
        )

    def status(self) -> str:
        """``queued | running | done | failed | cancelled``."""
        return self.entry().status

    def cancel(self) -> bool:
        """Cancel the run: a queued one never starts; a running one is stopped by its worker
        at its next lease renewal (its committed steps stay). False if it already ended."""
        if self.entry().status in FINAL_STATUSES:
            return False
        status = queue_backend(self.store).cancel(self.id or self.entry().id)
        return status in ("cancelled", "running")

    def result(self, timeout: float | None = None, *, poll: float = 0.05) -> Envelope[Any]:
        """Wait for the run to end and return its final envelope (an error envelope for a
        run whose step failed, as ``Plan.run`` returns it).

        Args:
            timeout: Seconds to wait at most, a finite number (None: until it ends).
            poll: Seconds between the first looks (a finite number > 0; they grow to 1).

        Raises:
            TimeoutError: still not finished after ``timeout`` seconds.
            QueuedRunError: the run ended without an envelope (cancelled, its target
                could not be loaded, or its workers kept dying).
            ConfigurationError: ``timeout`` or ``poll`` is not such a number.
        """
        deadline = _deadline(timeout, poll)
        wait = poll
        while True:
            entry = self.entry()
            if entry.status in FINAL_STATUSES:
                return _outcome(entry)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"queued run {entry.id} is still {entry.status} after {timeout}s "
                    f"(queue {entry.queue!r}, attempts {entry.attempts}); is a worker serving "
                    f"queue {entry.queue!r}?"
                )
            time.sleep(
                wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            )
            wait = min(wait * 1.5, 1.0)

    async def aresult(self, timeout: float | None = None, *, poll: float = 0.05) -> Envelope[Any]:
        """Async :meth:`result`."""
        deadline = _deadline(timeout, poll)
        wait = poll
        while True:
            entry = await to_thread(self.entry)
            if entry.status in FINAL_STATUSES:
                return _outcome(entry)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"queued run {entry.id} is still {entry.status} after {timeout}s "
                    f"(queue {entry.queue!r})"
                )
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, 1.0)


def _deadline(timeout: float | None, poll: float) -> float | None:
    """When a wait for a run's result of at most ``timeout`` seconds (None: no limit; 0 or
    less: one look), looking every ``poll`` seconds at first, gives up; both checked."""
    check_number("poll", poll, 0, above=True)
    if timeout is None:
        return None
    return time.monotonic() + check_number("timeout", timeout, -math.inf)


def _outcome(entry: QueueEntry) -> Envelope[Any]:
    if entry.result is not None:
        return Envelope.from_dict(json.loads(entry.result))
    raise QueuedRunError(
        f"queued run {entry.id} (target {entry.target!r}, checkpoint key {entry.run_key!r}) "
        f"ended {entry.status}: {entry.error or 'no reason recorded'}"
    )
