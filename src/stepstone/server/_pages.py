"""The inspector's pages: static files shipped in this package."""

from __future__ import annotations

import json
import mimetypes
from importlib import resources
from typing import Any

from starlette.responses import Response

from stepstone.server._http import HttpError

__all__ = ["PAYLOAD_CHARS", "STATIC", "cut_payloads", "static_file"]

#: Files the pages are made of.
STATIC = ("index.html", "app.js", "style.css")

#: Characters of a payload's JSON a run's page gets; the page shows far fewer.
PAYLOAD_CHARS = 4096

HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
}


def cut_payloads(timeline: list[dict[str, Any]]) -> None:
    """Cut each payload whose JSON text is longer than :data:`PAYLOAD_CHARS` to that many
    characters of it (a string), noting the full length as ``payload_chars``: a page that
    refreshes every second must not fetch a run's megabytes each time (``full=1`` gets
    them)."""
    for entry in timeline:
        payload = entry.get("payload")
        if payload is None:
            continue
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        if len(text) > PAYLOAD_CHARS:
            entry["payload"] = text[:PAYLOAD_CHARS]
            entry["payload_chars"] = len(text)


def static_file(name: str) -> Response:
    """The page file ``name`` (404 for any other name)."""
    if name not in STATIC:
        raise HttpError(404, f"no static file {name!r}")
    body = resources.files("stepstone.server").joinpath("static", name).read_bytes()
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype.endswith("javascript"):
        ctype += "; charset=utf-8"
    return Response(body, media_type=ctype, headers=HEADERS)
