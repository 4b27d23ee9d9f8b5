"""JSON codec with typed pydantic round-trips, and a signed pickle codec.

JSON is the default everywhere. Values JSON cannot hold are stored as ``str(value)`` with an
:class:`~stepstone.exceptions.UnserializableValueWarning` naming where they were found
(``strict=True`` raises :class:`~stepstone.exceptions.SerializationError` instead). Pickle is
only available signed: :class:`SignedPickle` refuses data without a valid HMAC.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import hashlib
import hmac
import json
import math
import pickle
import pkgutil
import uuid
import warnings
from typing import Any

from pydantic import BaseModel

from stepstone.exceptions import SerializationError, UnserializableValueWarning

__all__ = [
    "SignedPickle",
    "dumps",
    "from_typed_json",
    "json_equal",
    "loads",
    "to_json_value",
    "to_typed_json",
    "untag",
]

_MODEL_TAG = "$stepstone_model"


def dumps(value: Any) -> str:
    """Compact JSON text of an already JSON-ready value."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse JSON text."""
    return json.loads(text)


def json_equal(a: Any, b: Any) -> bool:
    """Compare two values as JSON does (``1 == 1.0``, key order ignored)."""
    return bool(to_json_value(a, warn=False) == to_json_value(b, warn=False))


def to_json_value(
    value: Any, *, where: str = "value", strict: bool = False, warn: bool = True
) -> Any:
    """Convert ``value`` into plain JSON data (pydantic models become ``model_dump`` dicts).

    Args:
        value: Anything.
        where: How to name the value in a warning or error (``"step 'load' writes['raw']"``).
        strict: Raise :class:`SerializationError` instead of stringifying.
        warn: Emit :class:`UnserializableValueWarning` when a value is stringified.
    """
    return _convert(value, where, strict, warn, typed=False)


def to_typed_json(
    value: Any, *, where: str = "value", strict: bool = False, warn: bool = True
) -> Any:
    """Like :func:`to_json_value`, but pydantic models keep their class name.

    :func:`from_typed_json` turns them back into instances of the same class.
    """
    return _convert(value, where, strict, warn, typed=True)


def from_typed_json(value: Any) -> Any:
    """Undo :func:`to_typed_json`; a model whose class cannot be imported stays a dict."""
    if isinstance(value, dict):
        if _MODEL_TAG in value and len(value) == 2 and "data" in value:
            cls = _import_model(value[_MODEL_TAG])
            data = from_typed_json(value["data"])
            if cls is None:
                return data
            try:
                return cls.model_validate(data)
            except Exception:  # noqa: BLE001 - the class changed shape: keep the data
                return data
        return {k: from_typed_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_typed_json(v) for v in value]
    return value


def untag(value: Any) -> Any:
    """Plain JSON from :func:`to_typed_json` output (model tags dropped, data kept)."""
    if isinstance(value, dict):
        if _MODEL_TAG in value and len(value) == 2 and "data" in value:
            return untag(value["data"])
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


def _import_model(path: Any) -> type[BaseModel] | None:
    if not isinstance(path, str) or ":" not in path:
        return None
    try:
        obj: Any = pkgutil.resolve_name(path)  # "module:Qual.Name"
    except (ImportError, AttributeError, ValueError):
        return None
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        return obj
    return None


def _convert(value: Any, where: str, strict: bool, warn: bool, *, typed: bool) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return _stringify(value, where, strict, warn)
    if isinstance(value, BaseModel):
        data = value.model_dump(mode="json")
        if typed and "<locals>" not in type(value).__qualname__:
            cls = type(value)
            return {_MODEL_TAG: f"{cls.__module__}:{cls.__qualname__}", "data": data}
        return data
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                if isinstance(k, (int, float, bool)) or k is None:
                    k = json.dumps(k)
                else:
                    k = _stringify(k, f"{where} key {k!r}", strict, warn)
            out[k] = _convert(v, f"{where}[{k!r}]", strict, warn, typed=typed)
        return out
    if isinstance(value, (list, tuple)):
        return [
            _convert(v, f"{where}[{i}]", strict, warn, typed=typed) for i, v in enumerate(value)
        ]
    if isinstance(value, (set, frozenset)):
        return [
            _convert(v, f"{where}[{i}]", strict, warn, typed=typed)
            for i, v in enumerate(sorted(value, key=repr))
        ]
    if isinstance(value, enum.Enum):
        return _convert(value.value, where, strict, warn, typed=typed)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _convert(
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)},
            where,
            strict,
            warn,
            typed=typed,
        )
    return _stringify(value, where, strict, warn)


def _stringify(value: Any, where: str, strict: bool, warn: bool) -> str:
    if strict:
        raise SerializationError(
            f"{where} is a {type(value).__name__}, which JSON cannot hold ({value!r}); "
            "store primitives, dicts or pydantic models, or pass strict=False to store str(value)"
        )
    text = str(value)
    if warn:
        warnings.warn(
            f"{where} is a {type(value).__name__}, which JSON cannot hold; stored as its "
            f"str() {text[:80]!r}. Store primitives, dicts or pydantic models instead "
            "(strict=True makes this an error)",
            UnserializableValueWarning,
            stacklevel=4,
        )
    return text


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
