"""The checkpointer protocol: what ``GraphBuilder.with_checkpointer`` takes from users."""

from __future__ import annotations

import abc
import builtins
from typing import Any

from stepstone.core._threads import to_thread
from stepstone.engines.graph._records import CheckpointFilter, CheckpointRecord
from stepstone.exceptions import GraphCompileError

__all__ = ["METHODS", "Checkpointer", "check_checkpointer"]

#: What a checkpointer must have: the four operations and their async forms.
METHODS = ("save", "load", "list", "delete", "asave", "aload", "alist", "adelete")


class Checkpointer(abc.ABC):
    """Where a graph's checkpoints go. Subclass it to keep them anywhere.

    The engine hands :meth:`save` a whole :class:`CheckpointRecord` after every completed
    node (and every finished fan-out branch), and awaits it before the next node starts;
    a resume loads one with :meth:`load`. Records of JSON graphs are plain JSON data
    (:meth:`CheckpointRecord.to_json` / :meth:`CheckpointRecord.from_json` turn them into
    a dict and back). Implement the four sync methods; the async forms run them in a
    worker thread unless you override them too. ``stepstone.testing.checkpointer_conformance``
    checks an implementation.

    The built-in :class:`~stepstone.graph.StoreCheckpointer` (and its SQLite and in-memory
    forms) implement the same methods, and do more: every node is one small commit (not
    the whole record), and a record is owned by one live invocation at a time. A
    checkpointer of your own gets neither: each save passes the whole record, and two
    processes resuming one record at once both run.

    Example::

        class DictCheckpointer(Checkpointer):
            def __init__(self) -> None:
                self.saved: dict[str, dict] = {}

            def save(self, record):
                self.saved[record.invocation_id] = record.to_json()

            def load(self, invocation_id):
                if invocation_id not in self.saved:
                    raise CheckpointNotFound(invocation_id)
                return CheckpointRecord.from_json(self.saved[invocation_id])

            def list(self, filter=None):
                ...

            def delete(self, invocation_id):
                return self.saved.pop(invocation_id, None) is not None
    """

    @abc.abstractmethod
    def save(self, record: CheckpointRecord) -> None:
        """Store ``record``, replacing the one saved under its ``invocation_id``. It must
        be durable when this returns (as durable as your storage is). You may set
        ``last_saved_at`` to your own clock's time."""

    @abc.abstractmethod
    def load(self, invocation_id: str) -> CheckpointRecord:
        """The record last saved under ``invocation_id``, equal to what :meth:`save` got
        (``last_saved_at`` may be your own clock's).

        Raises:
            CheckpointNotFound: nothing is saved under ``invocation_id`` (never None).
        """

    @abc.abstractmethod
    def list(self, filter: CheckpointFilter | None = None) -> builtins.list[CheckpointRecord]:
        """The records matching ``filter`` (its ``correlation_id`` and ``status``, when
        given), oldest ``last_saved_at`` first."""

    @abc.abstractmethod
    def delete(self, invocation_id: str) -> bool:
        """Delete the record of ``invocation_id``; True if there was one (never an error
        when there was none)."""

    async def asave(self, record: CheckpointRecord) -> None:
        """Async :meth:`save` (by default :meth:`save` in a worker thread)."""
        await to_thread(self.save, record)

    async def aload(self, invocation_id: str) -> CheckpointRecord:
        """Async :meth:`load`."""
        return await to_thread(self.load, invocation_id)

    async def alist(
        self, filter: CheckpointFilter | None = None
    ) -> builtins.list[CheckpointRecord]:
        """Async :meth:`list`."""
        return await to_thread(self.list, filter)

    async def adelete(self, invocation_id: str) -> bool:
        """Async :meth:`delete`."""
        return await to_thread(self.delete, invocation_id)

    def close(self) -> None:  # noqa: B027 - optional: most checkpointers hold nothing
        """Release what the checkpointer holds (nothing by default)."""


def check_checkpointer(checkpointer: Any) -> Any:
    """``checkpointer`` if it is one (a :class:`Checkpointer`, or an object with all of
    :data:`METHODS`), else a ``GraphCompileError`` naming what it lacks."""
    if isinstance(checkpointer, Checkpointer):
        return checkpointer
    missing = [m for m in METHODS if not callable(getattr(checkpointer, m, None))]
    if missing:
        raise GraphCompileError(
            "with_checkpointer takes a SQLiteCheckpointer, InMemoryCheckpointer, "
            "StoreCheckpointer, or a checkpointer of your own (a subclass of "
            f"stepstone.graph.Checkpointer); {checkpointer!r} has no {', '.join(missing)}"
        )
    return checkpointer
