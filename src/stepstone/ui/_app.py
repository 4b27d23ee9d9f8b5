"""The web inspector's WSGI application: static files and a small JSON API over a Store.

Routes (all JSON unless noted):

* ``GET /`` and ``GET /static/<file>``: the page (HTML, JS, CSS shipped in the package).
* ``GET /api/runs?status=&kind=&prefix=&older_than=&newer_than=&limit=&offset=``: runs,
  most recently updated first, with the same fields as ``stepstone runs --json``; ages in
  seconds or as the CLI takes them (``12h``), ``limit`` >= 1 and ``offset`` >= 0 whole
  numbers. A value it cannot use is a 400 naming it.
* ``GET /api/run?key=K[&full=1]``: one run with its timeline (404 when absent); a payload
  longer than 4096 characters of JSON is cut to them (``payload_chars``: its length)
  unless ``full=1``.
* ``POST /api/cancel?key=K&reason=R``, ``POST /api/retry?key=K&step=S`` (rewind a
  stopped run to step S) and ``POST /api/approve?key=K&call_id=C[&deny=REASON][&replace=1]``
  (record a decision for a tool call a paused run waits on; one already recorded is only
  changed with ``replace=1``): only with ``allow_actions``; the
  request must carry the ``X-Stepstone-Action: 1`` header, which a page of another
  origin cannot send without a CORS preflight this server never grants.
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from stepstone.durable._approvals import approve_call, decision_text
from stepstone.durable._inspect import missing_run, named_run, query_runs, run_detail
from stepstone.durable._operate import cancel_run, retry_run
from stepstone.durable._retention import parse_age
from stepstone.exceptions import StepstoneError
from stepstone.store._base import RUN_STATUSES
from stepstone.store._store import Store

__all__ = ["InspectorApp"]

log = logging.getLogger("stepstone")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
Environ = dict[str, Any]

_STATIC = ("index.html", "app.js", "style.css")
_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
]


class _HttpError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _one(params: dict[str, list[str]], name: str) -> str:
    """The first value of ``name`` in the query, or "" when absent."""
    return (params.get(name) or [""])[0]


def _whole(params: dict[str, list[str]], name: str, least: int) -> int | None:
    """The whole number ``name`` (at least ``least``), or None when absent; anything else
    (``inf``, ``nan``, ``2.5``, ``-1``) is a 400 naming it."""
    raw = _one(params, name).strip()
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise _HttpError(
            "400 Bad Request",
            f"{name}={raw!r} is not a whole number >= {least}; pass e.g. {name}=100",
        )
    return value


def _age(params: dict[str, list[str]], name: str) -> float | None:
    """The age ``name`` in seconds: a number of seconds or a number and a unit (``90s``,
    ``15m``, ``12h``, ``30d``, ``2w``, as the CLI takes), or None when absent."""
    raw = _one(params, name).strip()
    if raw == "":
        return None
    try:
        seconds = float(raw) if raw[-1].isdigit() else parse_age(raw).total_seconds()
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 1e12:  # NaN, infinite or negative: no age
        raise _HttpError(
            "400 Bad Request",
            f"{name}={raw!r} is not an age; pass seconds (3600) or a number and a unit "
            "(90s, 15m, 12h, 30d, 2w)",
        )
    return seconds


def _many(params: dict[str, list[str]], name: str) -> list[str]:
    return [v for raw in params.get(name, []) for v in raw.split(",") if v]


#: Characters of a payload's JSON the run page gets; the page shows far fewer.
PAYLOAD_CHARS = 4096


def _cut_payloads(timeline: list[dict[str, Any]]) -> None:
    """Cut each payload whose JSON text is longer than :data:`PAYLOAD_CHARS` to that many
    characters of it (a string), noting the full length as ``payload_chars``: a page that
    polls every second must not fetch a run's megabytes each time (``full=1`` gets them)."""
    for entry in timeline:
        payload = entry.get("payload")
        if payload is None:
            continue
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        if len(text) > PAYLOAD_CHARS:
            entry["payload"] = text[:PAYLOAD_CHARS]
            entry["payload_chars"] = len(text)


class InspectorApp:
    """A WSGI callable serving the inspector for ``store``.

    Args:
        store: The store to show.
        allow_actions: Accept ``POST`` actions (cancel, retry, approve). Read-only when False.
        poll_seconds: How often the page refreshes what it shows.
        page_size: Runs per page of the run list.
    """

    def __init__(
        self,
        store: Store,
        *,
        allow_actions: bool = False,
        poll_seconds: float = 1.0,
        page_size: int = 100,
    ) -> None:
        self.page_size = page_size
        self.loopback_only = True
        self.store = store
        self.allow_actions = allow_actions
        self.poll_seconds = poll_seconds

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        params = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        try:
            self._check_host(environ)
            if method == "GET" and path in ("/", "/index.html"):
                return self._static("index.html", start_response)
            if method == "GET" and path.startswith("/static/"):
                return self._static(path[len("/static/") :], start_response)
            if method == "GET" and path == "/api/runs":
                return self._json(start_response, self._runs(params))
            if method == "GET" and path == "/api/run":
                return self._json(start_response, self._run(params))
            actions = {"/api/cancel": self._cancel, "/api/retry": self._retry}
            actions["/api/approve"] = self._approve
            if path in actions:
                if method != "POST":
                    raise _HttpError("405 Method Not Allowed", "use POST")
                self._check_action(environ)
                return self._json(start_response, actions[path](params))
            raise _HttpError("404 Not Found", f"no route {method} {path}")
        except _HttpError as exc:
            return self._json(start_response, {"error": exc.message}, status=exc.status)
        except (StepstoneError, KeyError, ValueError, RuntimeError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return self._json(start_response, {"error": str(msg)}, status="409 Conflict")
        except Exception as exc:  # a bug: answer in JSON, as every route does; log it
            log.exception("stepstone inspector: %s %s failed", method, path)
            error = f"internal error: {type(exc).__name__}: {exc}"
            return self._json(start_response, {"error": error}, status="500 Internal Server Error")

    def _check_host(self, environ: Environ) -> None:
        """On a loopback server, refuse requests whose ``Host`` names another machine: a
        web page that rebinds its own name to 127.0.0.1 must not read runs (DNS
        rebinding)."""
        if not self.loopback_only:
            return
        host = str(environ.get("HTTP_HOST", ""))
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.strip("[]") not in ("127.0.0.1", "localhost", "::1"):
            raise _HttpError(
                "403 Forbidden",
                f"Host {host!r} is not this machine; open the inspector as http://127.0.0.1",
            )

    # -- routes ------------------------------------------------------------------------
    def _runs(self, params: dict[str, list[str]]) -> dict[str, Any]:
        limit = _whole(params, "limit", 1)
        statuses = _many(params, "status")
        bad = sorted(set(statuses) - set(RUN_STATUSES))
        if bad:
            raise _HttpError(
                "400 Bad Request",
                f"unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}",
            )
        total, runs = query_runs(
            self.store,
            statuses=statuses,
            kinds=_many(params, "kind"),
            prefix=_one(params, "prefix") or None,
            older_than=_age(params, "older_than"),
            newer_than=_age(params, "newer_than"),
            limit=limit if limit is not None else self.page_size,
            offset=_whole(params, "offset", 0) or 0,
        )
        return {
            "total": total,
            "runs": runs,
            "store": self.store.describe(),
            "allow_actions": self.allow_actions,
            "poll_seconds": self.poll_seconds,
            "page_size": self.page_size,
        }

    def _run(self, params: dict[str, list[str]]) -> dict[str, Any]:
        key = _one(params, "key")
        if not key:
            raise _HttpError("400 Bad Request", "pass ?key=RUN_KEY")
        detail = run_detail(self.store, named_run(self.store, key))
        if detail is None:
            raise _HttpError("404 Not Found", missing_run(self.store, key))
        if _one(params, "full") != "1":
            _cut_payloads(detail["timeline"])
        return {**detail, "allow_actions": self.allow_actions}

    def _check_action(self, environ: Environ) -> None:
        if not self.allow_actions:
            raise _HttpError(
                "403 Forbidden",
                "the inspector is read-only; restart it with `stepstone ui --allow-actions`",
            )
        if environ.get("HTTP_X_STEPSTONE_ACTION") != "1":
            raise _HttpError("403 Forbidden", "actions need the X-Stepstone-Action: 1 header")

    def _cancel(self, params: dict[str, list[str]]) -> dict[str, Any]:
        key = _one(params, "key")
        reason = (params.get("reason") or ["cancelled from the web inspector"])[0]
        return {"key": key, "outcome": cancel_run(self.store, key, reason=reason)}

    def _retry(self, params: dict[str, list[str]]) -> dict[str, Any]:
        key = _one(params, "key")
        step = _one(params, "step")
        head = retry_run(self.store, key, from_step=step)
        return {
            "key": key,
            "outcome": f"rewound: resume=True runs {step!r} again",
            "next_step": head.next_step,
        }

    def _approve(self, params: dict[str, list[str]]) -> dict[str, Any]:
        key = _one(params, "key")
        call_id = _one(params, "call_id")
        deny = params.get("deny")
        # replace=1: the page showed a decision and the person chose another one; without
        # it, a decision recorded since the page was drawn is never replaced.
        replace = _one(params, "replace") == "1"
        decision: bool | str = True if deny is None else deny[0]
        done = approve_call(self.store, key, call_id, decision=decision, replace=replace)
        verb = "approved" if deny is None else "denied"
        if not done["changed"]:
            outcome = f"{done['tool']} call {call_id} is already {decision_text(decision)}"
        else:
            outcome = f"{verb} {done['tool']} call {call_id}; the run's next resume applies it"
        return {**done, "outcome": outcome}

    # -- responses ---------------------------------------------------------------------
    def _json(
        self, start_response: StartResponse, data: Any, *, status: str = "200 OK"
    ) -> list[bytes]:
        body = json.dumps(data, default=str, ensure_ascii=False).encode()
        start_response(
            status,
            [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *_HEADERS],
        )
        return [body]

    def _static(self, name: str, start_response: StartResponse) -> list[bytes]:
        if name not in _STATIC:
            raise _HttpError("404 Not Found", f"no static file {name!r}")
        body = resources.files("stepstone.ui").joinpath("static", name).read_bytes()
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        start_response(
            "200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body))), *_HEADERS]
        )
        return [body]
