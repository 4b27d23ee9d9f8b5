"""The ``stepstone`` command: ``demo``, ``inspect`` and ``runs``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stepstone.cli._demo_etl import run_etl_demo
from stepstone.cli._demo_lunar import run_lunar_demo
from stepstone.cli._render import render_entry, render_runs
from stepstone.durable import list_runs
from stepstone.store import Store

__all__ = ["app", "main"]

app = typer.Typer(
    help="stepstone: durable LLM-agent pipelines. Every step is committed before the next.",
    no_args_is_help=True,
    add_completion=False,
)

DbOption = Annotated[Path | None, typer.Option("--db", help="SQLite store file.")]
UrlOption = Annotated[
    str | None, typer.Option("--url", help="Store URL (postgresql://... or sqlite:///...).")
]


def _open_store(db: Path | None, url: str | None, console: Console) -> Store:
    if (db is None) == (url is None):
        console.print("[red]error:[/] pass exactly one of --db PATH or --url URL")
        raise typer.Exit(2)
    if db is not None and not db.exists():
        console.print(f"[red]error:[/] no store file at {db} (check the path)")
        raise typer.Exit(2)
    return Store(db=db) if db is not None else Store(url=url)


@app.command()
def demo(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help="SQLite file to use; the graph story's file goes next to it "
            "(default: a new temp directory).",
        ),
    ] = None,
) -> None:
    """Run the ETL crash/resume story (and the lunar-mission graph story) offline."""
    console = Console()
    if db is not None and not db.parent.exists():
        console.print(f"[red]error:[/] directory {db.parent} does not exist")
        raise typer.Exit(2)
    # With --db, the graph story's checkpoint file goes next to it; else a new temp dir.
    workdir = db.parent if db is not None else Path(tempfile.mkdtemp(prefix="stepstone-demo-"))
    path = db if db is not None else workdir / "pipeline.sqlite"
    console.print(f"[bold]stepstone demo[/] — store: {path} (no API key needed)\n")
    run_etl_demo(console, path)
    run_lunar_demo(console, workdir)


@app.command()
def inspect(
    key: Annotated[str, typer.Argument(help="The checkpoint key (or any store key).")],
    db: DbOption = None,
    url: UrlOption = None,
    history: Annotated[bool, typer.Option(help="Show the step history table.")] = True,
) -> None:
    """Print a checkpoint: status, next step, completed steps, kv keys, history."""
    console = Console()
    store = _open_store(db, url, console)
    try:
        entry = store.read_entry(key)
        if entry is None:
            near = store.keys(prefix=key[:3]) if key else []
            hint = f" (keys starting like it: {near[:10]})" if near else ""
            console.print(f"[red]error:[/] no key {key!r} in {store!r}{hint}")
            raise typer.Exit(1)
        render_entry(console, entry, history=history)
    finally:
        store.close()


@app.command()
def runs(
    db: DbOption = None,
    url: UrlOption = None,
    prefix: Annotated[str | None, typer.Option(help="Only keys starting with this.")] = None,
) -> None:
    """List the durable runs in a store."""
    console = Console()
    store = _open_store(db, url, console)
    try:
        render_runs(console, list_runs(store, prefix))
    finally:
        store.close()


def main() -> None:
    """Entry point of the ``stepstone`` console script."""
    app()
