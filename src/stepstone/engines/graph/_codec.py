"""The serialized body of graph journal rows: inline JSON, or a signed pickle."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from stepstone.core._serialization import SignedPickle, dumps
from stepstone.engines.graph._records import Serialization
from stepstone.exceptions import CheckpointRecordInvalid, SerializationError, UserError

__all__ = ["Codec", "check_metadata"]


def check_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as the dict a graph record stores, or :class:`SerializationError` naming
    the key (and the place inside it) that JSON cannot hold, before anything runs."""
    data = dict(metadata)
    try:
        dumps(data)
    except (TypeError, ValueError) as exc:
        place, what = _not_json(data, "metadata", set()) or ("metadata", f"refused ({exc})")
        raise SerializationError(
            f"{place} is {what}, which JSON cannot hold; graph run metadata is stored as "
            "JSON: pass str, int, float, bool, None, lists and dicts with str keys (convert "
            "the value, e.g. str(value) or value.isoformat()); nothing was run or saved"
        ) from None
    return data


def _not_json(value: Any, place: str, seen: set[int]) -> tuple[str, str] | None:
    """Where ``value`` first fails to encode as JSON, and what is there; None if nowhere.
    Each part is tried with the same encoder the store uses, so this agrees with it."""
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return place, f"the {type(value).__name__} it sits in (a cycle)"
        seen.add(id(value))
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in pairs:
            if isinstance(value, dict) and not _encodes({k: None}):
                return f"{place} key {k!r}", f"a key of type {type(k).__name__}"
            if not _encodes(v):
                return _not_json(v, f"{place}[{k!r}]", seen) or (f"{place}[{k!r}]", repr(v))
        return None
    return place, f"{_short(value)} (type {type(value).__name__})"


def _encodes(value: Any) -> bool:
    try:
        dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


class Codec:
    """Encodes the serialized body of journal rows: inline JSON, or a signed pickle."""

    def __init__(self, serialization: str, pickle_key: bytes | str | SignedPickle | None) -> None:
        if serialization not in ("json", "pickle"):
            raise UserError(
                f"serialization must be 'json' (the default; migrations need it) or 'pickle', "
                f"got {serialization!r}"
            )
        self.serialization: Serialization = "json" if serialization == "json" else "pickle"
        if isinstance(pickle_key, SignedPickle):
            self.signer: SignedPickle | None = pickle_key
        elif pickle_key is not None:
            self.signer = SignedPickle(pickle_key)
        else:
            self.signer = None
        if self.serialization == "pickle" and self.signer is None:
            raise UserError(
                "serialization='pickle' needs a signing key: pass pickle_key=<at least 16 "
                "bytes kept out of the database> (stepstone never loads an unsigned pickle), "
                "or use serialization='json'"
            )

    def encode(self, plain: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """A row's data: ``plain`` fields plus the body (inline JSON or signed pickle)."""
        if self.serialization == "pickle":
            assert self.signer is not None
            blob = self.signer.dumps(body)
            return {**plain, "body_pickle": base64.b64encode(blob).decode("ascii")}
        return {**plain, "body": body}

    def decode(self, data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """The body of a row, verifying a pickle's signature."""
        if "body_pickle" in data:
            if self.signer is None:
                raise CheckpointRecordInvalid(
                    f"{where} was saved with serialization='pickle'; open it with a "
                    "checkpointer created with serialization='pickle', pickle_key=<the key "
                    "it was signed with>"
                )
            try:
                blob = base64.b64decode(str(data["body_pickle"]), validate=True)
            except ValueError as exc:
                raise CheckpointRecordInvalid(
                    f"{where} holds a pickle that is not valid base64: refused ({exc})"
                ) from exc
            try:
                body = self.signer.loads(blob)
            except SerializationError as exc:
                raise CheckpointRecordInvalid(f"{where}: {exc}; it was not loaded") from exc
            if not isinstance(body, dict):
                raise CheckpointRecordInvalid(f"{where} holds a pickle of the wrong shape")
            return body
        body = data.get("body")
        if not isinstance(body, dict):
            raise CheckpointRecordInvalid(f"{where} has no body")
        return body
