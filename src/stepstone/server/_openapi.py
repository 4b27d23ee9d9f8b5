"""The API's OpenAPI document (``GET /openapi.json``), written out: each route, its
parameters, its body and its answers."""

from __future__ import annotations

from typing import Any

__all__ = ["openapi"]

_ERROR = {
    "description": "The request was refused; `error` says why and what to change.",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}
_OK = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
_KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}}
_QUEUE = {"name": "queue", "in": "path", "required": True, "schema": {"type": "string"}}


def _op(
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: Any = None,
    ok: str = "200",
    write: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": params or [],
        "responses": {
            ok: _OK,
            "400": _ERROR,
            "401": _ERROR,
            "403": _ERROR,
            "404": _ERROR,
            "409": _ERROR,
        },
    }
    if write:
        op["responses"]["413"] = _ERROR
    if body is not None:
        op["requestBody"] = {"content": {"application/json": {"schema": body}}}
    return op


def _query(name: str, kind: str = "string", text: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": kind}, "description": text}


_START = {
    "type": "object",
    "required": ["target"],
    "properties": {
        "target": {"type": "string", "description": "registered name or 'package.module:name'"},
        "args": {"type": "array", "description": "a workflow's positional arguments"},
        "kwargs": {"type": "object", "description": "a workflow's keyword arguments"},
        "task": {"description": "a Plan's, agent's or graph's task: a string or {task, payload}"},
        "key": {"type": "string"},
        "queue": {"type": "string", "default": "default"},
        "priority": {"type": "integer", "default": 0},
        "dedupe_key": {"type": "string"},
        "delay": {"type": "number", "default": 0},
        "max_attempts": {"type": "integer", "default": 3},
        "webhook": {"type": "string", "format": "uri"},
    },
    "additionalProperties": False,
}


def openapi() -> dict[str, Any]:
    """The document."""
    paths: dict[str, Any] = {
        "/runs": {
            "post": _op("Start a run (queued for a worker)", body=_START, ok="202", write=True),
            "get": _op(
                "List runs",
                params=[
                    _query("status", text="comma-separated statuses"),
                    _query("kind"),
                    _query("prefix", text="key prefix"),
                    _query("error", text="text the error holds"),
                    _query("queue"),
                    _query("group", text="stranded, waiting or queued: only that group"),
                    _query("older_than"),
                    _query("newer_than"),
                    _query("limit", "integer"),
                    _query("offset", "integer"),
                ],
            ),
        },
        "/runs/{key}": {"get": _op("One run", params=[_KEY, _query("full")])},
        "/runs/{key}/cancel": {"post": _op("Cancel a run", params=[_KEY], write=True)},
        "/runs/{key}/resume": {
            "post": _op("Queue a stopped run again for a worker", params=[_KEY], write=True)
        },
        "/runs/{key}/retry": {
            "post": _op(
                "Rewind a run to a step (and queue it again)",
                params=[_KEY, _query("from", text="the step to run again")],
                write=True,
            )
        },
        "/runs/{key}/fork": {
            "post": _op(
                "Copy a run up to a step under a new key",
                params=[_KEY, _query("at"), _query("to")],
                write=True,
            )
        },
        "/runs/{key}/messages/{topic}": {
            "post": _op(
                "Send a message (the body is its JSON value)",
                params=[
                    _KEY,
                    {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                body={},
                ok="202",
                write=True,
            )
        },
        "/runs/{key}/approvals/{call_id}": {
            "post": _op(
                "Approve or deny a tool call the run waits on",
                params=[
                    _KEY,
                    {
                        "name": "call_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
                body={
                    "type": "object",
                    "properties": {
                        "approve": {"type": "boolean"},
                        "deny": {"type": "string"},
                        "replace": {"type": "boolean"},
                        "resume": {"type": "boolean", "default": True},
                    },
                },
                write=True,
            )
        },
        "/runs/{key}/streams/{name}": {
            "get": {
                "summary": "Follow a run's stream as Server-Sent Events (id = offset; "
                "Last-Event-ID resumes after it; an `end` event says how the run ended)",
                "parameters": [
                    _KEY,
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    _query("from", "integer", "the first offset (without Last-Event-ID)"),
                ],
                "responses": {
                    "200": {"description": "the stream", "content": {"text/event-stream": {}}},
                    "404": _ERROR,
                },
            }
        },
        "/runs/{key}/watch": {
            "get": {
                "summary": "Follow a run's state as Server-Sent Events: a `run` event now, "
                "then one each time it changes; `gone` when the key holds nothing",
                "parameters": [_KEY],
                "responses": {
                    "200": {"description": "its changes", "content": {"text/event-stream": {}}},
                    "404": _ERROR,
                },
            }
        },
        "/diff": {"get": _op("Two runs side by side", params=[_query("a"), _query("b")])},
        "/about": {"get": _op("The store, whether actions are on, the pages' settings")},
        "/queues/{queue}/webhook": {
            "get": _op("The URL told when each run of the queue ends", params=[_QUEUE]),
            "put": _op(
                "Tell a URL when each run of the queue submitted from now on ends",
                params=[_QUEUE],
                body={"type": "object", "properties": {"url": {"type": "string"}}},
                write=True,
            ),
            "delete": _op("Stop telling the queue's URL", params=[_QUEUE], write=True),
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "stepstone serve", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
