"""The effect journal's row format: what a writer encodes, a reader expands back exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepstone.durable._effects import hash_json
from stepstone.durable._journal_format import (
    ENTRIES_KIND,
    EntryReader,
    EntryWriter,
    FormatError,
    apply_changes,
    changes,
    expand,
    read_entries,
)
from stepstone.store import JournalRow

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=3),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)
objects = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), values, max_size=4)


def _text(value: Any) -> str:
    """JSON text with the keys in their order: equal texts are the very same JSON value."""
    return json.dumps(value)


def _edit(before: dict[str, Any], new_values: list[Any]) -> dict[str, Any]:
    """``before`` with some values replaced (same keys, same order)."""
    after = dict(before)
    for key, value in zip(list(after), new_values, strict=False):
        after[key] = value
    return after


@settings(max_examples=300, deadline=None)
@given(objects, st.lists(values, max_size=4))
def test_changes_give_back_exactly_the_later_object(before: dict[str, Any], new: list[Any]) -> None:
    # guarantee 450: a record stored as its changes reads back as the same JSON value,
    # types (1, 1.0, True) and key order included
    after = _edit(before, new)
    paths = changes(before, after)
    assert paths is not None
    assert _text(apply_changes(before, json.loads(json.dumps(paths)))) == _text(after)


@settings(max_examples=200, deadline=None)
@given(objects, objects)
def test_objects_with_other_keys_are_not_given_as_changes(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    paths = changes(before, after)
    if list(before) != list(after):
        assert paths is None
    else:
        assert paths is not None
        assert _text(apply_changes(before, paths)) == _text(after)


def test_numbers_of_another_type_are_changes() -> None:
    # guarantee 450
    before = {"n": 1, "inner": {"x": 1, "y": True}}
    for after in ({"n": 1.0, "inner": {"x": 1, "y": True}}, {"n": 1, "inner": {"x": True, "y": 1}}):
        restored = apply_changes(before, changes(before, after))
        assert _text(restored) == _text(after)


def test_changes_that_do_not_fit_the_object_are_refused() -> None:
    before = {"a": {"b": 1}, "c": 2}
    for bad in ([["z", 1]], [["a", "z", 1]], [["c", "d", 1]], ["a"], [[1, 2]], "x"):
        with pytest.raises(FormatError):
            apply_changes(before, bad)


def _effect(kind: str, turn: int, index: int, name: str, data: dict[str, Any] | None) -> Any:
    intent = {"kind": kind, "name": name, "turn": turn, "index": index, "call_id": f"c{turn}"}
    intent["input_hash"] = hash_json({"n": name, "t": turn})
    pos = f"{kind}:{turn}:{index}"
    if data is None:
        return ("intent", pos, intent)
    return ("outcome", pos, {**intent, "output_hash": hash_json(data), "data": data})


def _commits() -> list[list[Any]]:
    """A run's entries, commit by commit, as an agent run journals them."""
    phase = {"run_id": "r", "thread_id": "t", "schema_version": "1", "phase": "pre_llm"}
    out: list[list[Any]] = []
    for turn in range(4):
        answer = {"text": "", "calls": [turn], "usage": {"in": 100, "out": 20 + turn % 2}}
        out.append(
            [
                ("phase", "pre_llm", {**phase, "payload": {"n": turn * 2}, "timestamp_ms": turn}),
                _effect("model", turn, 0, "m", None),
                _effect("model", turn, 0, "m", answer),
                _effect("tool", turn, 0, "look", None),
                ("snapshot", None, {"step": turn, "usage": {"in": turn, "out": 1}, "ctx": {}}),
            ]
        )
        out.append(
            [
                _effect("tool", turn, 0, "look", {"content": "x" * 50}),
                ("phase", "post", {**phase, "phase": "post", "payload": {}, "timestamp_ms": turn}),
            ]
        )
    return out


def _journal(commits: list[list[Any]], first: int = 0) -> list[JournalRow]:
    """The rows a writer commits: the first ``first`` commits one row per entry (the first
    format), the others one ``entries`` row each."""
    rows: list[JournalRow] = []
    writer: EntryWriter | None = None
    intents: dict[str, Any] = {}
    for n, items in enumerate(commits):
        for kind, name, data in items:
            if kind == "intent":
                intents[name] = data
        if n < first:
            for kind, name, data in items:
                rows.append(JournalRow(len(rows), kind, name, json.dumps(data)))
            continue
        if writer is None:  # resumed by this format: it reads what is there first
            reader = EntryReader()
            for row in rows:
                reader.row(row)
            writer = EntryWriter(reader)
        data, remember = writer.encode(items, intents)
        remember()
        rows.append(JournalRow(len(rows), ENTRIES_KIND, None, json.dumps(data)))
    return rows


@pytest.mark.parametrize("first", [0, 3, 8])
def test_a_journal_reads_back_as_its_entries_whatever_format_wrote_them(first: int) -> None:
    # guarantee 450, 452: one row per commit, a journal begun in the first format and
    # continued in this one (a resumed old run), and every entry exactly as written
    commits = _commits()
    written = [(k, n, d) for items in commits for k, n, d in items]
    rows = _journal(commits, first)
    assert len(rows) == sum(len(c) for c in commits[:first]) + len(commits) - first
    entries = read_entries(rows)
    assert [(e.seq, e.kind, e.name) for e in entries] == [
        (i, k, n) for i, (k, n, _) in enumerate(written)
    ]
    assert [_text(e.data) for e in entries] == [_text(d) for _, _, d in written]
    assert [(r.seq, r.kind, r.name, json.loads(r.data)) for r in expand(rows)] == [
        (i, k, n, json.loads(_text(d))) for i, (k, n, d) in enumerate(written)
    ]


def test_an_entries_row_is_smaller_than_its_entries() -> None:
    # guarantee 452
    commits = _commits()
    rows = _journal(commits)
    first = _journal(commits, first=len(commits))
    later = sum(len(r.data) for r in rows[2:])
    before = sum(len(r.data) for r in first[len(commits[0]) + len(commits[1]) :])
    assert later < before * 0.6


def test_an_intent_and_its_outcome_in_one_commit_are_one_entry() -> None:
    commits = _commits()
    data = json.loads(_journal(commits)[0].data)
    assert [e[0] for e in data["e"]] == ["r", "e", "i", "r"]
