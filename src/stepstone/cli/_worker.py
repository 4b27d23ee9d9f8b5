"""``stepstone worker``: serve a store's work queue from this process."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from stepstone.cli._options import whole
from stepstone.cli._render import visible_console
from stepstone.exceptions import StepstoneError
from stepstone.store import Store

__all__ = ["worker"]


UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Store URL (postgresql://... or sqlite:///path)."),
]
DbOption = Annotated[Path | None, typer.Option("--db", help="SQLite store file.")]
QueueOption = Annotated[
    list[str] | None,
    typer.Option("--queue", "-q", help="A queue to serve (repeat for several)."),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option(parser=whole(1), metavar="N", help="Most runs this worker runs at once."),
]
LeaseSecondsOption = Annotated[
    float,
    typer.Option(
        help="Seconds a taken run (its queue entry and its checkpoint) stays ours without renewal."
    ),
]
ShutdownTimeoutOption = Annotated[
    float,
    typer.Option(min=0, help="On SIGTERM, seconds running runs may take to finish."),
]
PollIntervalOption = Annotated[float, typer.Option(help="Seconds between polls.")]
ParkAfterOption = Annotated[
    float,
    typer.Option(
        min=0,
        help="A run that waits (a durable sleep, a receive) longer than this many seconds "
        "gives its slot back until its wake time or a message.",
    ),
]
ImportPathOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--import-path",
        help="A folder to import run targets from (repeat; the current one is included).",
    ),
]
MaxRunsOption = Annotated[
    int | None,
    typer.Option(parser=whole(1), metavar="N", help="Exit after taking this many runs."),
]
UntilIdleOption = Annotated[bool, typer.Option(help="Exit when there is nothing left to take.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Log to stderr.")]


def worker(
    url: UrlOption = None,
    db: DbOption = None,
    queue: QueueOption = None,
    concurrency: ConcurrencyOption = 4,
    lease_seconds: LeaseSecondsOption = 30.0,
    shutdown_timeout: ShutdownTimeoutOption = 30.0,
    poll_interval: PollIntervalOption = 0.5,
    park_after: ParkAfterOption = 5.0,
    import_path: ImportPathOption = None,
    max_runs: MaxRunsOption = None,
    until_idle: UntilIdleOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Take queued runs from the store and run them (until SIGTERM)."""
    from stepstone.worker import Worker

    console = visible_console(markup=True, stderr=True)
    _check_store_options(console, db, url)
    for folder in [Path.cwd(), *(import_path or [])]:
        if str(folder.resolve()) not in sys.path:
            sys.path.insert(0, str(folder.resolve()))
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        # The checkpoints' leases are the queue entries': a run whose worker stopped
        # renewing for --lease-seconds is taken over then, not when a longer default runs out.
        store = Store(db=db, url=url, lease_seconds=lease_seconds)
        w = Worker(
            store,
            queues=queue or ["default"],
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            shutdown_timeout=shutdown_timeout,
            poll_interval=poll_interval,
            park_after=park_after,
        )
    except (StepstoneError, ValueError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    # From here on SIGTERM/SIGINT stop the worker gracefully (the event loop takes the
    # signals over once it runs), so a supervisor may signal as soon as it reads this line.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: w.stop())
    console.print(
        escape(
            f"{w.id} (pid {os.getpid()}) serving {', '.join(w.queues)} from {store!r}, "
            f"concurrency {concurrency}"
        )
    )
    try:
        done = w.run(max_runs=max_runs, until_idle=until_idle)
    except StepstoneError as exc:
        console.print(f"[red]error:[/] {escape(f'{w.id}: {exc}')}")
        raise typer.Exit(1) from None
    finally:
        if w.abandoned is None:
            store.close()
    console.print(f"{w.id}: stopped after finishing {done} runs")
    if w.abandoned is not None:
        _exit_now(console, w.id, len(w.abandoned))


def _check_store_options(console: Console, db: Path | None, url: str | None) -> None:
    """Exit 2 unless exactly one of --db (an existing file) and --url is given."""
    if (db is None) == (url is None):
        console.print("[red]error:[/] pass exactly one of --db PATH or --url URL")
        raise typer.Exit(2)
    if db is not None and not db.exists():
        console.print(f"[red]error:[/] no store file at {escape(str(db))} (check the path)")
        raise typer.Exit(2)


def _exit_now(console: Console, worker_id: str, left: int) -> None:
    """End the process of a worker whose shutdown gave up on a store that stopped
    answering (its message said which runs it left). Some of its threads still wait on
    that store (an outage, a lock), and the interpreter would wait for them at exit, for
    as long as the store retries: leave at once instead, as a killed worker would. Nothing
    committed is lost; the runs' leases hand them to other workers."""
    console.print(
        f"{worker_id}: left {left} runs to other workers, who take them over when their "
        "leases run out"
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
