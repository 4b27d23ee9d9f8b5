"""What the API's run endpoints do, over the kernel's calls (blocking: the app runs them
in worker threads). Each returns a JSON-ready dict or raises ``HttpError``."""

from __future__ import annotations

import inspect
import json
import math
from typing import Any
from urllib.parse import urlsplit

from stepstone.core import Envelope
from stepstone.durable._approvals import approve_call, decision_text
from stepstone.durable._inspect import LIST_GROUPS, diff_runs, missing_run, run_detail, run_listing
from stepstone.durable._messages import send
from stepstone.durable._operate import cancel_run, fork_run, retry_run
from stepstone.durable._outbox import (
    drop_queue_webhook,
    queue_webhook,
    set_queue_webhook,
    subscribe_queued_run,
)
from stepstone.durable._queue import existing_queue, requeue_run, requeue_when_stopped, submit
from stepstone.durable._records import run_head
from stepstone.durable._watch import record_key
from stepstone.exceptions import UserError
from stepstone.server._config import ServerConfig
from stepstone.server._http import HttpError
from stepstone.server._targets import Targets
from stepstone.store._queue_base import FINAL_STATUSES, QueueEntry
from stepstone.store._webhooks import WebhookRecord

__all__ = [
    "approve",
    "cancel",
    "diff",
    "list_runs",
    "message",
    "resume",
    "retry",
    "run_view",
    "start_run",
]

_FIELDS = {
    "target",
    "args",
    "kwargs",
    "task",
    "key",
    "queue",
    "priority",
    "dedupe_key",
    "delay",
    "max_attempts",
    "webhook",
}


def _field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is default:
        return value
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        value = None  # true/false is not a number here
    if not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise HttpError(400, f"{name!r} must be {names}, got {json.dumps(body.get(name))[:80]}")
    return value


def check_webhook_url(url: Any) -> str:
    """``url`` if a webhook can be sent to it (an absolute http(s) URL), else a 400."""
    if not isinstance(url, str):
        raise HttpError(400, f"'webhook' must be a URL string, got {json.dumps(url)[:80]}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise HttpError(
            400, f"'webhook' must be an absolute http:// or https:// URL, got {url[:200]!r}"
        )
    return url


def _task_of(target: str, obj: Any, body: dict[str, Any]) -> tuple[Any, str | None]:
    """The start envelope for ``obj`` and the key its decorator gives (workflows)."""
    from stepstone.engines.workflow import Workflow  # loaded when a run starts, not by serve

    args = _field(body, "args", list, [])
    kwargs = _field(body, "kwargs", dict, {})
    if isinstance(obj, Workflow):
        if "task" in body:
            raise HttpError(
                400,
                f"target {target!r} is a workflow: pass its arguments as 'args' and "
                "'kwargs', not 'task'",
            )
        try:
            inspect.signature(obj.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise HttpError(400, f"workflow {obj.name!r}: {exc}") from None
        data = obj.encode(tuple(args), kwargs)
        env: Envelope[Any] = Envelope(task=obj.name, payload={"workflow_args": data})
        return env, obj.key_for(tuple(args), kwargs)
    if args or kwargs:
        raise HttpError(
            400,
            f"target {target!r} is not a workflow: it takes a 'task' (a string, or "
            '{"task": ..., "payload": ...}), not args or kwargs',
        )
    task = body.get("task")
    if isinstance(task, str):
        return Envelope.from_task(task), None
    if isinstance(task, dict) and set(task) <= {"task", "payload"}:
        text = task.get("task")
        if text is not None and not isinstance(text, str):
            raise HttpError(400, "'task.task' must be a string")
        return Envelope(task=text, payload=task.get("payload")), None
    raise HttpError(
        400,
        f"target {target!r} needs a 'task': a string, or "
        '{"task": "...", "payload": ...} (a graph\'s initial state as the payload)',
    )


def start_run(config: ServerConfig, targets: Targets, body: Any) -> dict[str, Any]:
    """``POST /runs``: queue a run of the body's target; its key, entry and status."""
    if not isinstance(body, dict):
        raise HttpError(400, 'the body must be a JSON object: {"target": "module:name", ...}')
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise HttpError(
            400, f"unknown field(s) {unknown}; the body takes {', '.join(sorted(_FIELDS))}"
        )
    target = body.get("target")
    if not isinstance(target, str) or not target:
        raise HttpError(400, "'target' is required: a registered name or 'package.module:name'")
    webhook = body.get("webhook")
    if webhook is not None:
        check_webhook_url(webhook)
        if config.webhook_secret is None:
            raise HttpError(
                400,
                "this server signs no webhooks: start it with --webhook-secret-file FILE "
                "(or STEPSTONE_WEBHOOK_SECRET) to accept 'webhook'",
            )
    obj = targets.resolve(target)
    env, wf_key = _task_of(target, obj, body)
    delay = _field(body, "delay", (int, float), 0)
    if not math.isfinite(delay) or delay < 0:
        raise HttpError(400, f"'delay' must be a number of seconds >= 0, got {delay!r}")
    handle = submit(
        config.store,
        target,
        env,
        key=_field(body, "key", str, None) or wf_key,
        queue=_field(body, "queue", str, "default"),
        priority=_field(body, "priority", int, 0),
        delay=delay,
        dedupe_key=_field(body, "dedupe_key", str, None),
        max_attempts=_field(body, "max_attempts", int, 3),
    )
    entry = handle.entry()
    out: dict[str, Any] = {
        "key": entry.run_key,
        "id": entry.id,
        "queue": entry.queue,
        "status": entry.status,
    }
    if webhook is not None:
        from stepstone.server._webhooks import subscribe

        out["webhook"] = subscribe(config.store, entry, webhook)
    subscribe_queued_run(config.store, entry.queue, entry.run_key, entry.id)
    return out


def queue_hook(config: ServerConfig, queue: str) -> dict[str, Any]:
    """``GET /queues/{queue}/webhook``."""
    order = queue_webhook(config.store, queue)
    if order is None:
        raise HttpError(404, f"queue {queue!r} has no webhook; set one with PUT and {{'url': ...}}")
    return _hook_view(order)


def set_queue_hook(config: ServerConfig, queue: str, body: Any) -> dict[str, Any]:
    """``PUT /queues/{queue}/webhook`` with ``{"url": ...}``."""
    if not isinstance(body, dict) or set(body) != {"url"}:
        raise HttpError(400, 'the body must be {"url": "https://..."}')
    url = check_webhook_url(body["url"])
    if config.webhook_secret is None:
        raise HttpError(
            400,
            "this server signs no webhooks: start it with --webhook-secret-file FILE "
            "(or STEPSTONE_WEBHOOK_SECRET) to set a queue's webhook",
        )
    if not queue:
        raise HttpError(400, "name the queue: PUT /queues/NAME/webhook")
    return _hook_view(set_queue_webhook(config.store, queue, url))


def drop_queue_hook(config: ServerConfig, queue: str) -> dict[str, Any]:
    """``DELETE /queues/{queue}/webhook``."""
    if not drop_queue_webhook(config.store, queue):
        raise HttpError(404, f"queue {queue!r} has no webhook")
    return {"queue": queue, "url": None}


def _hook_view(order: WebhookRecord) -> dict[str, Any]:
    data = json.loads(order.payload or "{}")
    return {"queue": data.get("queue"), "url": order.url, "since": data.get("since")}


def entry_view(entry: QueueEntry) -> dict[str, Any]:
    """A queue entry as the API shows it."""
    return {
        "id": entry.id,
        "queue": entry.queue,
        "target": entry.target,
        "status": entry.status,
        "attempts": entry.attempts,
        "max_attempts": entry.max_attempts,
        "priority": entry.priority,
        "error": entry.error,
        "created_at": entry.created_at,
        "started_at": entry.started_at,
        "updated_at": entry.updated_at,
    }


def _result(entry: QueueEntry | None) -> tuple[Any, Any]:
    """The result payload and error a finished entry recorded."""
    if entry is None or entry.result is None:
        return None, None
    try:
        env = Envelope.from_dict(json.loads(entry.result))
    except (ValueError, TypeError, UserError):
        return None, None
    error = None if env.error is None else env.error.to_dict()
    return env.to_dict(where="result").get("payload"), error


def run_view(config: ServerConfig, key: str, *, full: bool = False) -> dict[str, Any]:
    """``GET /runs/{key}``: the run's detail (status, current step, timeline, what it waits
    for, events, streams, approvals, its queue entry, result or error, webhooks)."""
    store = config.store
    queue = existing_queue(store)
    entry = queue.latest_entry(key) if queue is not None else None
    detail = run_detail(store, key, diagram=True)
    if detail is None and entry is not None:
        # a queued agent run records its checkpoint under its run id's own key; a queued
        # graph run, under its latest invocation's
        found = record_key(store, key)
        detail = None if found == key else run_detail(store, found, diagram=True)
        if detail is not None:
            detail["key"], detail["record_key"] = key, found
    if detail is None:
        if entry is None:
            raise HttpError(404, missing_run(store, key))
        detail = {
            "key": key,
            "kind": None,
            "status": "queued" if entry.status not in FINAL_STATUSES else entry.status,
            "next_step": None,
            "timeline": [],
            "pending_approvals": [],
            "waiting": [],
            "events": {},
            "streams": [],
            "error": None,
            "diagram": None,
        }
    if not full:
        from stepstone.server._pages import cut_payloads

        cut_payloads(detail["timeline"])
    detail["entry"] = None if entry is None else entry_view(entry)
    result, error = _result(entry)
    detail["result"] = result
    if detail.get("error") is None and error is not None:
        detail["error"] = error
    detail["allow_actions"] = config.actions
    from stepstone.server._webhooks import deliveries

    detail["webhooks"] = deliveries(store, key)
    if detail.get("agent"):
        price_turns(detail["agent"]["effects"])
    detail["actions"] = available_actions(detail, config)
    detail["retry_from"] = retry_steps(detail) if "retry" in detail["actions"] else []
    return detail


def price_turns(effects: list[dict[str, Any]]) -> None:
    """Give each model turn of an agent run its estimated cost (``cost_usd``, None when
    the model's price is not known) from its recorded model and token counts."""
    import dataclasses

    from stepstone.providers import Usage, estimate_cost

    fields = [f.name for f in dataclasses.fields(Usage)]

    for effect in effects:
        if effect.get("kind") != "model":
            continue
        usage, model = effect.get("usage"), effect.get("model")
        cost = None
        if isinstance(usage, dict) and isinstance(model, str) and model:
            known = {f: usage[f] for f in fields if isinstance(usage.get(f), int)}
            cost = estimate_cost(model, Usage(**known))
        effect["cost_usd"] = cost


#: The kinds of run ``retry`` can rewind (``retry_run``).
RETRY_KINDS = ("plan", "workflow")


def retry_steps(detail: dict[str, Any]) -> list[str]:
    """The steps ``/retry?from=STEP`` takes for this run, in order: a Plan's step names
    (each once, and the step it stopped at), a workflow's step positions."""
    if detail.get("kind") == "workflow":
        return [op["position"] for op in detail.get("operations") or () if op["op"] == "step"]
    names: dict[str, None] = {}
    for entry in detail.get("timeline") or ():
        if entry.get("kind") == "step" and entry.get("name"):
            names.setdefault(str(entry["name"]), None)
    if detail.get("next_step"):
        names.setdefault(str(detail["next_step"]), None)
    return list(names)


def available_actions(detail: dict[str, Any], config: ServerConfig) -> list[str]:
    """The actions that can apply to the run now (none on a read-only server): never
    ``cancel`` on a run that ended cancelled or done, never ``resume`` on a live one,
    ``retry`` only on a stopped Plan or workflow run."""
    if not config.actions:
        return []
    status, owner = detail.get("status"), detail.get("owner")
    entry = detail.get("entry") or {}
    out: list[str] = []
    cancelled = (detail.get("error") or {}).get("type") == "RunCancelledError"
    if status in ("queued", "claimed", "running", "paused") or (
        status == "failed" and not cancelled and owner != "none"
    ):
        out.append("cancel")
    if status in ("paused", "failed") and entry and entry.get("status") in FINAL_STATUSES:
        out.append("resume")
    stopped = status in ("paused", "failed", "done") and owner != "live"
    if stopped and detail.get("kind") in RETRY_KINDS and not detail.get("corrupt"):
        out.append("retry")
    if detail.get("pending_approvals"):
        out.append("approve")
    if status not in ("done",) and not (status == "failed" and entry.get("status") != "running"):
        out.append("send")
    return out


def list_runs(
    config: ServerConfig,
    *,
    statuses: list[str],
    kinds: list[str],
    prefix: str | None,
    error_text: str | None,
    queue: str | None,
    older_than: float | None,
    newer_than: float | None,
    limit: int | None,
    offset: int,
    group: str | None = None,
) -> dict[str, Any]:
    """``GET /runs``: a page of runs with the total that match and the counts of each
    status and group (``stranded``, ``waiting``, ``queued``)."""
    from stepstone.store._base import RUN_STATUSES

    bad = sorted(set(statuses) - set(RUN_STATUSES))
    if bad:
        raise HttpError(400, f"unknown run status {bad}; pass one of {', '.join(RUN_STATUSES)}")
    if group is not None and group not in LIST_GROUPS:
        raise HttpError(400, f"unknown group {group!r}; pass one of {', '.join(LIST_GROUPS)}")
    limit = config.page_size if limit is None else limit
    found = run_listing(
        config.store,
        statuses=statuses,
        kinds=kinds,
        prefix=prefix,
        older_than=older_than,
        newer_than=newer_than,
        limit=limit,
        offset=offset,
        error_text=error_text,
        queue=queue,
        group=group,
    )
    total, runs = found["total"], found["runs"]
    more = offset + len(runs) < total
    return {
        "total": total,
        "runs": runs,
        "counts": found["counts"],
        "limit": limit,
        "offset": offset,
        "next_offset": offset + len(runs) if more else None,
    }


def cancel(config: ServerConfig, key: str, reason: str) -> dict[str, Any]:
    """``POST /runs/{key}/cancel``."""
    return {"key": key, "outcome": cancel_run(config.store, key, reason=reason)}


def resume(config: ServerConfig, key: str) -> dict[str, Any]:
    """``POST /runs/{key}/resume``: put a stopped run's queue entry back for a worker."""
    store = config.store
    queue = existing_queue(store)
    entry = queue.latest_entry(key) if queue is not None else None
    if entry is None:
        if run_head(store, key) is None:
            raise HttpError(404, missing_run(store, key))
        raise HttpError(
            409,
            f"run {key!r} was not started through a queue, so no worker can resume it; "
            "resume it where it was started (resume=True), or start runs with POST /runs",
        )
    if entry.status not in FINAL_STATUSES:
        raise HttpError(409, f"run {key!r} is {entry.status} in its queue: a worker has it")
    head = run_head(store, key)
    if entry.status == "done" and (head is None or head.status == "done"):
        raise HttpError(409, f"run {key!r} is done; rewind it with /retry?from=STEP first")
    requeued = requeue_run(store, key)
    if requeued is None:
        raise HttpError(409, f"run {key!r} changed meanwhile; look at it again")
    return {"key": key, "entry": requeued, "outcome": "queued again: a worker resumes it"}


def retry(config: ServerConfig, key: str, from_step: str) -> dict[str, Any]:
    """``POST /runs/{key}/retry?from=STEP``: rewind, and requeue a queued run."""
    if not from_step:
        raise HttpError(400, "pass ?from=STEP: the step to run again")
    head = retry_run(config.store, key, from_step=from_step)
    requeued = requeue_run(config.store, key)
    then = "queued again: a worker resumes it" if requeued else "resume=True runs it again"
    return {
        "key": key,
        "next_step": head.next_step,
        "status": head.status,
        "entry": requeued,
        "outcome": f"rewound: {from_step!r} runs again; {then}",
    }


def fork(config: ServerConfig, key: str, at: str, to: str) -> dict[str, Any]:
    """``POST /runs/{key}/fork?at=STEP&to=KEY``."""
    if not at or not to:
        raise HttpError(400, "pass ?at=STEP&to=NEW_KEY")
    head = fork_run(config.store, key, at=at, to=to)
    return {"key": head.key, "next_step": head.next_step, "status": head.status}


def message(config: ServerConfig, key: str, topic: str, value: Any) -> dict[str, Any]:
    """``POST /runs/{key}/messages/{topic}``: the body is the value."""
    sent = send(config.store, key, topic, value)
    return {"key": key, "topic": topic, "id": sent}


def approve(
    config: ServerConfig, key: str, call_id: str, body: Any, *, resume_after: bool = True
) -> dict[str, Any]:
    """``POST /runs/{key}/approvals/{call_id}``: ``{"approve": true}`` or
    ``{"deny": "reason"}`` (``"replace": true`` changes a decision already given). Once
    no call of the run waits for a decision, a run from a queue is queued again."""
    body = {} if body is None else body
    if not isinstance(body, dict) or not set(body) <= {"approve", "deny", "replace", "resume"}:
        raise HttpError(
            400, 'the body must be {"approve": true} or {"deny": "why"} (and "replace": true)'
        )
    deny = body.get("deny")
    if deny is not None and (not isinstance(deny, str) or not deny):
        raise HttpError(400, "'deny' must be a reason (a non-empty string): the model reads it")
    if deny is None and body.get("approve", True) is not True:
        raise HttpError(400, 'pass {"approve": true} or {"deny": "why"}')
    decision: bool | str = True if deny is None else deny
    record = key
    if run_head(config.store, key) is None:
        from stepstone.runner import checkpoint_latest_key  # not loaded by serve's start

        record = checkpoint_latest_key(key)  # a queued agent run, named by its run id
        if run_head(config.store, record) is None:
            record = key
    done = approve_call(
        config.store, record, call_id, decision=decision, replace=body.get("replace") is True
    )
    if not done["changed"]:
        outcome = f"{done['tool']} call {call_id} is already {decision_text(decision)}"
    else:
        verb = "approved" if deny is None else "denied"
        outcome = f"{verb} {done['tool']} call {call_id}"
    done["requeued"] = None
    if resume_after and body.get("resume", True) is not False:
        detail = run_detail(config.store, record) or {}
        undecided = [p for p in detail.get("pending_approvals", []) if p.get("decision") is None]
        if not undecided:
            done["requeued"] = requeue_when_stopped(config.store, key)
    if done["requeued"]:
        outcome += "; the run is queued again: a worker resumes it"
    elif done["changed"]:
        outcome += "; the run's next resume applies it"
    return {**done, "outcome": outcome}


def diff(config: ServerConfig, a: str, b: str) -> dict[str, Any]:
    """``GET /diff?a=KEY&b=KEY``: where two runs diverged, side by side."""
    if not a or not b:
        raise HttpError(400, "pass ?a=KEY&b=KEY")
    from stepstone.server._pages import cut_payloads

    out = diff_runs(config.store, a, b)
    for part in ("same", "only_a", "only_b"):
        cut_payloads(out[part])
    first = out["first_difference"]
    if first is not None:
        cut_payloads([e for e in (first["a"], first["b"]) if e is not None])
    return out
