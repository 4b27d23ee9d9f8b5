"""Operator commands: ``prune``, ``vacuum``, ``show``, ``history``, ``stranded``, ``diff``,
``cancel``, ``fork``, ``retry`` and ``approve``.

``open_store`` and ``fail`` are this module's own small helpers for opening the store named
on the command line and failing in one line; the shared CLI helpers can replace them.

Every command takes ``--db FILE`` or ``--url URL``; read commands take ``--json``. A failure
prints one line, ``error: <what> ...; <fix>``, on stderr and exits with status 1.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepstone.cli._options import (
    DbOption,
    DebugOption,
    JsonOption,
    OpsError,
    UrlOption,
    fail,
    open_store,
    split_values,
    whole,
)
from stepstone.cli._render import (
    key_table,
    keyed_console,
    named_key,
    print_json,
    progress_bar,
    visible,
    visible_console,
)
from stepstone.durable._approvals import approve_call, decision_text
from stepstone.durable._inspect import (
    damage_report,
    diff_runs,
    missing_run,
    run_detail,
    run_timeline,
    steps_done,
    stranded_runs,
)
from stepstone.durable._operate import cancel_run, fork_run, retry_run
from stepstone.durable._queue import existing_queue, requeue_run
from stepstone.durable._retention import PruneInterrupted, PruneReport, parse_age, prune
from stepstone.exceptions import CorruptRecordError
from stepstone.store import Retention, Store, vacuum
from stepstone.store._base import read_salvaged
from stepstone.store._check import problem_text
from stepstone.store._queue_base import FINAL_STATUSES, QueueEntry

__all__ = [
    "approve_cmd",
    "cancel_cmd",
    "diff_cmd",
    "fork_cmd",
    "history_cmd",
    "prune_cmd",
    "queue_cmd",
    "retry_cmd",
    "show_cmd",
    "split_values",
    "stranded_cmd",
    "vacuum_cmd",
]


def no_run(key: str, store: Store) -> OpsError:
    """The one-line error for a key that holds no run."""
    return OpsError(missing_run(store, key))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str, ensure_ascii=False) + "\n")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _short(value: Any, width: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _error_text(err: Any, width: int = 70) -> str:
    """A recorded error as ``Type: message`` (cut to ``width``), or its JSON when it is
    not one."""
    if isinstance(err, dict) and ("type" in err or "message" in err):
        return _short(f"{err.get('type')}: {err.get('message')}", width)
    return _short(err, width)


def clock_time(ts: float | None) -> str:
    """``07:15:41.455``: a time of day (local) to the millisecond; ``-`` when unknown."""
    if ts is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def span(seconds: float | None) -> str:
    """A duration as a person reads it (``850 us``, ``12.3 ms``, ``4.20 s``, ``3 min 7 s``,
    ``2 h 5 min``); ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def prune_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    ttl: Annotated[
        str | None, typer.Option(help="Delete runs whose last commit is older (30d, 12h).")
    ] = None,
    keep_last: Annotated[
        int | None, typer.Option(help="Keep only the N most recently updated runs.")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(help="Statuses that may go (repeat it, or comma-separate); default: done."),
    ] = None,
    prefix: Annotated[
        list[str] | None,
        typer.Option(help="Only keys starting with this; repeat it to keep N per prefix."),
    ] = None,
    min_age: Annotated[
        str, typer.Option(help="Never delete a run updated more recently than this.")
    ] = "5m",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would go.")] = False,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Delete finished runs older than --ttl or beyond --keep-last (never a live run)."""
    with open_store(db, url, debug=debug, read_only=dry_run) as store:
        policy = store.retention
        if ttl is not None or keep_last is not None:
            policy = Retention(
                ttl=parse_age(ttl) if ttl is not None else None,
                keep_last=keep_last,
                statuses=split_values(status) or ("done",),
                prefix=tuple(prefix) if prefix else None,
                min_age=parse_age(min_age),
            )
        if policy is None:
            raise OpsError("pass --ttl AGE (e.g. 30d) and/or --keep-last N")
        with progress_bar("pruning", hidden=as_json or dry_run) as progress:
            interrupted: PruneInterrupted | None = None
            try:
                with _stop_between_runs(progress) as each_run:
                    report = prune(store, policy, dry_run=dry_run, progress=each_run)
            except PruneInterrupted as stopped:
                interrupted, report = stopped, stopped.report
        left = 0
        if interrupted is not None:
            left = interrupted.total - len(report.deleted) - len(report.skipped_changed)
        if as_json:
            _print_json(_prune_json(report, interrupted=interrupted is not None, left=left))
        else:
            _print_prune(report, min_age)
        if interrupted is not None:
            typer.echo(
                f"interrupted: deleted {len(report.deleted)} of the {interrupted.total} "
                f"selected run(s), {left} left untouched; run the same prune again to "
                "delete the rest",
                err=True,
            )
            raise typer.Exit(130)


@contextmanager
def _stop_between_runs(
    progress: Callable[[int, int], None],
) -> Iterator[Callable[[int, int], None]]:
    """Ctrl-C while prune deletes runs stops it between two runs, not inside one's delete
    (that would leave a half-deleted run for the next prune to finish): the first SIGINT
    is noted and raised as KeyboardInterrupt once the current run is gone; a second one
    stops at once. Before the deletes start, Ctrl-C stops at once (nothing was deleted)."""
    asked = threading.Event()
    deleting = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield progress
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if not deleting.is_set():
            raise KeyboardInterrupt
        asked.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: now

    def each_run(done: int, total: int) -> None:
        deleting.set()
        progress(done, total)
        if asked.is_set():
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield each_run
    finally:
        signal.signal(signal.SIGINT, before)


def _prune_json(report: PruneReport, *, interrupted: bool = False, left: int = 0) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run,
        "deleted": [
            {
                "key": r.key,
                "kind": r.kind,
                "status": r.status,
                "updated_at": r.updated_at,
                "reason": r.reason,
                "values": list(r.values),
            }
            for r in report.deleted
        ],
        "skipped_live": report.skipped_live,
        "skipped_changed": report.skipped_changed,
        "skipped_young": report.skipped_young,
        "min_age_seconds": report.min_age,
        "interrupted": interrupted,
        "left": left,
    }


def _print_prune(report: PruneReport, min_age: str) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    keys = [r.key for r in report.deleted[:200]]
    out = keyed_console(keys)
    table = key_table(
        keys,
        "key",
        "kind",
        "status",
        "updated",
        "reason",
        title=f"{verb} {len(report.deleted)} run(s)",
    )
    for r in report.deleted[:200]:
        table.add_row(r.key, r.kind, r.status, _when(r.updated_at), r.reason)
    out.print(table)
    if len(report.deleted) > 200:
        out.print(f"... and {len(report.deleted) - 200} more")
    if report.skipped_live:
        out.print(f"kept {len(report.skipped_live)} live run(s): {report.skipped_live[:10]}")
    if report.skipped_changed:
        out.print(f"left {len(report.skipped_changed)} run(s) that changed meanwhile")
    if report.skipped_young:
        young = report.skipped_young
        out.print(
            f"kept {len(young)} run(s) the policy selects but updated less than --min-age "
            f"{min_age} ago: {young[:10]}{' ...' if len(young) > 10 else ''} (a smaller "
            "--min-age lets them go)"
        )


def vacuum_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Give a SQLite store's free pages back to the disk (run it after prune)."""
    with open_store(db, url, debug=debug) as store:
        backend = store.backend
        store.close()  # vacuum opens its own connection; ours must not hold the file
        report = vacuum(backend)
        if as_json:
            _print_json(
                {
                    "path": report.path,
                    "bytes_before": report.bytes_before,
                    "bytes_after": report.bytes_after,
                    "full": report.full,
                }
            )
            return
        how = "rewrote the file once (now incremental)" if report.full else "incremental"
        _console().print(
            f"vacuumed {report.path}: {_size(report.bytes_before)} -> "
            f"{_size(report.bytes_after)} ({how})"
        )


def _console() -> Console:
    """The console of these commands: keys, step names, payloads and error messages are
    the users', so no markup (a ``[/]`` in one is text) and every character that is not
    printable (a newline, an escape sequence) shown escaped (see ``visible``)."""
    return visible_console()


def show_cmd(
    key: Annotated[str, typer.Argument(help="The run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Everything about one run: status, owner, error, its record, its steps."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        key = named_key(store, key)
        detail = run_detail(store, key)
        if detail is None:
            raise no_run(key, store)
        try:
            entry = store.read_entry(key)
        except CorruptRecordError as exc:  # show what is there, and what is wrong
            entry = None
            detail.setdefault("corrupt", problem_text(exc))
        detail["record"] = entry.value if entry is not None else None
        if as_json:
            _print_json(detail)
            return
        console = _console()
        console.print(
            Text.assemble(
                (visible(key), "bold"),
                f"  {visible(detail['kind'])} run  status ",
                (visible(detail["status"]), "bold"),
                f"  next step {visible(detail['next_step'] or '-')}  owner "
                f"{visible(detail['owner'])}",
            )
        )
        console.print(
            f"  run_uid {detail['run_uid']}  steps {detail['steps']}  version "
            f"{detail['version']}  created {_when(detail['created_at'])}  updated "
            f"{_when(detail['updated_at'])}"
        )
        if detail["error"]:
            err = detail["error"]
            console.print(
                Text.assemble(
                    "  ",
                    ("error", "red"),
                    visible(f"{_error_place(err)}: {err.get('type')}: {err.get('message')}"),
                )
            )
        if detail.get("superseded_by"):
            console.print(
                Text.assemble(
                    "  ",
                    ("superseded", "yellow"),
                    f" by {visible(detail['superseded_by'])}: that run took it over; "
                    "look there, or resume that one",
                )
            )
        if detail.get("corrupt"):
            console.print(Text.assemble("  ", ("corrupt", "red"), ": ", visible(detail["corrupt"])))
        _print_approvals(console, key, detail["pending_approvals"])
        _print_time_and_messages(console, detail)
        if detail.get("agent"):
            _print_agent(console, detail["agent"])
        if detail.get("operations") is not None:
            _print_operations(console, detail["operations"])
        entries = detail["timeline"]
        shown = entries[-SHOWN_ENTRIES:]
        console.print(_history_table(key, detail["kind"], shown, payloads=False))
        if len(shown) < len(entries):
            console.print(
                f"  ... and {len(entries) - len(shown)} earlier entries: `stepstone history "
                f"{key}` lists them all"
            )
        print_json(console, _cut_texts(detail["record"]))


#: Entries of a run's timeline that `show` prints (the last ones; ``history``: all).
SHOWN_ENTRIES = 20


#: Characters of one text of a run's record that `show` prints (``--json``: all).
SHOWN_CHARS = 2000


def _cut_texts(value: Any) -> Any:
    """``value`` with each text longer than :data:`SHOWN_CHARS` cut to them and its length
    noted: a step's megabytes of output must not flood the terminal."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]}… ({len(value)} characters; --json shows them all)"
    if isinstance(value, dict):
        return {k: _cut_texts(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut_texts(v) for v in value]
    return value


def _print_time_and_messages(console: Console, detail: dict[str, Any]) -> None:
    """What the run waits for, its events, streams and pending messages (one line each)."""
    for wait in detail.get("waiting", ()):
        until = "no time limit" if wait["until"] is None else f"until {_when(wait['until'])}"
        if wait["state"] == "sleeping":
            said = f"sleeping {until}"
        elif wait["state"] == "waiting":
            said = f"waiting for a message on {wait['topic']!r}, {until}"
        else:
            said = f"woken ({until.replace('until', 'due')}): it goes on any moment"
        console.print(Text.assemble("  ", ("waits", "yellow"), visible(f" {said}")))
    for name, value in detail.get("events", {}).items():
        shown = _cut_texts(json.dumps(value, ensure_ascii=False, default=str))
        console.print(Text.assemble("  ", ("event", "cyan"), visible(f" {name}: {shown}")))
    for stream in detail.get("streams", ()):
        console.print(
            Text.assemble(
                "  ",
                ("stream", "cyan"),
                visible(f" {stream['name']}: {stream['length']} value(s)"),
            )
        )
    messages = detail.get("messages") or {}
    pending = messages.get("pending") or []
    if pending:
        topics = sorted({m["topic"] for m in pending})
        console.print(
            Text.assemble(
                "  ",
                ("messages", "cyan"),
                visible(f" {len(pending)} pending on {', '.join(map(repr, topics))}"),
            )
        )


def _print_approvals(console: Console, key: str, calls: list[dict[str, Any]]) -> None:
    if not calls:
        return
    table = Table(title=f"waiting for approval of {len(calls)} tool call(s)")
    for col in ("call id", "tool", "arguments", "why", "decision", "agent run"):
        table.add_column(col, overflow="fold")
    for c in calls:
        d = c.get("decision")
        decided = "-" if d is None else ("approved" if d is True else f"denied: {d}")
        table.add_row(
            str(c["call_id"]),
            str(c.get("tool")),
            _short(c.get("arguments"), 50),
            str(c.get("reason") or ""),
            decided,
            str(c["run_key"]),
        )
    console.print(table)
    console.print(
        f"  decide with `stepstone approve {key} CALL_ID` (or `--deny REASON`), then resume the run"
    )


def _print_agent(console: Console, agent: dict[str, Any]) -> None:
    names = [str(p["phase"]) for p in agent["phases"]]
    runs = names.count("run_started")
    console.print(
        f"  agent state {agent['agent_state'] or 'running'}  {len(names)} phase record(s) "
        f"over {runs} run(s): {_short(' > '.join(names), 200)}"
    )
    table = Table(title=f"{len(agent['effects'])} effect(s)")
    for col in ("position", "name", "call id", "state", "replays", "error"):
        table.add_column(col, overflow="fold")
    for e in agent["effects"]:
        err = e.get("error")
        table.add_row(
            str(e["position"]),
            str(e["name"]),
            str(e.get("call_id") or ""),
            str(e["state"]),
            str(e["replays"]),
            _short(err, 60) if err else "",
        )
    console.print(table)


def turn_text(summary: dict[str, Any]) -> str:
    """A model turn's summary on one line: model, tokens, cost, the tool calls it asked for
    (or the start of its text)."""
    parts = [str(summary.get("model") or "model")]
    parts.append(f"{summary.get('input_tokens', 0)} in / {summary.get('output_tokens', 0)} out")
    cost = summary.get("cost_usd")
    parts.append("cost unknown" if cost is None else f"${cost:.6f}")
    calls = summary.get("tool_calls") or []
    if calls:
        parts.append(", ".join(f"{c.get('name')}({c.get('args')})" for c in calls))
    elif summary.get("text"):
        parts.append(repr(summary["text"]))
    return " · ".join(parts)


def _print_operations(console: Console, ops: list[dict[str, Any]]) -> None:
    """A workflow run's steps (and other operations), one row each, in position order."""
    table = Table(title=f"{len(ops)} step(s) and other operation(s)")
    for col in ("position", "step", "status", "arguments", "value or error", "tries", "ms"):
        table.add_column(col, overflow="fold")
    for op in ops:
        name = op["name"] if op["op"] == "step" else f"{op['op']} {op['name']}"
        if op.get("key"):
            name += f" ({op['key']})"
        shown = op.get("error") if "error" in op else op.get("value", "")
        if isinstance(shown, dict) and "message" in shown and "type" in shown:
            shown = f"{str(shown['type']).rpartition(':')[2]}: {shown['message']}"
        elif isinstance(op.get("summary"), dict):
            shown = turn_text(op["summary"])  # a model turn: shown whole (it is short)
        limit = 200 if isinstance(op.get("summary"), dict) else 60
        table.add_row(
            visible(str(op["position"])),
            visible(name),
            str(op["status"]),
            _short(op.get("args"), 50),
            _short(shown, limit) if shown != "" else "",
            str(op["attempts"]),
            "" if op.get("ms") is None else f"{op['ms']:.1f}",
        )
    console.print(table)


def history_cmd(
    key: Annotated[str, typer.Argument(help="The run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    payloads: Annotated[bool, typer.Option("--payloads", help="Show each step's payload.")] = False,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """The run's journal, step by step."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        key = named_key(store, key)
        found = read_salvaged(store.backend, key)
        if found is None:
            raise no_run(key, store)
        entries = run_timeline(found)
        if as_json:
            if not payloads:
                for e in entries:
                    e.pop("payload", None)
            _print_json(entries)
            return
        console = _console()
        console.print(_history_table(key, found.head.kind, entries, payloads=payloads))
        if found.damaged:
            console.print(Text.assemble(("corrupt", "red"), ": ", visible(damage_report(found))))


def _history_table(key: str, kind: str, entries: list[dict[str, Any]], *, payloads: bool) -> Table:
    """The table of ``stepstone history``: one row per entry of the run's timeline."""
    if kind == "agent":
        turns = sum(1 for e in entries if e["kind"] == "model")
        calls = sum(1 for e in entries if e["kind"] in ("tool", "subagent"))
        runs = sum(1 for e in entries if e["kind"] == "run")
        what = f"agent run, {turns} turn(s), {calls} tool call(s), {runs} run(s)"
    else:
        rows = sum(1 for e in entries if e["seq"] is not None)
        stop = "" if rows == len(entries) else f", then {entries[-1]['kind']}"
        what = f"{rows} journal row(s){stop}"
    detailed = any(e.get("detail") for e in entries)
    table = Table(title=f"{key}: {what}")
    columns = ("seq", "kind", "name", *(("what",) if detailed else ()), "started", "took", "gap")
    for col in (*columns, "error"):
        justify = "right" if col in ("took", "gap") else "left"
        table.add_column(col, overflow="fold", justify=justify)  # type: ignore[arg-type]
    if payloads:
        table.add_column("payload", overflow="fold")
    for e in entries:
        err = e.get("error")
        seq = "-" if e["seq"] is None else str(e["seq"])
        cells = [seq, e["kind"], str(e["name"])]
        if detailed:
            cells.append(str(e.get("detail") or ""))
        cells += [
            clock_time(e.get("started_at")),
            span(e.get("duration_seconds")),
            span(e.get("gap_seconds")),
        ]
        cells.append(_error_text(err) if err else "")
        if payloads:
            cells.append(_short(e.get("payload")))
        table.add_row(*cells)
    return table


def stranded_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Runs whose owner died and which nobody resumed, oldest first."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        found = stranded_runs(store)
        if as_json:
            _print_json(found)
            return
        keys = [s["key"] for s in found]
        table = key_table(
            keys,
            "key",
            *("kind", "status", "next step", "dead owner", "idle for"),
            title=f"{len(found)} stranded run(s)",
        )
        for s in found:
            table.add_row(
                s["key"],
                s["kind"],
                s["status"],
                str(s["next_step"]),
                f"pid {s['owner_pid']} on {str(s['owner_host']).split('/')[0]}",
                f"{s['age_seconds']:.0f} s",
            )
        keyed_console(keys, 80).print(table)


def diff_cmd(
    key_a: Annotated[str, typer.Argument(help="First run's key.")],
    key_b: Annotated[str, typer.Argument(help="Second run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Where two runs diverged: steps, payloads, errors."""
    with open_store(db, url, debug=debug, read_only=True) as store:
        key_a, key_b = named_key(store, key_a), named_key(store, key_b)
        result = diff_runs(store, key_a, key_b)
        if as_json:
            _print_json(result)
            return
        console = _console()
        console.print(f"{key_a} and {key_b}: {result['same_prefix']} identical journal row(s)")
        if result["identical"]:
            console.print("the two runs are identical")
            return
        first = result["first_difference"]
        if first is None:  # the same journal: they differ in where they stand
            for side, key in (("a", key_a), ("b", key_b)):
                end = result["ends"][side]
                err = end["error"]
                why = f": {err.get('type')}: {err.get('message')}" if err else ""
                console.print(f"  {key}: {end['status']}, next step {end['next_step'] or '-'}{why}")
        else:
            for side, key in (("a", key_a), ("b", key_b)):
                e = first[side]
                if e is None:
                    console.print(f"  {key}: ends here")
                else:
                    what = (
                        f"error {_error_text(e['error'])}"
                        if e.get("error")
                        else _short(e["payload"])
                    )
                    at = "" if e["seq"] is None else f"#{e['seq']} "
                    console.print(f"  {key}: {at}{e['kind']} {e['name']}: {what}")


def cancel_cmd(
    key: Annotated[str, typer.Argument(help="The run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    reason: Annotated[str, typer.Option(help="Why (recorded in the run).")] = "cancelled",
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Cancel a run: a live owner stops at its next commit; a stopped run is marked now."""
    with open_store(db, url, debug=debug) as store:
        key = named_key(store, key)
        outcome = cancel_run(store, key, reason=reason)
        if as_json:
            _print_json({"key": key, "outcome": outcome})
            return
        _console().print(f"{key}: {outcome}")


def fork_cmd(
    key: Annotated[str, typer.Argument(help="The run to copy.")],
    at: Annotated[str, typer.Option("--at", help="Keep the journal up to this step.")],
    to: Annotated[str, typer.Option("--to", help="The new run's key.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Copy a run up to and including --at into a new paused run --to (resume it there)."""
    with open_store(db, url, debug=debug) as store:
        key = named_key(store, key)
        head = fork_run(store, key, at=at, to=to)
        if as_json:
            _print_json({"key": head.key, "from": key, "next_step": head.next_step})
            return
        resumes = (
            f"resumes at {head.next_step!r}"
            if head.next_step is not None
            else "a done copy: nothing ran after it"
        )
        _console().print(f"forked {key} at {at!r} to {to}: {resumes}")


def retry_cmd(
    key: Annotated[str, typer.Argument(help="The run to rewind.")],
    from_step: Annotated[str, typer.Option("--from", help="The step to run again.")],
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Rewind a stopped run to --from STEP: its next resume=True run re-runs that step."""
    with open_store(db, url, debug=debug) as store:
        key = named_key(store, key)
        head = retry_run(store, key, from_step=from_step)
        entry = requeue_run(store, key)  # a run from a queue: back in it, for a worker
        queue = existing_queue(store) if entry is None else None
        waiting = queue.active_entry(key) if queue is not None else None  # already in it
        if as_json:
            _print_json(
                {
                    "key": key,
                    "next_step": head.next_step,
                    "status": head.status,
                    "requeued": entry,
                    "queued": entry or waiting,
                }
            )
            return
        if entry is not None:
            then = f"its queue entry {entry} is queued again: a worker resumes it"
        elif waiting is not None:
            then = f"its queue entry {waiting} is still in the queue: a worker resumes it"
        else:
            then = "resume=True runs it again"
        _console().print(
            f"{key} rewound: {steps_done(head)} step(s) kept, next {head.next_step!r}; {then}"
        )


def approve_cmd(
    key: Annotated[str, typer.Argument(help="The paused agent run, or the Plan it paused.")],
    call_id: Annotated[str, typer.Argument(help="The tool call id it waits for.")],
    deny: Annotated[
        str | None,
        typer.Option("--deny", help="Refuse the call; the model reads this reason."),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="Change a decision already recorded (by you or another operator)."
        ),
    ] = False,
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Approve (or --deny) a tool call a paused run waits for; its next resume applies it."""
    with open_store(db, url, debug=debug) as store:
        key = named_key(store, key)
        decision: bool | str = True if deny is None else deny
        done = approve_call(store, key, call_id, decision=decision, replace=replace)
        if as_json:
            _print_json(done)
            return
        where = "" if done["run_key"] == key else f" (agent run {done['run_key']})"
        if not done["changed"]:
            _console().print(
                f"{key}{where}: {done['tool']} call {call_id} is already "
                f"{decision_text(decision)}; nothing changed"
            )
            return
        instead = (
            f" (it was {decision_text(done['previous'])})" if done["previous"] is not None else ""
        )
        then = (
            f"its queue entry {done['requeued']} is queued again: a worker continues the run"
            if done.get("requeued")
            else "the run's next resume applies it"
        )
        _console().print(
            f"{key}{where}: {decision_text(decision)} {done['tool']} call {call_id}{instead}; "
            + then
        )


_ENTRY_STATUSES = ("queued", "running", *FINAL_STATUSES)


def queue_cmd(
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Only these queues (repeat).")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(help=f"Only these statuses ({', '.join(_ENTRY_STATUSES)}; repeat)."),
    ] = None,
    limit: Annotated[
        int, typer.Option(parser=whole(1), metavar="N", help="Show the last N entries.")
    ] = 50,
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List the work queue's entries (oldest first): runs queued, running and finished."""
    statuses = split_values(status)
    wrong = [s for s in statuses if s not in _ENTRY_STATUSES]
    if wrong:
        fail(f"--status {', '.join(wrong)}: an entry is one of {', '.join(_ENTRY_STATUSES)}", 2)
    queues = split_values(queue)
    with open_store(db, url, debug=debug) as store:
        found = existing_queue(store)
        entries = [
            e
            for e in (found.entries(None, None) if found is not None else [])
            if (not queues or e.queue in queues) and (not statuses or e.status in statuses)
        ][-limit:]
        if as_json:
            _print_json([_entry_view(e) for e in entries])
            return
        keys = [e.run_key for e in entries]
        table = key_table(
            keys, "run key", "entry", "queue", "status", "attempts", "target", "error"
        )
        for e in entries:
            table.add_row(
                e.run_key,
                e.id[:12],
                e.queue,
                e.status + (" (cancel asked)" if e.cancel_requested else ""),
                f"{e.attempts}/{e.max_attempts}",
                e.target,
                " ".join((e.error or "").split()),  # whole: it wraps in its cell
            )
        keyed_console(keys, 100).print(table if entries else "no queue entries")


def _entry_view(e: QueueEntry) -> dict[str, Any]:
    """An entry as ``stepstone queue --json`` prints it (its task and result left out)."""
    keep = ("id", "queue", "status", "attempts", "max_attempts", "run_key", "target")
    more = ("priority", "dedupe_key", "worker", "host", "pid", "error")
    times = ("not_before", "started_at", "created_at", "updated_at")
    view = {name: getattr(e, name) for name in (*keep, *more, *times)}
    return {**view, "cancel_requested": bool(e.cancel_requested)}


def _error_place(err: dict[str, Any]) -> str:
    """Where a run's recorded error happened (`` at 'load'``), or nothing when it names no
    step or node (a workflow run that failed between its steps)."""
    where = err.get("step") or err.get("node")
    return "" if where is None else f" at {where!r}"
