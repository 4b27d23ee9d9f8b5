"""Rich rendering of checkpoints and runs, shared by `stepstone inspect`, `runs` and the demo.

Stored text (keys, step names, errors, queue targets) is the users' and may hold anything:
every human-readable line shows it through :func:`visible`, so a newline in a key cannot
split a row and an escape sequence cannot reach the terminal, and never as Rich markup.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Span, Text

from stepstone.store import Store, StoreEntry

if TYPE_CHECKING:
    from stepstone.cli._runs import RunLine

__all__ = [
    "entry_json",
    "key_table",
    "key_width",
    "keyed_console",
    "named_key",
    "print_json",
    "render_entry",
    "render_runs",
    "unescape",
    "visible",
    "visible_console",
]

_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def visible(text: object) -> str:
    """``text`` as a terminal may show it: each character that is not printable written as
    its escape, as Python writes it in a string literal: C0 and C1 control characters
    (``\\n``, ``\\t``, ``\\x1b``, ``\\x85``), DEL, format characters such as bidi overrides
    (``\\u202e``), separators other than the space (``\\xa0``, ``\\u2028``). A byte that was
    not UTF-8 (kept as a lone surrogate) is written ``\\xNN``. Printable text, backslashes
    included, is kept as it is, so the result is printable and holds no newline."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def _escape(c: str) -> str:
    n = ord(c)
    if c in _SHORT:
        return _SHORT[c]
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape: a byte of invalid UTF-8
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[ntr\\])")
_LETTER = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    """The text the escapes of :func:`visible` (and ``\\\\`` for a backslash) spell:
    ``unescape(visible(key)) == key`` for a key holding no backslash."""

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) == 1:
            return _LETTER[code]
        n = int(code[1:], 16)
        return chr(n) if n <= 0x10FFFF else m.group(0)

    return _ESCAPE.sub(one, text)


def named_key(store: Store, key: str) -> str:
    """The key an operator named on the command line: ``key`` itself when the store holds
    it; else, when ``key`` holds escapes as the tables print them (``a\\nb``, copied from a
    table), the key they spell when the store holds that one; else the key of the agent
    run whose ``run_id`` it is (:func:`named_run`); else ``key`` (whose error then names it
    as it was typed)."""
    if "\\" in key:
        meant = unescape(key)
        if meant != key and not _holds(store, key) and _holds(store, meant):
            return meant
    # the kernel: loaded by a command that reads runs, not by every command
    from stepstone.durable._inspect import named_run

    return named_run(store, key)


def _holds(store: Store, key: str) -> bool:
    return key in store.keys(prefix=key)


class _VisibleConsole(Console):
    """A console that shows every string it renders (table cells and titles included)
    through :func:`visible`; Text objects are the caller's to make visible."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)


def visible_console(*, markup: bool = False, **kwargs: Any) -> Console:
    """A console for stored text: each string it prints shown through :func:`visible`,
    no emoji codes (``:smile:`` stays text), and no markup unless ``markup`` (then the
    caller escapes stored text with ``rich.markup.escape``)."""
    return _VisibleConsole(markup=markup, emoji=False, **kwargs)


def print_json(console: Console, data: Any) -> None:
    """Print ``data`` as indented, highlighted JSON whose strings show each character that
    is not printable as a JSON escape (``\\u001b``, ``\\u202e``): still JSON, and safe on a
    terminal. Other non-ASCII text (``é``, ``日本``) is printed as it is."""
    text = json.dumps(data, indent=2, default=str, ensure_ascii=False)
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == "\n" else _json_escape(c) for c in text)
    shown = JSONHighlighter()(Text(text))
    shown.no_wrap = True
    shown.overflow = "ignore"
    console.print(shown, soft_wrap=True)


def _json_escape(c: str) -> str:
    n = ord(c)
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character beyond the BMP
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def _m(value: Any) -> str:
    """Stored ``value`` for a markup string: visible, and its ``[`` never markup."""
    return escape(visible(value))


_STATUS_STYLE = {
    "done": "green",
    "failed": "red",
    "paused": "yellow",
    "running": "cyan",
    "claimed": "cyan",
}


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts or 0))


def entry_json(entry: StoreEntry) -> dict[str, Any]:
    """A store entry as one JSON object (``stepstone inspect --json``)."""
    return {
        "key": entry.key,
        "kind": entry.kind,
        "run_kind": entry.run_kind,
        "version": entry.version,
        "updated_at": entry.updated_at,
        "value": entry.value,
    }


def render_entry(console: Console, entry: StoreEntry, *, history: bool = True) -> None:
    """Print a plain value, or a checkpoint in the shape of the engine that wrote it."""
    key = _m(entry.key)
    if entry.kind == "value":
        console.print(f"[bold]{key}[/] is a plain value:")
        print_json(console, entry.value)
        return
    state = entry.value
    if entry.run_kind == "replan" and isinstance(state, dict):
        from stepstone.cli._render_replan import render_replan

        return render_replan(console, entry, history=history)
    if entry.run_kind == "plan" and isinstance(state, dict):
        _render_plan(console, entry, state, history=history)
    elif entry.run_kind == "graph" and isinstance(state, dict):
        _render_graph(console, entry, state)
    else:
        console.print(f"[bold]{key}[/]  {_m(entry.run_kind)} run  version {entry.version}:")
        print_json(console, state)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _status(status: Any) -> str:
    style = _STATUS_STYLE.get(str(status), "white")
    return f"[{style}]{_m(status)}[/]"


def _render_error(console: Console, err: Any, where: str) -> None:
    if isinstance(err, dict):
        console.print(
            f"  [red]error[/] at {where} {_m(repr(err.get(where) or err.get('step')))}: "
            f"{_m(err.get('type'))}: {_m(err.get('message'))}"
        )
    elif err:
        console.print(f"  [red]error[/]: {_m(err)}")


def _render_plan(
    console: Console, entry: StoreEntry, state: dict[str, Any], *, history: bool
) -> None:
    console.print(
        f"[bold]{_m(entry.key)}[/]  plan run  status {_status(state.get('status'))}  "
        f"next step [bold]{_m(_or_dash(state.get('next_step')))}[/]"
    )
    console.print(
        f"  run_uid {_m(state.get('run_uid'))}  iteration {_m(state.get('iteration'))}  "
        f"version {entry.version}  updated {_when(entry.updated_at)}"
    )
    console.print(f"  completed steps: {_m(state.get('completed_steps'))}")
    kv = state.get("kv") or {}
    console.print(f"  kv keys: {_m(sorted(kv))}")
    _render_error(console, state.get("error"), "step")
    if history and state.get("history"):
        table = Table(title="history", show_lines=False)
        table.add_column("#", justify="right")
        table.add_column("step")
        table.add_column("iteration", justify="right")
        table.add_column("payload")
        for i, item in enumerate(state["history"], 1):
            env = item.get("envelope") or {}
            table.add_row(
                str(i),
                _m(item.get("step")),
                _m(item.get("iteration")),
                _m(_short(env.get("payload"))),
            )
        console.print(table)


def _render_graph(console: Console, entry: StoreEntry, state: dict[str, Any]) -> None:
    console.print(
        f"[bold]{_m(entry.key)}[/]  graph run  status {_status(state.get('status'))}  "
        f"next node [bold]{_m(_or_dash(state.get('next_node')))}[/]"
    )
    console.print(
        f"  invocation_id {_m(state.get('invocation_id'))}  "
        f"correlation_id {_m(state.get('correlation_id'))}  "
        f"attempt {_m(state.get('attempt_index'))}  version {entry.version}  "
        f"updated {_when(entry.updated_at)}"
    )
    if state.get("resumed_from"):
        console.print(f"  resumed from {_m(state['resumed_from'])}")
    console.print(
        f"  schema version {_m(repr(state.get('schema_version')))}  "
        f"serialization {_m(state.get('serialization'))}"
    )
    positions = state.get("completed_positions") or []
    names = [p[1] if isinstance(p, list) and len(p) > 1 else p for p in positions]
    console.print(f"  completed nodes: {_m(names)}")
    _render_error(console, state.get("error"), "node")
    console.print("  state:")
    print_json(console, state.get("state"))


def key_table(keys: list[str], key_column: str, *columns: str, title: str | None = None) -> Table:
    """A table whose ``key_column`` shows every key whole (never cropped, so it can be
    copied into the next command) and whose other columns wrap rather than crop; print it
    on a console :func:`keyed_console` made (which shows stored text through
    :func:`visible`)."""
    table = Table(title=title)
    longest = max((cell_len(visible(k)) for k in keys), default=0)
    table.add_column(key_column, no_wrap=True, min_width=max(longest, len(key_column)))
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def key_width(keys: list[str], others: int) -> int:
    """A console width for the longest of ``keys`` (as :func:`visible` shows it) and
    ``others`` columns of other text: a narrow terminal then wraps the lines rather than a
    table cropping a key."""
    longest = max((cell_len(visible(k)) for k in keys), default=0)
    return max(Console().width, longest + others)


def keyed_console(keys: list[str], others: int = 60) -> Console:
    """A :func:`visible_console` (no markup), :func:`key_width` wide."""
    return visible_console(width=key_width(keys, others))


#: Lines `stepstone runs` hands the terminal at once: the first ones show at once.
_BATCH = 200


def render_runs(
    console: Console,
    lines: list[RunLine],
    *,
    now: float | None = None,
    total: int | None = None,
    offset: int = 0,
) -> None:
    """Print one row per durable run, one line each, under a title saying how many runs
    match (``total``, all pages) and which page this is (``offset``).

    The table is laid out here, not by Rich: its columns are as wide as their widest cell,
    keys are printed whole (a row longer than the terminal wraps on it rather than being
    cut), and the rows go out as they are made, in batches, so a listing of many thousands
    of runs starts at once and costs milliseconds per thousand rows (Rich's own table lays
    out every cell of every row before it prints the first)."""
    now = time.time() if now is None else now
    total = len(lines) if total is None else total
    title = f"{total} run(s)"
    if len(lines) < total:
        title += f", {offset + 1}-{offset + len(lines)} shown" if lines else ", none shown"
    head = ("key", "kind", "status", "next step", "steps", "owner", "updated", "error")
    rows = [_run_cells(line, now) for line in lines]
    widths = [len(h) for h in head]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], cell_len(text))
    edges = box.HEAVY_HEAD.substitute(console.options)
    padded = [w + 2 for w in widths]
    width = sum(padded) + len(padded) + 1
    out = [Text(title.center(width).rstrip(), style="table.title"), Text(edges.get_top(padded))]
    header = [(h, "table.header") for h in head]
    out.append(_row(header, widths, edges.head_left, edges.head_vertical, edges.head_right))
    out.append(Text(edges.get_row(padded, "head")))
    for row in rows:
        out.append(_row(row, widths, edges.mid_left, edges.mid_vertical, edges.mid_right))
        if len(out) >= _BATCH:
            _emit(console, out)
            out = []
    out.append(Text(edges.get_bottom(padded)))
    _emit(console, out)
    if offset + len(lines) < total:
        console.print(f"more: --offset {offset + len(lines)} shows the next page")


#: A cell of `stepstone runs`: its text and its style (the owner column's style colours
#: only its first word, the state).
_Cell = tuple[str, str]


def _run_cells(line: RunLine, now: float) -> list[_Cell]:
    """The cells of one run's row, stored text shown through :func:`visible`."""
    if line.head is None:
        return [
            (visible(line.key), ""),
            ("?", ""),
            ("corrupt", "red"),
            ("-", ""),
            ("-", ""),
            (visible(line.corrupt), ""),
            ("-", ""),
            ("-", ""),
        ]
    from stepstone.durable._inspect import steps_done

    h = line.head
    state, detail = line.owner(now)
    owner = ("-", "")
    if state == "superseded":
        owner = (f"superseded {visible(detail)}", "yellow")
    elif state != "-":
        owner = (f"{state} ({visible(detail)})", "green" if state == "live" else "red")
    err = line.error
    return [
        (visible(h.key), ""),
        (visible(h.kind), ""),
        (f"{visible(h.status)}, damaged", "red")
        if line.damaged
        else (visible(h.status), _STATUS_STYLE.get(str(h.status), "white")),
        (visible(_or_dash(h.next_step)), ""),
        (str(steps_done(h)), ""),
        owner,
        (_when(h.updated_at), ""),
        (visible(err.get("type")), "red") if err else ("", ""),
    ]


def _row(cells: list[_Cell], widths: list[int], left: str, between: str, right: str) -> Text:
    """One line of the table; only the owner's state (its first word) takes its style."""
    parts = [left]
    spans: list[Span] = []
    at = len(left)
    for i, (text, style) in enumerate(cells):
        if style:
            styled = len(text.split(" ", 1)[0]) if i == _OWNER else len(text)
            spans.append(Span(at + 1, at + 1 + styled, style))
        gap = " " * (widths[i] - cell_len(text) + 1)
        edge = between if i < len(cells) - 1 else right
        parts += (" ", text, gap, edge)
        at += 1 + len(text) + len(gap) + len(edge)
    return Text("".join(parts), spans=spans)


_OWNER = 5  # the owner column: only its state (live, dead) is coloured


def _emit(console: Console, lines: list[Text]) -> None:
    """Print ``lines`` as they are: no wrapping, no cropping, no highlighting."""
    if lines:
        console.print(Text("\n").join(lines), soft_wrap=True, highlight=False)


@contextmanager
def progress_bar(label: str, *, hidden: bool) -> Iterator[Callable[[int, int], None]]:
    """A transient ``label ━━━ done/total`` bar on stderr while the block runs; yields the
    callback long work reports ``(done, total)`` to. Not shown when ``hidden`` (JSON
    output, a dry run) or when stderr is not a terminal."""
    err = Console(stderr=True)
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=hidden or not err.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
