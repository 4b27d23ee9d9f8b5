"""What a PostgreSQL server's refusal means to the user: the store error raised instead of
the driver's own.

A server out of disk space, one that finds damaged data, and a read-only server (a hot
standby, or a database set ``default_transaction_read_only``) answer every write with an
error naming neither the store nor what to do. :func:`server_error` maps their SQLSTATEs:

* ``53100`` (disk full): :class:`~stepstone.exceptions.StoreFullError`;
* ``XX001``/``XX002`` (data or index corrupted):
  :class:`~stepstone.exceptions.StoreDamagedError`;
* ``25006`` (read-only transaction): :class:`~stepstone.exceptions.StoreError`;
* ``53200`` (out of memory, including "out of shared memory" for want of lock slots) and
  ``53400`` (a configured limit exceeded): :class:`~stepstone.exceptions.StoreError`.

Other errors pass through as they are.

A server that refuses a new connection for want of a slot (too many clients, or a role's
or database's connection limit: SQLSTATE ``53300``) answers before any session exists, and
libpq hands back only its message: :func:`refused_connection` recognises it by its words.
"""

from __future__ import annotations

from stepstone.exceptions import StoreDamagedError, StoreError, StoreFullError

__all__ = ["refused_connection", "server_error"]


def server_error(where: str, what: str, exc: BaseException) -> StoreError | None:
    """The store error the server's error ``exc`` means for the store ``where`` (its
    description) while trying to ``what``, or None when it is none of the above."""
    state = getattr(exc, "sqlstate", None) or ""
    said = " ".join(str(exc).split())
    if state == "53100":
        return StoreFullError(
            f"the server of {where} is out of disk space ({said}); nothing of the attempt to "
            f"{what} was written. Free space on the server and run again with resume=True: "
            "a run continues after its last committed step, and the step that was being "
            "committed runs again"
        )
    if state in ("XX001", "XX002"):
        thing = "an index" if state == "XX002" else "data"
        return StoreDamagedError(
            f"{where} holds damaged {thing} ({said}); the attempt to {what} stopped and wrote "
            f"nothing. See what is affected with `stepstone check --url ...`, then "
            + (
                "rebuild the index (REINDEX)"
                if state == "XX002"
                else "restore the database from a backup"
            )
        )
    if state in ("53200", "53400"):
        cause = "ran out of memory" if state == "53200" else "hit a configured limit"
        return StoreError(
            f"the server of {where} {cause} ({said}); nothing of the attempt to {what} was "
            "written. Raise the server setting its message names (max_locks_per_transaction "
            "for shared memory: each writes= key of a commit takes a lock), give it more "
            "memory, or write fewer keys in one commit; then run again with resume=True: a "
            "run continues after its last committed step"
        )
    if state == "25006":
        return StoreError(
            f"{where} is read-only ({said}), so it cannot {what}: point the store at the "
            "primary server (a standby only reads), or open it with read_only=True to read"
        )
    return None


#: Words of a refused connection for want of a slot, as the server writes them in English:
#: "sorry, too many clients already", "too many connections for role/database ...",
#: "remaining connection slots are reserved ...".
_NO_SLOT = ("too many clients", "too many connections", "connection slots are reserved")


def refused_connection(where: str, exc: BaseException) -> StoreError | None:
    """The store error for a new connection to ``where`` refused with ``exc`` because the
    server has no connection slot left for it, or None when that is not the reason."""
    said = " ".join(str(exc).split())
    if not any(words in said.lower() for words in _NO_SLOT):
        return None
    return StoreError(
        f"the server of {where} refuses new connections: no connection slot is left "
        f"({said}). Each process using the store opens up to max_size pooled connections, "
        "and as many again for runs awaited on an event loop: lower max_size, run fewer "
        "processes, raise the limit (the server's max_connections, or the role's or "
        "database's CONNECTION LIMIT), or put a connection pooler such as PgBouncer in "
        "front (with prepare=False)"
    )
