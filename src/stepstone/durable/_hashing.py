"""The input and output hashes of journaled effects: the same digest in every process.

A resume compares the hash of a call's input with the one recorded at its position, maybe
in another process, after a restart, under another ``PYTHONHASHSEED``. So the hash is of a
canonical JSON text (keys sorted, compact separators), and every part of the value has one
text in every process:

* plain JSON (``str``, ``int``, ``float``, ``bool``, ``None``, lists, tuples, dicts with
  ``str`` keys, and dicts whose keys are numbers) is written as JSON writes it;
* a ``set`` or ``frozenset`` is ``{"$stepstone": "set", "v": [...]}`` with its elements
  sorted by their own canonical text (never in the set's iteration order, which depends
  on the hash seed);
* a dict whose keys JSON cannot sort (``str`` and ``int`` keys mixed, tuple or enum keys) is
  ``{"$stepstone": "dict", "v": [[key, value], ...]}``, its pairs sorted by their text;
* any other value is written as its ``str()`` (``datetime``, ``Decimal``, ``UUID``, enums,
  bytes, pydantic models and dataclasses...), as stepstone always hashed it, unless that
  text depends on the process: a pydantic model or dataclass holding a set of two or more
  elements is written field by field (``{"$stepstone": "model" | "dataclass", "cls": ...,
  "v": {...}}``), and a value whose text shows a memory address (``<Foo object at
  0x7f...>``) has no stable encoding at all: only its type is hashed (``{"$stepstone":
  "opaque", "cls": "module:QualName"}``), so a change of such a value is not seen.

Hash version 1 (before this module) wrote every value JSON cannot hold as its ``str()``:
a set's text then depended on the hash seed. Digests of values it encoded stably are
unchanged; for the others :class:`InputHash` carries what version 1 gives in this process,
so a run journaled before can still be checked (see ``EffectJournal.recorded``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

from stepstone.core._serialization import is_model
from stepstone.exceptions import SerializationError

__all__ = ["INPUT_HASH_VERSION", "InputHash", "canonical_hash", "hash_json"]

#: The version of the encoding an effect row whose input held a set (or another value
#: version 1 hashed by an unstable ``str()``) records in its ``input_hash_version`` field.
INPUT_HASH_VERSION = 2

_TAG = "$stepstone"
_COMPACT = (",", ":")
#: A default ``repr`` shows the object's memory address: another text in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class InputHash(str):
    """A :func:`hash_json` digest (the 64 hex digits) and how hash version 1 saw the value.

    Attributes:
        version: 1 when version 1 gives the same digest (every plain JSON value); 2 when the
            value holds a part version 1 hashed by a ``str()`` that depends on the process
            (a set, a memory address) or could not hash at all (keys it cannot sort).
        legacy: For version 2: the digest version 1 gives in this process (None: it could
            not hash the value).
        unstable: For version 2: version 1's digest depends on the process, so one recorded
            by another process cannot be reproduced here.
    """

    version: int = 1
    legacy: str | None = None
    unstable: bool = False


def hash_json(value: Any) -> InputHash:
    """SHA-256 of ``value``'s canonical JSON text (compact separators, keys sorted)."""
    return canonical_hash(value)


def canonical_hash(value: Any, *, separators: tuple[str, str] = _COMPACT) -> InputHash:
    """SHA-256 of ``value``'s canonical JSON text, written with ``separators`` (see the
    module's docstring for what the text of each kind of value is).

    Raises:
        SerializationError: ``value`` contains itself (a list holding itself...).
    """
    encoder = _ENCODERS.get(separators)
    if encoder is None:
        encoder = _ENCODERS[separators] = json.JSONEncoder(
            sort_keys=True, separators=separators, default=_not_plain
        )
    try:  # plain JSON, the usual case: the text version 1 wrote too
        text = encoder.encode(value)
    except (_NotPlain, TypeError, ValueError):
        return _slow_hash(value, separators)
    return InputHash(_digest(text))


#: One encoder per separators (``json.dumps`` with options builds a new one per call, and
#: a durable agent turn hashes four values).
_ENCODERS: dict[tuple[str, str], json.JSONEncoder] = {}


class _NotPlain(Exception):
    pass


def _not_plain(value: Any) -> Any:
    raise _NotPlain


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _slow_hash(value: Any, separators: tuple[str, str]) -> InputHash:
    canon = _Canonical()
    text = json.dumps(canon.convert(value), sort_keys=True, separators=separators)
    out = InputHash(_digest(text))
    try:
        old = json.dumps(value, sort_keys=True, separators=separators, default=str)
    except Exception:  # noqa: BLE001 - keys it could not sort, a failing str(): version 1
        old = None  # never hashed this value
    if old != text:
        out.version = INPUT_HASH_VERSION
        out.legacy = None if old is None else _digest(old)
        out.unstable = old is not None and canon.unstable
    return out


def _text(value: Any) -> str:
    """The canonical text of an already converted value (how set elements are ordered)."""
    return json.dumps(value, sort_keys=True, separators=_COMPACT)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class _Canonical:
    """Converts a value into JSON data whose text is the same in every process."""

    def __init__(self) -> None:
        self.unstable = False  # version 1's text of the value depended on the process
        self._active: set[int] = set()  # containers being converted (a cycle check)

    def convert(self, value: Any) -> Any:
        if value is None or isinstance(value, str | int | float):
            return value  # JSON writes str, int and float subclasses (enums too) as these
        if id(value) in self._active:
            raise SerializationError(
                f"cannot hash a {type(value).__name__} that contains itself; pass a value "
                "without the cycle"
            )
        self._active.add(id(value))
        try:
            if isinstance(value, dict | list | tuple | set | frozenset):
                return self._container(value)
            return self._other(value)
        finally:
            self._active.discard(id(value))

    def _container(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self._mapping(value)
        if isinstance(value, list | tuple):
            return [self.convert(v) for v in value]
        if len(value) > 1:
            self.unstable = True
        items = sorted((self.convert(v) for v in value), key=_text)
        return {_TAG: "frozenset" if isinstance(value, frozenset) else "set", "v": items}

    def _mapping(self, value: dict[Any, Any]) -> Any:
        keys = list(value)
        if all(isinstance(k, str) for k in keys) or _json_sorts(keys):
            return {k: self.convert(v) for k, v in value.items()}  # JSON writes the keys
        pairs = [[self.convert(k), self.convert(v)] for k, v in value.items()]
        return {_TAG: "dict", "v": sorted(pairs, key=_text)}

    def _other(self, value: Any) -> Any:
        try:
            text: str | None = str(value)
        except Exception:  # noqa: BLE001 - version 1 could not hash it either
            text = None
        if text is not None and not _ADDRESS.search(text) and not _holds_unordered(value, set()):
            return text  # as version 1 wrote it
        self.unstable = True
        cls = type(value)
        if is_model(value):
            fields = {**value.__dict__, **(value.__pydantic_extra__ or {})}
            return {_TAG: "model", "cls": _class_path(cls), "v": self._fields(fields)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return {_TAG: "dataclass", "cls": _class_path(cls), "v": self._fields(fields)}
        return {_TAG: "opaque", "cls": _class_path(cls)}  # no stable encoding: its type only

    def _fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {k: self.convert(v) for k, v in fields.items()}


def _json_sorts(keys: list[Any]) -> bool:
    """Whether JSON writes a dict with these keys (numbers, bools, None: sortable)."""
    if not all(k is None or isinstance(k, str | int | float) for k in keys):
        return False
    try:
        sorted(keys)
    except TypeError:
        return False
    return True


def _holds_unordered(value: Any, seen: set[int]) -> bool:
    """Whether ``repr(value)`` shows a set of two or more elements (in iteration order)."""
    if id(value) in seen:
        return False
    if isinstance(value, set | frozenset):
        return len(value) > 1 or any(_holds_unordered(v, seen) for v in value)
    seen.add(id(value))
    if isinstance(value, dict):
        return any(_holds_unordered(k, seen) or _holds_unordered(v, seen) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_unordered(v, seen) for v in value)
    if is_model(value):
        extra = value.__pydantic_extra__ or {}
        return any(_holds_unordered(v, seen) for v in (*value.__dict__.values(), *extra.values()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(
            _holds_unordered(getattr(value, f.name), seen) for f in dataclasses.fields(value)
        )
    return False
