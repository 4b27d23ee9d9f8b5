"""JSON codecs: plain JSON for stored values, a type-tagged JSON that round-trips, and a
signed pickle codec.

Plain JSON (:func:`to_json_value`) is what ``writes=`` values and ``Store.write`` store:
what any reader of the database expects. Tagged JSON (:func:`to_typed_json`, encoding
version :data:`ENCODING_VERSION`) is what step outputs are journaled as, so a resumed run
hands the next step exactly the value a straight run would. Values JSON cannot hold are
tagged ``{"$stepstone": "<type>", "v": ...}`` (plus ``"cls": "module:QualName"`` for
classes):

========================= ===================================================
``datetime``, ``date``,   ``"datetime"``, ``"date"``, ``"time"`` (ISO 8601, offset
``time``, ``timedelta``   kept), ``"timedelta"`` (``[days, seconds, microseconds]``)
``Decimal``, ``UUID``     ``"decimal"``, ``"uuid"`` (their text)
``bytes``, ``bytearray``  ``"bytes"``, ``"bytearray"`` (base64)
``pathlib`` paths         ``"path"`` (the path text; loads as ``Path``)
``set``, ``frozenset``,   ``"set"``, ``"frozenset"``, ``"tuple"`` (a list)
``tuple``
non-finite ``float``      ``"float"`` (``"nan"``, ``"inf"``, ``"-inf"``)
enums                     ``"enum"`` with ``cls`` (the member's value)
dataclasses               ``"dataclass"`` with ``cls`` (fields)
pydantic models           ``"model"`` with ``cls`` (``model_dump(mode="json")``)
dicts with non-str keys   ``"dict"`` (a list of ``[key, value]`` pairs)
========================= ===================================================

A class that cannot be imported when loading (renamed, or defined inside a function)
loads as its plain data. Anything else is stored as ``str(value)`` with an
:class:`~stepstone.exceptions.UnserializableValueWarning` naming where it was found
(``strict=True`` raises :class:`~stepstone.exceptions.SerializationError` instead).

Encoding version 1 (before tags) stored such values as their ``str()`` and tagged only
pydantic models (``{"$stepstone_model": ..., "data": ...}``); it still loads. Pickle is
only available signed: :class:`SignedPickle` refuses data without a valid HMAC.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import hashlib
import hmac
import json
import math
import pathlib
import pickle
import pkgutil
import sys
import uuid
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from stepstone.exceptions import SerializationError, UnserializableValueWarning

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "ENCODING_VERSION",
    "SignedPickle",
    "compact_encoder",
    "dumps",
    "from_typed_json",
    "is_model",
    "is_model_class",
    "json_equal",
    "loads",
    "to_json_value",
    "to_typed_json",
    "untag",
]

_MODEL_BASE: list[type] = []


def _model_base() -> type | None:
    """pydantic's ``BaseModel`` once pydantic is loaded, else None.

    No pydantic model can exist before pydantic is imported, so the codec tells models
    apart without importing pydantic itself: ``import stepstone`` and a program that never
    uses pydantic do not pay for loading it.
    """
    if not _MODEL_BASE:
        if "pydantic" not in sys.modules:
            return None
        from pydantic import BaseModel

        _MODEL_BASE.append(BaseModel)
    return _MODEL_BASE[0]


def is_model(value: Any) -> TypeGuard[BaseModel]:
    """Whether ``value`` is a pydantic model instance (pydantic is not imported to tell)."""
    base = _model_base()
    return base is not None and isinstance(value, base)


def is_model_class(cls: type) -> TypeGuard[type[BaseModel]]:
    """Whether the class ``cls`` is a pydantic model (pydantic is not imported to tell)."""
    base = _model_base()
    return base is not None and issubclass(cls, base)


#: The version of the tagged encoding :func:`to_typed_json` writes.
ENCODING_VERSION = 2

_TAG = "$stepstone"
_V1_MODEL_TAG = "$stepstone_model"


def compact_encoder(*, ensure_ascii: bool, allow_nan: bool) -> Callable[[Any], str]:
    """``json.JSONEncoder(ensure_ascii=..., separators=(",", ":"), allow_nan=...).encode``,
    the same text, at about half the cost: ``JSONEncoder.encode`` builds its C encoder
    anew on every call (for its table of containers being encoded, which finds a
    container that holds itself), where this one builds it once. A container that holds
    itself raises RecursionError instead of ValueError. Without the C encoder (another
    Python implementation), the plain ``encode``."""
    plain = json.JSONEncoder(
        ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=allow_nan
    ).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return plain
    strings = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    try:
        chunks = make(None, _no_default, strings, None, ":", ",", False, False, allow_nan)
    except TypeError:  # a C encoder of another signature
        return plain

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: One encoder for :func:`dumps` (``json.dumps`` with options builds a new one per call).
_ENCODE = compact_encoder(ensure_ascii=False, allow_nan=False)
_ESCAPED = compact_encoder(ensure_ascii=True, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON text of an already JSON-ready value: UTF-8 text every store can hold.

    A string holding a lone surrogate (``os.fsdecode`` of bytes that are not UTF-8, say)
    is written with JSON's escapes (``"\\udcff"``), which read back as the same string;
    the raw text is not UTF-8, so no database could store it."""
    text = _ENCODE(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return _ESCAPED(value)
    return text


def loads(text: str | bytes) -> Any:
    """Parse JSON text."""
    return json.loads(text)


def json_equal(a: Any, b: Any) -> bool:
    """Compare two values as JSON does (``1 == 1.0``, key order ignored)."""
    return bool(to_json_value(a, warn=False) == to_json_value(b, warn=False))


def to_json_value(
    value: Any, *, where: str = "value", strict: bool = False, warn: bool = True
) -> Any:
    """Convert ``value`` into plain JSON data, as any reader of the store expects it.

    Pydantic models and dataclasses become dicts, enums their value, sets and tuples lists,
    ``datetime``/``Decimal``/``UUID``/paths their text, bytes base64 text. Anything else is
    stored as ``str(value)`` with a warning (or an error with ``strict=True``).

    Args:
        value: Anything.
        where: How to name the value in a warning or error (``"step 'load' writes['raw']"``).
        strict: Raise :class:`SerializationError` instead of stringifying.
        warn: Emit :class:`UnserializableValueWarning` when a value is stringified.
    """
    return _convert(_Encoder(strict, warn, typed=False), value, where)


def to_typed_json(
    value: Any, *, where: str = "value", strict: bool = False, warn: bool = True
) -> Any:
    """Like :func:`to_json_value`, but every value JSON cannot hold keeps a type tag, so
    :func:`from_typed_json` gives back an equal value of the same type."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:  # as _Encoder.convert, at once
        return value
    return _convert(_Encoder(strict, warn, typed=True), value, where)


def _convert(encoder: _Encoder, value: Any, where: str) -> Any:
    try:
        return encoder.convert(value, where)
    except RecursionError:
        raise SerializationError(
            f"{where} cannot be stored: it contains itself (a list, dict or object that "
            "holds a reference to itself) or is nested deeper than Python's recursion limit; "
            "return a copy without the cycle"
        ) from None


def from_typed_json(value: Any, *, version: int = ENCODING_VERSION) -> Any:
    """Undo :func:`to_typed_json` (``version`` 2) or the untagged version 1 encoding."""
    if version < 2:
        return _from_v1(value)
    return _decode(value)


def untag(value: Any) -> Any:
    """Plain JSON from tagged data (either version): what :func:`to_json_value` would give."""
    if isinstance(value, dict):
        if _V1_MODEL_TAG in value and len(value) == 2 and "data" in value:
            return untag(value["data"])
        tag = value.get(_TAG)
        if isinstance(tag, str) and "v" in value:
            return _untag_tagged(tag, value["v"])
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


# -- encoding ------------------------------------------------------------------------------
def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


#: Where a value sits, built only when a warning or error needs the text: a string, or
#: ``(parent, "[" | "." | "key", key)``.
_Where = str | tuple[Any, str, Any]


def _where_text(where: _Where) -> str:
    if isinstance(where, str):
        return where
    parent, kind, key = where
    base = _where_text(parent)
    if kind == ".":
        return f"{base}.{key}"
    if kind == "key":
        return f"{base} key {key!r}"
    return f"{base}[{key!r}]"


#: Values stored as one tagged string, in the order they are tried (a datetime is a date).
_AS_TEXT: tuple[tuple[type, str, Callable[[Any], str]], ...] = (
    (datetime.datetime, "datetime", datetime.datetime.isoformat),
    (datetime.date, "date", datetime.date.isoformat),
    (datetime.time, "time", datetime.time.isoformat),
    (decimal.Decimal, "decimal", str),
    (uuid.UUID, "uuid", str),
    (pathlib.PurePath, "path", str),
)


#: What :meth:`_Encoder.leaf` returns for a value it has no JSON form for.
_NO_JSON = object()


class _Encoder:
    __slots__ = ("strict", "typed", "warn")

    def __init__(self, strict: bool, warn: bool, *, typed: bool) -> None:
        self.strict, self.warn, self.typed = strict, warn, typed

    def tag(self, kind: str, v: Any, cls: type | None = None) -> Any:
        if not self.typed:
            return v
        out: dict[str, Any] = {_TAG: kind}
        if cls is not None:
            out["cls"] = _class_path(cls)
        out["v"] = v
        return out

    def convert(self, value: Any, where: _Where) -> Any:
        t = type(value)
        if t is str or t is int or t is bool or value is None:
            return value
        if t is dict:
            return self.mapping(value, where)
        if t is list:
            return [self.convert(v, (where, "[", i)) for i, v in enumerate(value)]
        if t is float:
            if math.isfinite(value):
                return value
            if self.typed:
                return self.tag("float", "nan" if math.isnan(value) else str(value))
            return self.stringify(value, where)
        return self.other(value, where)

    def other(self, value: Any, where: _Where) -> Any:
        if isinstance(value, enum.Enum):  # before str/int: StrEnum and IntEnum keep their type
            return self.tag("enum", self.convert(value.value, where), type(value))
        if isinstance(value, (bool, str)):
            return str(value) if isinstance(value, str) else bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return self.convert(float(value), where)
        if isinstance(value, dict):
            return self.mapping(value, where)
        if isinstance(value, list):
            return [self.convert(v, (where, "[", i)) for i, v in enumerate(value)]
        out = self.model_or_collection(value, where)
        # stringified here, so that its warning names the same caller's frame as ever
        return self.stringify(value, where) if out is _NO_JSON else out

    def model_or_collection(self, value: Any, where: _Where) -> Any:
        """A pydantic model, a tuple or a set (tagged when typed), else :meth:`leaf`."""
        if is_model(value):
            data = value.model_dump(mode="json")
            return self.tag("model", data, type(value))
        if isinstance(value, tuple):
            items = [self.convert(v, (where, "[", i)) for i, v in enumerate(value)]
            return self.tag("tuple", items)
        if isinstance(value, (set, frozenset)):
            ordered = sorted(value, key=repr)
            items = [self.convert(v, (where, "[", i)) for i, v in enumerate(ordered)]
            return self.tag("frozenset" if isinstance(value, frozenset) else "set", items)
        return self.leaf(value, where)

    def leaf(self, value: Any, where: _Where) -> Any:
        """A value held as text (dates, decimals, ids, paths), a timedelta, bytes or a
        dataclass; ``_NO_JSON`` for anything else."""
        for cls, name, to_json in _AS_TEXT:
            if isinstance(value, cls):
                return self.tag(name, to_json(value))
        if isinstance(value, datetime.timedelta):
            if self.typed:
                return self.tag("timedelta", [value.days, value.seconds, value.microseconds])
            return value.total_seconds()
        if isinstance(value, (bytes, bytearray)):
            text = base64.b64encode(bytes(value)).decode("ascii")
            return self.tag("bytearray" if isinstance(value, bytearray) else "bytes", text)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {
                f.name: self.convert(getattr(value, f.name), (where, ".", f.name))
                for f in dataclasses.fields(value)
            }
            return self.tag("dataclass", fields, type(value))
        return _NO_JSON

    def mapping(self, value: dict[Any, Any], where: _Where) -> Any:
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str:
                return self.odd_mapping(value, where)
            out[k] = self.convert(v, (where, "[", k))
        if self.typed and _TAG in out:
            return self.odd_mapping(value, where)  # user data that would read as a tag
        return out

    def odd_mapping(self, value: dict[Any, Any], where: _Where) -> Any:
        """A dict with keys that are not plain ``str`` (or a ``$stepstone`` key)."""
        if self.typed:
            pairs = [
                [self.convert(k, (where, "key", k)), self.convert(v, (where, "[", k))]
                for k, v in value.items()
            ]
            return self.tag("dict", pairs)
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(k, str):
                name = str(k)
            elif isinstance(k, (int, float, bool)) or k is None:
                name = json.dumps(k)
            else:
                plain = self.convert(k, (where, "key", k))
                name = plain if isinstance(plain, str) else json.dumps(plain)
            out[name] = self.convert(v, (where, "[", k))
        return out

    def stringify(self, value: Any, where: _Where) -> str:
        place = _where_text(where)
        if self.strict:
            raise SerializationError(
                f"{place} is a {type(value).__name__}, which JSON cannot hold ({value!r}); "
                "store primitives, dicts, pydantic models, dataclasses or the standard types "
                "stepstone tags (datetime, Decimal, UUID, bytes, paths, enums, sets, tuples), "
                "or pass strict=False to store str(value)"
            )
        text = str(value)
        if self.warn:
            warnings.warn(
                f"{place} is a {type(value).__name__}, which JSON cannot hold; stored as its "
                f"str() {text[:80]!r}. Store primitives, dicts, pydantic models, dataclasses "
                "or the standard types stepstone tags instead (strict=True makes this an error)",
                UnserializableValueWarning,
                stacklevel=5,
            )
        return text


# -- decoding ------------------------------------------------------------------------------
def _import_class(path: Any) -> type | None:
    if not isinstance(path, str) or ":" not in path:
        return None
    if "<locals>" in path:
        return None
    try:
        obj: Any = pkgutil.resolve_name(path)  # "module:Qual.Name"
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) else None


def _decode(value: Any) -> Any:
    t = type(value)
    if t is dict:
        if _TAG in value:
            tag = value[_TAG]
            if isinstance(tag, str) and "v" in value:
                return _decode_tagged(tag, value.get("cls"), value["v"])
        return {k: _decode(v) for k, v in value.items()}
    if t is list:
        return [_decode(v) for v in value]
    return value


def _timedelta(v: Any) -> datetime.timedelta:
    days, seconds, micro = v
    return datetime.timedelta(days=days, seconds=seconds, microseconds=micro)


#: How each tag's value is read back (classes: ``_decode_class``).
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "timedelta": _timedelta,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": base64.b64decode,
    "bytearray": lambda v: bytearray(base64.b64decode(v)),
    "path": pathlib.Path,
    "float": float,
    "tuple": lambda v: tuple(_decode(x) for x in v),
    "set": lambda v: {_decode(x) for x in v},
    "frozenset": lambda v: frozenset(_decode(x) for x in v),
    "dict": lambda v: {_decode(k): _decode(x) for k, x in v},
}


def _decode_tagged(tag: str, cls_path: Any, v: Any) -> Any:
    try:
        decoder = _DECODERS.get(tag)
        if decoder is not None:
            return decoder(v)
        if tag in ("model", "enum", "dataclass"):
            return _decode_class(tag, cls_path, v)
    except (TypeError, ValueError, decimal.InvalidOperation, AttributeError):
        return untag({_TAG: tag, "v": v})  # unhashable set item, a malformed value...
    return _decode(v)  # a tag from a newer stepstone: its data


def _decode_class(tag: str, cls_path: Any, v: Any) -> Any:
    cls = _import_class(cls_path)
    data = _decode(v)
    if cls is None:
        return data
    try:
        if tag == "model" and is_model_class(cls):
            return cls.model_validate(v)
        if tag == "enum" and issubclass(cls, enum.Enum):
            return cls(data)
        if tag == "dataclass" and dataclasses.is_dataclass(cls):
            fields = dataclasses.fields(cls)
            obj = cls(**{f.name: data[f.name] for f in fields if f.init and f.name in data})
            for f in fields:
                if not f.init and f.name in data:
                    object.__setattr__(obj, f.name, data[f.name])
            return obj
    except Exception:  # noqa: BLE001 - the class changed shape since: keep the data
        return data
    return data


def _untag_tagged(tag: str, v: Any) -> Any:
    if tag == "timedelta":
        try:
            days, seconds, micro = v
            delta = datetime.timedelta(days=days, seconds=seconds, microseconds=micro)
            return delta.total_seconds()
        except (TypeError, ValueError):
            return v
    if tag == "float":
        return str(v)
    if tag == "dict":
        out: dict[str, Any] = {}
        for k, x in v:
            plain = untag(k)
            out[plain if isinstance(plain, str) else json.dumps(plain)] = untag(x)
        return out
    return untag(v)


def _from_v1(value: Any) -> Any:
    if isinstance(value, dict):
        if _V1_MODEL_TAG in value and len(value) == 2 and "data" in value:
            cls = _import_class(value[_V1_MODEL_TAG])
            data = _from_v1(value["data"])
            if cls is None or not is_model_class(cls):
                return data
            try:
                return cls.model_validate(data)
            except Exception:  # noqa: BLE001 - the class changed shape: keep the data
                return data
        return {k: _from_v1(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_v1(v) for v in value]
    return value


class SignedPickle:
    """Pickle with an HMAC-SHA256 signature: unsigned or tampered data is refused.

    Unpickling runs code, so stepstone never loads a pickle it cannot authenticate. The key
    is yours (at least 16 bytes); keep it out of the database.

    Example::

        codec = SignedPickle(key=os.environ["STEPSTONE_PICKLE_KEY"])
        blob = codec.dumps(state)
        state = codec.loads(blob)       # SerializationError if blob was altered
    """

    _MAGIC = b"stepstone-signed-pickle-v1\n"

    def __init__(self, key: bytes | str) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        if len(raw) < 16:
            raise ValueError(
                f"SignedPickle key must be at least 16 bytes, got {len(raw)}; "
                "generate one with `python -c 'import secrets; print(secrets.token_hex(32))'`"
            )
        self._key = raw

    def _sign(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def dumps(self, obj: Any) -> bytes:
        """Pickle ``obj`` and prepend its signature."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return self._MAGIC + base64.b64encode(self._sign(data)) + b"\n" + data

    def loads(self, blob: bytes) -> Any:
        """Verify the signature, then unpickle. Raises SerializationError when it fails."""
        if not blob.startswith(self._MAGIC):
            raise SerializationError(
                "refusing to unpickle data without a stepstone signature (unsigned pickle)"
            )
        rest = blob[len(self._MAGIC) :]
        sig_b64, sep, data = rest.partition(b"\n")
        try:
            sig = base64.b64decode(sig_b64, validate=True)
        except ValueError:
            sig = b""
        if not sep or not hmac.compare_digest(sig, self._sign(data)):
            raise SerializationError(
                "refusing to unpickle data whose signature does not match "
                "(tampered, or signed with another key)"
            )
        return pickle.loads(data)
