"""``stepstone check``: is the store damaged, and what is still readable?

Exit status 0 when nothing is wrong, 1 when something is (each problem printed with the
key it concerns), 2 for a bad command line. A file too damaged to open is reported as a
problem of the file, not as an error of the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.markup import escape

from stepstone.cli._debug import asked
from stepstone.cli._options import DbOption, DebugOption, JsonOption, UrlOption, fail
from stepstone.cli._render import progress_bar, visible_console
from stepstone.exceptions import StoreDamagedError, StoreError
from stepstone.store import CheckProblem, CheckReport, Store, check_store
from stepstone.store._check import problem_text

__all__ = ["check_cmd"]


def check_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="SQLite's quick_check: much faster on a large file, skips index checks.",
        ),
    ] = False,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Check a store: its file's pages, then every run and value in it (read only)."""
    if (db is None) == (url is None):
        raise typer.BadParameter("pass exactly one of --db FILE or --url URL")
    if db is not None and not db.exists():
        fail(f"no store file at {str(db)!r}; check the path (stepstone never creates one here)")
    store: Store | None = None
    try:
        store = Store(db=db, url=url, read_only=True)
        # A server connects on first use: connect now, and check the database holds a
        # stepstone store, so a wrong URL is one problem of opening it, as a file's is.
        store.setup()
    except (StoreError, ValueError) as exc:  # ValueError: a URL of no store's scheme
        where = store.describe() if store is not None else None
        if store is not None:
            store.close()
        if asked(debug):
            raise
        _report(_unopenable(db, url, exc, where), as_json)
        raise typer.Exit(1) from None
    try:
        with progress_bar("checking", hidden=as_json) as progress:
            report = check_store(store, quick=quick, progress=progress)
    finally:
        store.close()
    _report(report, as_json)
    if not report.ok:
        raise typer.Exit(1)


def _unopenable(
    db: Path | None, url: str | None, exc: StoreError | ValueError, where: str | None
) -> CheckReport:
    if where is None:
        where = f"sqlite:{db}" if db is not None else _without_password(str(url))
    detail = problem_text(exc)
    return CheckReport(
        store=where,
        file_checked=False,
        quick=False,
        runs=0,
        values=0,
        journal_rows=0,
        # "file" only for a damaged file: the advice to recover it follows that word
        problems=(
            CheckProblem("file" if isinstance(exc, StoreDamagedError) else "open", None, detail),
        ),
    )


def _without_password(url: str) -> str:
    """``url`` as a report may print it: a password in it replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _report(report: CheckReport, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        return
    console = visible_console(markup=True, highlight=False)  # stored text: escape()d
    pages = "not checked"
    if report.file_checked:
        pages = "quick_check" if report.quick else "integrity_check"
    console.print(
        f"{escape(report.store)}: {_count(report.runs, 'run')} "
        f"({_count(report.journal_rows, 'journal row')}) and {_count(report.values, 'value')} "
        f"read; file pages: {pages}"
    )
    if report.checksums is not None:
        console.print(f"values guarded by: {escape(report.checksums)}")
    if report.ok:
        console.print("[green]ok[/]: nothing is damaged")
        return
    console.print(f"[red]{len(report.problems)} problem(s)[/]:")
    for problem in report.problems:
        what = problem.where if problem.key is None else f"{problem.where} {problem.key!r}"
        console.print(f"  [bold]{escape(what)}[/]: {escape(problem.detail)}")
    if report.store.startswith("sqlite:") and any(
        p.where not in ("record", "open") or p.detail.startswith("damaged:")
        for p in report.problems
    ):
        path = report.store.removeprefix("sqlite:")
        console.print(
            "The file is damaged. Restore it from a backup, or copy what is still readable "
            f"into a new file with the sqlite3 shell: sqlite3 {escape(path)} .recover | "
            "sqlite3 recovered.sqlite"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
