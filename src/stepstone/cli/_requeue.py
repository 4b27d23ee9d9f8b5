"""``stepstone requeue``: put a failed or cancelled queue entry back in its queue.

``retry`` rewinds a run and requeues its entry; an entry that never got a checkpoint (its
target failed to import) has no run to rewind, and this command sends it back as it is.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from stepstone.cli._options import DbOption, DebugOption, JsonOption, UrlOption, open_store
from stepstone.cli._render import visible_console
from stepstone.durable._queue import requeue_entry

__all__ = ["requeue_cmd"]


def requeue_cmd(
    entry: Annotated[
        str,
        typer.Argument(
            help="The queue entry: its id (the 12 characters `stepstone queue` prints do), "
            "or its run key."
        ),
    ],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Put a failed or cancelled queue entry back in its queue, for a worker to run."""
    with open_store(db, url, debug=debug) as store:
        after = requeue_entry(store, entry)
        if as_json:
            view = {"id": after.id, "run_key": after.run_key, "queue": after.queue}
            typer.echo(json.dumps({**view, "status": after.status}, ensure_ascii=False))
            return
        visible_console().print(
            f"queue entry {after.id} (run {after.run_key}) is queued again in queue "
            f"{after.queue}: a worker runs it from where its run stopped (from the start "
            "when it has no checkpoint)"
        )
