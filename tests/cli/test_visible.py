"""Stored text never steers the operator's terminal: keys, step names and errors holding
control characters, escape sequences, bidi overrides or Rich markup are printed escaped by
every human-readable output of `stepstone`, `--json` keeps them exact, and a key copied
from a table in its escaped form names the run."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store, submit
from stepstone.cli import app

runner = CliRunner()

#: key -> how a table shows it
HOSTILE = {
    "two\nlines": "two\\nlines",
    "tab\there": "tab\\there",
    "clear\x1b[2Jscreen": "clear\\x1b[2Jscreen",
    "nel\x85c1": "nel\\x85c1",
    "bidi\u202eevil": "bidi\\u202eevil",
    "bell\x07del\x7f": "bell\\x07del\\x7f",
    "[bold]markup[/]": "[bold]markup[/]",
    ":smile:": ":smile:",
}


def _broken(payload: Any) -> str:
    raise ValueError("row\x1b[31m red\nsecond line\u202e")


def _store(db: Path) -> None:
    with Store(db=db) as store:
        for key in HOSTILE:
            steps = [Step(lambda p: "x" * 10, name="ex\ntract"), Step(_broken, name="lo[red]ad")]
            if key.startswith(("[", ":")):  # two finished runs, for prune
                steps = steps[:1]
            assert Agent(engine=Plan(*steps, store=store, checkpoint_key=key))("go") is not None


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def _unsafe(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (line ends aside)."""
    return [
        c
        for c in text
        if c != "\n" and (not c.isprintable() or unicodedata.category(c) in ("Cc", "Cf"))
    ]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.sqlite"
    _store(path)
    return path


def test_visible_escapes_what_is_not_printable_and_unescape_reads_it_back() -> None:
    # guarantee 225
    from stepstone.cli._render import unescape, visible

    for key, shown in HOSTILE.items():
        assert visible(key) == shown and unescape(shown) == key
    assert visible("日本 é ok\\n") == "日本 é ok\\n"  # printable text, backslash, as it is
    assert visible("\xa0\u2028\U000e0001") == "\\xa0\\u2028\\U000e0001"
    assert unescape("a\\\\nb") == "a\\nb" and unescape("\\q \\U99999999") == "\\q \\U99999999"


def test_every_human_output_shows_stored_control_text_escaped(db: Path) -> None:
    # guarantee 225
    d = str(db)
    outputs = {}
    commands: list[list[str]] = [
        ["runs", "--db", d],
        ["runs", "--db", d, "--status", "failed", "--limit", "3"],
        ["stranded", "--db", d],
        ["prune", "--db", d, "--keep-last", "0", "--min-age", "0s", "--dry-run"],
        ["show", "nope", "--db", d],  # its error suggests keys
        ["show", "s", "--db", d],
        ["inspect", "nope", "--db", d],
        ["diff", "two\nlines", "clear\x1b[2Jscreen", "--db", d],
    ]
    for key in HOSTILE:
        commands += [
            ["show", key, "--db", d],
            ["history", key, "--db", d, "--payloads"],
            ["inspect", key, "--db", d],
        ]
    for args in commands:
        code, out, err = _cli(*args)
        assert code in (0, 1), (args, out, err)
        assert _unsafe(out + err) == [], (args, out + err)
        outputs[tuple(args)] = out + err
    table = outputs[("runs", "--db", d)]
    for shown in HOSTILE.values():
        assert shown in table  # escaped, never cropped, never markup
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == len(HOSTILE)  # a newline in a key does not split its row
    assert "two\\nlines" in outputs[("show", "two\nlines", "--db", d)]
    history = outputs[("history", "two\nlines", "--db", d, "--payloads")]
    # the failed step ends the history (it never journaled), its markup shown as text
    assert "ex\\ntract" in history and "lo[red]ad" in history and "\\x1b[31m" in history
    shown = outputs[("show", "clear\x1b[2Jscreen", "--db", d)]
    assert "lo[red]ad" in shown and "row\\x1b[31m red\\nsecond line\\u202e" in shown
    assert "\\u001b[31m" in shown  # the record's JSON, escaped the JSON way
    assert (
        "[bold]markup[/]"
        in outputs[("prune", "--db", d, "--keep-last", "0", "--min-age", "0s", "--dry-run")]
    )
    assert ":smile:" in outputs[("inspect", ":smile:", "--db", d)]  # no emoji either
    suggestion = outputs[("show", "s", "--db", d)]
    assert suggestion.startswith("error: ") and suggestion.count("\n") == 1
    assert "'two\\nlines'" in suggestion and "'clear\\x1b[2Jscreen'" in suggestion


def test_confirmations_of_writes_show_keys_escaped(db: Path) -> None:
    # guarantee 225
    d = str(db)
    with Store(db=db) as store:  # queued first: this process remembers a store had no queue
        handle = submit(store, "tests.workers.targets:make_plan", "{}", key="queued\nrun\x1b]0;")
        assert handle is not None
    for args in (
        ["cancel", "bidi\u202eevil", "--db", d],
        ["retry", "tab\there", "--from", "lo[red]ad", "--db", d],
        ["fork", "two\nlines", "--at", "ex\ntract", "--to", "copy\x1bof", "--db", d],
    ):
        code, out, err = _cli(*args)
        assert code == 0, (args, err)
        assert _unsafe(out + err) == [] and out.count("\n") == 1, (args, out)
    code, out, _ = _cli("queue", "--db", d)
    assert code == 0 and _unsafe(out) == [] and "queued\\nrun\\x1b]0;" in out


def test_a_terminal_gets_colours_but_never_the_stored_escape_sequence(db: Path) -> None:
    # guarantee 225: with colours on, the only escape sequences are Rich's own styles
    code, out, _ = _cli("runs", "--db", str(db), env={"FORCE_COLOR": "1"})
    assert code == 0 and "\x1b[31m" in out  # failed, in red
    assert "\x1b[2J" not in out and "clear\\x1b[2Jscreen" in out and "\u202e" not in out


def test_json_keeps_stored_text_exact(db: Path) -> None:
    # guarantee 225
    code, out, _ = _cli("runs", "--db", str(db), "--json")
    assert code == 0
    assert sorted(r["key"] for r in json.loads(out)) == sorted(HOSTILE)
    code, out, _ = _cli("show", "clear\x1b[2Jscreen", "--db", str(db), "--json")
    assert json.loads(out)["error"]["message"] == "row\x1b[31m red\nsecond line\u202e"


def test_a_key_is_named_as_typed_or_as_a_table_shows_it(db: Path) -> None:
    # guarantee 226
    d = str(db)
    for key, shown in HOSTILE.items():
        for typed in (key, shown):
            code, out, err = _cli("show", typed, "--db", d, "--json")
            assert code == 0, (typed, err)
            assert json.loads(out)["key"] == key
    code, out, _ = _cli("inspect", "two\\nlines", "--db", d, "--json")
    assert code == 0 and json.loads(out)["key"] == "two\nlines"
    code, out, _ = _cli("diff", "two\\nlines", "tab\\there", "--db", d, "--json")
    assert code == 0 and json.loads(out)["identical"]
    # a key that really holds the backslash wins over the one its escapes spell
    with Store(db=db) as store:
        plan = Plan(Step(lambda p: "y", name="only"), store=store, checkpoint_key="two\\nlines")
        Agent(engine=plan)("go")
    code, out, _ = _cli("show", "two\\nlines", "--db", d, "--json")
    assert code == 0 and json.loads(out)["key"] == "two\\nlines"
    code, out, _ = _cli("show", "two\nlines", "--db", d, "--json")
    assert code == 0 and json.loads(out)["key"] == "two\nlines"
    code, _, err = _cli("show", "no\\nsuch", "--db", d)
    assert code == 1 and "no run under key 'no\\\\nsuch'" in err
