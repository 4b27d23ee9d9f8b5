"""How an effect journal lays its entries out in a run's journal rows.

A run that journals effects (an agent run, a workflow) records a sequence of *entries*,
each a JSON object with a kind and a name: an effect's ``intent`` and ``outcome`` (named
by the effect's position ``"kind:turn:index"``), and the engine's own *records* (an agent
run's phase records, messages and runtime snapshots). :class:`Entry` is one of them as
readers see it, whatever format wrote it.

* The first format wrote one journal row per entry, the entry's kind and name as the
  row's, its object as the row's data.
* The current format (version 2) writes one row per commit, of kind ``"entries"``, whose
  data is ``{"v": 2, "e": [...]}``, one JSON array per entry, in the order they were
  journaled:

  - ``["i", kind, turn, index, name, call_id, input_hash]`` an intent (``input_hash_version``
    appended when the hash has one);
  - ``["o", kind, turn, index, output_hash, data]`` an outcome whose name, call id and input
    hash are those of the intent journaled before it at the same position;
  - ``["e", kind, turn, index, name, call_id, input_hash, hash_version, output_hash, data]``
    an intent and its outcome journaled one after the other (a call committed once);
  - ``["O", ...]`` as ``"e"`` for an outcome alone (no intent before it, or another one);
  - ``["r", kind, name, data]`` an engine record;
  - ``["p", kind, name, changes]`` an engine record given as its changes to the previous
    record of the same kind and name: ``changes`` lists ``[key, ..., value]`` paths, each
    setting one value of that record (an outcome's ``data`` may be given the same way,
    against the previous outcome of the same effect kind: ``["o", ..., changes, 1]``).

  A phase record that differs from the previous one of its phase by a counter and a time
  costs those two values instead of the whole record; the views of the run expand every
  entry back into exactly the object the first format stored (see :class:`EntryReader`).

Journals may mix both: a run journaled by the first format and resumed by the current one
keeps its old rows and appends new ones.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from stepstone.core._serialization import dumps
from stepstone.store._base import JournalRow

__all__ = [
    "ENTRIES_KIND",
    "EFFECT_KINDS",
    "FORMAT",
    "Entry",
    "EntryReader",
    "EntryWriter",
    "FormatError",
    "HASH_VERSION",
    "apply_changes",
    "changes",
    "entries_of",
    "expand",
    "position",
    "read_entries",
]

ENTRIES_KIND = "entries"
FORMAT = 2
EFFECT_KINDS = ("intent", "outcome")

#: Written only by a call whose input hash is of version 2 (``durable/_hashing.py``): its
#: input held a set, or another value hash version 1 wrote by an unstable ``str()``. A row
#: without it records a digest both versions agree on, or one version 1 wrote.
HASH_VERSION = "input_hash_version"


def position(kind: str, turn: int, index: int) -> str:
    """An effect's position, its name in the journal: ``"kind:turn:index"``."""
    return f"{kind}:{turn}:{index}"


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a run's journal, as the first format stored it.

    Attributes:
        seq: Its place among the run's entries (in the first format, its row's ``seq``).
        kind: ``"intent"``, ``"outcome"`` or the kind of an engine record.
        name: An effect's position; an engine record's name.
        data: The entry's JSON object (shared with the reader's state: copy it before
            changing it).
    """

    seq: int
    kind: str
    name: str | None
    data: dict[str, Any]
    row: int = -1  # the seq of the journal row that holds it


class FormatError(ValueError):
    """An ``entries`` row that is not what the format writes (a damaged row)."""


# -- changes to a previous object --------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value, types and key order included (``1``
    and ``1.0``, or ``True`` and ``1``, are not the same, as their JSON texts differ)."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is dict:
        if len(a) != len(b):
            return False
        for (k, v), (k2, v2) in zip(a.items(), b.items(), strict=True):
            if k != k2 or not (v is v2 or _same(v, v2)):
                return False
        return True
    if t is list:
        return len(a) == len(b) and all(x is y or _same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[list[Any]] | None:
    """The ``[key, value]`` and ``[key, subkey, value]`` paths that turn ``before`` into
    ``after``, or None when ``after`` is not ``before`` with some values changed (other
    keys, keys in another order, or keys that are not text). An object value with the same
    keys is compared inside, one level deep; any other changed value is given whole.

    Written for speed (an agent turn compares a dozen records): no recursion, and the
    values are compared by identity first (most are the very objects of the record
    before)."""
    if len(before) != len(after):
        return None
    out: list[list[Any]] = []
    for (key, old), (key2, new) in zip(before.items(), after.items()):  # noqa: B905
        if key != key2 or type(key) is not str:
            return None
        if old is new:
            continue
        kind = type(old)
        if kind is type(new):
            if kind is dict:
                inner = _inner(key, old, new)
                if inner is not None:
                    out += inner
                    continue
            elif _same(old, new) if kind is list else old == new:  # a list: types inside too
                continue
        out.append([key, new])
    return out


def _inner(key: str, before: dict[str, Any], after: dict[str, Any]) -> list[list[Any]] | None:
    """:func:`changes` inside the value of ``key`` (paths of two keys), or None when its
    keys differ."""
    if len(before) != len(after) or not before:
        return None
    out: list[list[Any]] = []
    for (sub, old), (sub2, new) in zip(before.items(), after.items()):  # noqa: B905
        if sub != sub2 or type(sub) is not str:
            return None
        if old is not new and not _same(old, new):
            out.append([key, sub, new])
    return out


def apply_changes(before: dict[str, Any], paths: Any) -> dict[str, Any]:
    """``before`` with the changes :func:`changes` listed (a new object; the unchanged
    parts are shared with ``before``).

    Raises:
        FormatError: ``paths`` is not a list of paths to values ``before`` has.
    """
    if type(paths) is not list:
        raise FormatError("the changes are not a list")
    out = dict(before)
    copied: dict[tuple[Any, ...], dict[str, Any]] = {(): out}
    for op in paths:
        if type(op) is not list or len(op) < 2:
            raise FormatError(f"a change {str(op)[:60]!r} is not a [key, ..., value] path")
        node: dict[str, Any] = out
        prefix: tuple[Any, ...] = ()
        for key in op[:-2]:
            prefix = (*prefix, key)
            child = copied.get(prefix)
            if child is None:
                inner = node.get(key) if type(key) is str else None
                if type(inner) is not dict:
                    raise FormatError(f"a change goes through {key!r}, which is not an object")
                child = copied[prefix] = dict(inner)
                node[key] = child
            node = child
        last = op[-2]
        if type(last) is not str or last not in node:
            raise FormatError(f"a change sets {last!r}, which the previous object does not have")
        node[last] = op[-1]
    return out


# -- writing -----------------------------------------------------------------------------------

Item = tuple[str, str | None, dict[str, Any]]


class EntryWriter:
    """Encodes the entries of one commit after the ones already journaled.

    It remembers the last record of each kind and name and the last outcome of each effect
    kind (what the next changes are taken against); :meth:`encode` returns the row's data
    and what to remember, which :meth:`committed` keeps once the commit landed (a commit
    that failed leaves it as it was, for the retry).
    """

    def __init__(self, reader: EntryReader | None = None) -> None:
        """``reader``: the reader of the journal so far (a resumed run continues it)."""
        self.records = dict(reader.records) if reader is not None else {}
        self.outcomes = dict(reader.outcomes) if reader is not None else {}

    def encode(
        self, items: Sequence[Item], intents: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        """The data of the ``entries`` row holding ``items`` (``(kind, name, object)``, in
        journal order), and the call that remembers them once committed. ``intents``: every
        intent journaled so far or in ``items``, by position."""
        records: dict[tuple[str, str | None], dict[str, Any]] = {}
        outcomes: dict[str, dict[str, Any]] = {}
        out: list[list[Any]] = []
        previous: Item | None = None
        for item in items:
            kind, name, data = item
            if kind == "intent":
                out.append(_intent(data))
            elif kind == "outcome":
                effect = data["kind"]
                base = outcomes[effect] if effect in outcomes else self.outcomes.get(effect)
                outcomes[effect] = data["data"]
                if previous is not None and previous[0] == "intent" and _says(previous[2], data):
                    out[-1] = ["e", *_outcome(data, base)[1:]]  # its intent, just before it
                else:
                    out.append(_outcome(data, base, intents.get(str(name))))
            else:
                key = (kind, name)
                base = records[key] if key in records else self.records.get(key)
                records[key] = data
                paths = None if base is None else changes(base, data)
                out.append(["r", kind, name, data] if paths is None else ["p", kind, name, paths])
            previous = item

        def remember() -> None:
            self.records.update(records)
            self.outcomes.update(outcomes)

        return {"v": FORMAT, "e": out}, remember


def _intent(data: dict[str, Any]) -> list[Any]:
    entry = ["i", data["kind"], data["turn"], data["index"], data["name"], data["call_id"]]
    entry.append(data["input_hash"])
    if HASH_VERSION in data:
        entry.append(data[HASH_VERSION])
    return entry


def _says(intent: dict[str, Any], outcome: dict[str, Any]) -> bool:
    """Whether ``intent`` is the intent of ``outcome``: the same position, name, call id and
    input hash (an outcome entry that refers to it is expanded with its fields)."""
    for k in _SAID:
        a, b = intent.get(k), outcome.get(k)
        if a is not b and (type(a) is not type(b) or a != b):
            return False
    return True


_SAID = ("kind", "turn", "index", "name", "call_id", "input_hash", HASH_VERSION)


def _outcome(
    data: dict[str, Any], base: dict[str, Any] | None, intent: dict[str, Any] | None = None
) -> list[Any]:
    """An outcome entry: short (``"o"``) when ``intent`` says all but its output, else long
    (``"O"``, also the tail of a joined ``"e"``); its data as changes to ``base`` when that
    saves something."""
    body: Any = data["data"]
    paths = None if base is None else changes(base, body)
    patched = paths is not None and len(paths) < len(body)
    if patched:
        body = paths
    head = [data["kind"], data["turn"], data["index"]]
    if intent is not None and _says(intent, data):
        return (
            ["o", *head, data["output_hash"], body, 1]
            if patched
            else ["o", *head, data["output_hash"], body]
        )
    version = data.get(HASH_VERSION)
    entry = ["O", *head, data["name"], data["call_id"], data["input_hash"], version]
    entry += [data["output_hash"], body]
    if patched:
        entry.append(1)
    return entry


# -- reading -----------------------------------------------------------------------------------


class EntryReader:
    """Expands a run's journal rows, of either format, into its entries, in order.

    It keeps what an ``entries`` row may refer to (the intents, the last record of each
    kind and name, the last outcome of each effect kind), so rows must be read in order.
    """

    def __init__(self) -> None:
        self.seq = 0
        self._row = -1
        self.intents: dict[str, dict[str, Any]] = {}
        self.records: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}

    def row(self, row: JournalRow) -> list[Entry]:
        """The entries of ``row``.

        Raises:
            ValueError: the row's data is not JSON.
            FormatError: an ``entries`` row that is not what the format writes, or a
                first-format row that is not a JSON object.
        """
        data = json.loads(row.data)
        self._row = row.seq
        if row.kind != ENTRIES_KIND:
            if type(data) is not dict:
                raise FormatError(f"a JSON {type(data).__name__}, not an object")
            return [self._add(row.kind, row.name, data)]
        if type(data) is not dict or data.get("v") != FORMAT or type(data.get("e")) is not list:
            raise FormatError(f"not an entries row of format {FORMAT}")
        out: list[Entry] = []
        for i, raw in enumerate(data["e"]):
            try:
                out.extend(self._entry(raw))
            except (KeyError, IndexError, TypeError) as exc:
                raise FormatError(f"entry {i} is damaged ({type(exc).__name__}: {exc})") from exc
            except FormatError as exc:
                raise FormatError(f"entry {i}: {exc}") from exc
        return out

    def _add(self, kind: str, name: str | None, data: dict[str, Any]) -> Entry:
        entry = Entry(self.seq, kind, name, data, self._row)
        self.seq += 1
        if kind == "intent":
            self.intents[str(name)] = data
        elif kind == "outcome":
            body, effect = data.get("data"), data.get("kind")
            if type(body) is dict and type(effect) is str:
                self.outcomes[effect] = body
        else:
            self.records[(kind, name)] = data
        return entry

    def _entry(self, raw: Any) -> Iterator[Entry]:
        if type(raw) is not list or not raw:
            raise FormatError("not a non-empty array")
        tag = raw[0]
        if tag == "i":
            yield self._add("intent", _pos(raw), _intent_data(raw))
        elif tag in ("o", "O", "e"):
            yield from self._effect(tag, raw)
        elif tag in ("r", "p"):
            kind, name, body = raw[1], raw[2], raw[3]
            if type(kind) is not str or (name is not None and type(name) is not str):
                raise FormatError("a record's kind or name is not text")
            if tag == "p":
                base = self.records.get((kind, name))
                if base is None:
                    raise FormatError(f"changes to a {kind} record {name!r} that was never written")
                body = apply_changes(base, body)
            elif type(body) is not dict:
                raise FormatError(f"a {kind} record that is not an object")
            yield self._add(kind, name, body)
        else:
            raise FormatError(f"unknown entry tag {str(tag)[:20]!r}")

    def _effect(self, tag: str, raw: list[Any]) -> Iterator[Entry]:
        pos = _pos(raw)
        kind, turn, index = raw[1], raw[2], raw[3]
        if tag == "o":
            intent = self.intents.get(pos)
            if intent is None:
                raise FormatError(f"an outcome at {pos} with no intent before it")
            name, call_id, input_hash = intent["name"], intent["call_id"], intent["input_hash"]
            version = intent.get(HASH_VERSION)
            output_hash, body, rest = raw[4], raw[5], raw[6:]
        else:
            name, call_id, input_hash, version = raw[4], raw[5], raw[6], raw[7]
            output_hash, body, rest = raw[8], raw[9], raw[10:]
        if tag == "e":
            intent = {"kind": kind, "name": name, "turn": turn, "index": index}
            intent.update(call_id=call_id, input_hash=input_hash)
            if version is not None:
                intent[HASH_VERSION] = version
            yield self._add("intent", pos, intent)
        if rest and rest[0] == 1:
            base = self.outcomes.get(kind) if type(kind) is str else None
            if base is None:
                raise FormatError(f"changes to a {kind} outcome that was never written")
            body = apply_changes(base, body)
        outcome = {"kind": kind, "name": name, "turn": turn, "index": index, "call_id": call_id}
        outcome["input_hash"] = input_hash
        if version is not None:
            outcome[HASH_VERSION] = version
        outcome.update(output_hash=output_hash, data=body)
        yield self._add("outcome", pos, outcome)


def _pos(raw: list[Any]) -> str:
    kind, turn, index = raw[1], raw[2], raw[3]
    if type(kind) is not str or type(turn) is not int or type(index) is not int:
        raise FormatError("an effect's position is not (text, int, int)")
    return position(kind, turn, index)


def _intent_data(raw: list[Any]) -> dict[str, Any]:
    data = {"kind": raw[1], "name": raw[4], "turn": raw[2], "index": raw[3], "call_id": raw[5]}
    data["input_hash"] = raw[6]
    if len(raw) > 7:
        data[HASH_VERSION] = raw[7]
    return data


# -- views -------------------------------------------------------------------------------------


def read_entries(rows: Sequence[JournalRow], *, strict: bool = True) -> list[Entry]:
    """The entries of a run's journal ``rows`` (of either format), in order, with nothing
    checked but that they decode. ``strict=False`` skips rows that do not (what an operator's
    view shows around damage).

    Raises:
        ValueError: (``strict``) a row that does not decode (:class:`FormatError`, or a
            ``json`` error).
    """
    reader = EntryReader()
    out: list[Entry] = []
    for row in rows:
        try:
            out += reader.row(row)
        except ValueError:
            if strict:
                raise
    return out


def entries_of(rows: Sequence[JournalRow] | Sequence[Entry]) -> Sequence[Entry]:
    """The entries of a journal given as its rows (those that do not decode left out, as
    :func:`read_entries` with ``strict=False``), or already as entries."""
    if rows and isinstance(rows[0], JournalRow):
        return read_entries(cast("Sequence[JournalRow]", rows), strict=False)
    return cast("Sequence[Entry]", rows)


def expand(rows: Sequence[JournalRow]) -> list[JournalRow]:
    """``rows`` as the first format would have written them: each ``entries`` row expanded
    into one row per entry, every row numbered in order (rows of a journal without
    ``entries`` rows come back as they are). A row that does not decode is kept as it is,
    and so is every ``entries`` row after it that needs what it held."""
    if not any(row.kind == ENTRIES_KIND for row in rows):
        return list(rows)
    reader = EntryReader()
    out: list[JournalRow] = []
    for row in rows:
        try:
            entries = reader.row(row)
        except ValueError:
            entries = None
        times = (row.started_at, row.committed_at)  # an entry's: its row's commit's
        if entries is None or row.kind != ENTRIES_KIND:
            out.append(JournalRow(len(out), row.kind, row.name, row.data, *times))
            continue
        for entry in entries:
            out.append(JournalRow(len(out), entry.kind, entry.name, dumps(entry.data), *times))
    return out
