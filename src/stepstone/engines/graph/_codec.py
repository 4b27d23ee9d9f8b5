"""The serialized body of graph journal rows: inline JSON, or a signed pickle."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from stepstone.core._serialization import SignedPickle
from stepstone.engines.graph._records import Serialization
from stepstone.exceptions import CheckpointRecordInvalid, SerializationError, UserError

__all__ = ["Codec"]


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
