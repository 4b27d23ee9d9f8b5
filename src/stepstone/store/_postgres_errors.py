"""What a PostgreSQL server's refusal means to the user: the store error raised instead of
the driver's own.

A server out of disk space, one that finds damaged data, and a read-only server (a hot
standby, or a database set ``default_transaction_read_only``) answer every write with an
error naming neither the store nor what to do. :func:`server_error` maps their SQLSTATEs:

* ``53100`` (disk full): :class:`~stepstone.exceptions.StoreFullError`;
* ``XX001``/``XX002`` (data or index corrupted):
  :class:`~stepstone.exceptions.StoreDamagedError`;
* ``25006`` (read-only transaction): :class:`~stepstone.exceptions.StoreError`.

Other errors pass through as they are.
"""

from __future__ import annotations

from stepstone.exceptions import StoreDamagedError, StoreError, StoreFullError

__all__ = ["server_error"]


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
    if state == "25006":
        return StoreError(
            f"{where} is read-only ({said}), so it cannot {what}: point the store at the "
            "primary server (a standby only reads), or open it with read_only=True to read"
        )
    return None
