"""What a run keeps beside its journal: timers, messages, events and streams.

Four kinds of records, each keyed by the run's key, in tables of their own in every backend
(``stepstone_timers``, ``stepstone_messages``, ``stepstone_events``, ``stepstone_streams``):

* a **timer** is a wait the run is in: until a time (a durable sleep), for a message on a
  topic, or both (a receive with a timeout). It is what an operator sees ("sleeping until",
  "waiting for") and what wakes a run a worker parked: a message sent on the topic of one
  of its timers makes its queue entry runnable at once;
* a **message** is sent to a run on a topic by anyone; messages of a topic are read in send
  order, and each is consumed once, in the same transaction as the step commit that
  records its receipt;
* an **event** is a value the run sets under a name (last write wins), readable from
  outside while it runs and after it ended;
* a **stream** is an append-only sequence of values under a name, addressed by offset
  (0, 1, 2...), which readers follow and resume from any offset.

Deleting a run deletes its records with it; a fresh start of a run under its key (a claim
that resets the journal) drops its timers, events and streams, and keeps the messages sent
to the key that no run has consumed yet. Values are JSON text, as everywhere in a store.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "EventValue",
    "ExtraWrites",
    "Message",
    "StreamEntry",
    "Timer",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message sent to a run.

    Attributes:
        id: Its place in send order (increasing across the whole store).
        run_key: The run it is addressed to.
        topic: Its topic.
        data: Its value, as JSON text.
        sent_at: When it was stored (the database's clock).
        consumed_at: When a receive consumed it (None: still pending).
    """

    id: int
    run_key: str
    topic: str
    data: str
    sent_at: float
    consumed_at: float | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EventValue:
    """The latest value a run set under an event name.

    Attributes:
        name: The event's name.
        data: Its value, as JSON text.
        updated_at: When it was last set (the database's clock).
    """

    name: str
    data: str
    updated_at: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamEntry:
    """One value of a run's stream.

    Attributes:
        name: The stream's name.
        offset: Its place in the stream (0 for the first value).
        data: The value, as JSON text.
        attempt: For a value written from inside a step, the step's attempt (a step that
            ran again after a crash may write a value again, under a later offset); None
            for a value the run's own body wrote (journaled: written exactly once).
        written_at: When it was stored (the database's clock).
    """

    name: str
    offset: int
    data: str
    attempt: int | None
    written_at: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Timer:
    """A wait a run is in.

    Attributes:
        run_key: The waiting run.
        name: Which wait of the run (its position in the run, engine-defined).
        wake_at: Until when (the database's clock); None: no time limit.
        topic: The topic whose next message ends the wait; None: a plain sleep.
        since: When the wait began.
    """

    run_key: str
    name: str
    wake_at: float | None
    topic: str | None
    since: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExtraWrites:
    """Records written in the same transaction as a step commit
    (:meth:`~stepstone.store.Backend.run_commit_extras`).

    Attributes:
        key: The run the records belong to (None: the committing run). A step's own
            operations journal under a run of their own but read and write the records of
            the run the step belongs to (its messages, events, streams, timers).
        consume: Ids of messages of the run to mark consumed: each must be the run's and
            still pending, or nothing of the commit is written.
        events: ``(name, json_text)`` values to set.
        stream: ``(name, json_text)`` values appended to the run's streams, each at the
            stream's next offset, in order (attempt None: written by the run's body).
        timers: Timers to set (replacing one of the same name).
        clear_timers: Names of timers to remove.
    """

    key: str | None = None
    consume: tuple[int, ...] = ()
    events: tuple[tuple[str, str], ...] = ()
    stream: tuple[tuple[str, str], ...] = ()
    timers: tuple[Timer, ...] = ()
    clear_timers: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.consume or self.events or self.stream or self.timers or self.clear_timers)
