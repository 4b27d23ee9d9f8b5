"""``@workflow`` and ``@step``: durable functions on plain Python.

A workflow is an async function whose run is recorded under a key. Each call it makes to
a ``@step`` function is journaled (intent before, outcome after); a resumed run executes
the body again from its start, and every step call whose outcome was committed returns it
without running. See ``docs/workflows.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from stepstone.core._envelope import Envelope
from stepstone.core._ids import new_uid
from stepstone.core._sync import run_sync
from stepstone.core._threads import call_sync
from stepstone.durable._effects import DurableScope, bind_scope
from stepstone.durable._operations import (
    Call,
    Entry,
    OperationJournal,
    Outcome,
    current_journal,
)
from stepstone.durable._queue import RunHandle, check_name, check_number, submit
from stepstone.engines.workflow._run import run_workflow
from stepstone.engines.workflow._values import (
    decode_args,
    decode_value,
    encode_args,
    encode_value,
)
from stepstone.exceptions import ConfigurationError, ConfigurationTypeError, UserError
from stepstone.store import Store

__all__ = [
    "BoundWorkflow",
    "StepContext",
    "Workflow",
    "WorkflowStep",
    "deprecate_patch",
    "patched",
    "step",
    "step_body",
    "step_context",
    "workflow",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

InDoubt = Literal["rerun", "fail"]


# -- step context -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    """What a running step knows about its call (:func:`step_context`).

    Attributes:
        key: The key of the workflow run the step belongs to (None: called outside one).
        position: The call's position in the run (``"3"``, ``"5.0.0"``).
        name: The step's name.
        attempt: 1 for the first attempt, 2, 3... for retries and re-runs after a crash.
        idempotency_key: The same on every attempt of this call in this run of the key
            (resumes included), another in another run of the key (a fresh start, a
            retry's rewind, a fork): pass it to external APIs so a repeated call is
            deduplicated. Outside a workflow, a new one per call.
        workflow: The workflow's name (None outside one).
    """

    key: str | None
    position: str | None
    name: str | None
    attempt: int
    idempotency_key: str
    workflow: str | None = None


_step_ctx: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "stepstone_step_context", default=None
)


def step_context() -> StepContext:
    """The context of the step the calling code runs in: its run key, position, attempt
    and idempotency key. Outside a workflow's step (a step called as a plain function,
    or no step at all), a context with ``key=None``, attempt 1 and a fresh idempotency
    key."""
    ctx: StepContext | None = _step_ctx.get()
    if ctx is not None:
        return ctx
    return StepContext(key=None, position=None, name=None, attempt=1, idempotency_key=new_uid())


@contextlib.contextmanager
def step_body(journal: OperationJournal, call: Call) -> Iterator[StepContext]:
    """Run the code inside as the body of the operation ``call`` of ``journal``'s run, as a
    ``@step`` body runs: :func:`step_context` tells its key, position, attempt and
    idempotency key, and a durable scope keyed by the idempotency key (no operation
    journal) is current, so an operation it calls is a plain call and an agent it runs
    journals under that key. Framework adapters run their tool calls this way.

    As in a ``@step``, the run's events and streams are the workflow's: ``set_event`` and
    ``write_stream`` inside write at once (the values carry ``call.attempt``), and
    ``sleep`` and ``recv`` are refused."""
    ctx = StepContext(
        key=call.key,
        position=call.position,
        name=call.name,
        attempt=call.attempt,
        idempotency_key=call.idempotency_key,
        workflow=journal.what,
    )
    token = _step_ctx.set(ctx)
    try:
        scope = DurableScope(
            store=journal.store,
            key=call.idempotency_key,
            address=journal.key,
            attempt=call.attempt,
        )
        with bind_scope(scope):
            yield ctx
    finally:
        _step_ctx.reset(token)


# -- steps --------------------------------------------------------------------------------
class WorkflowStep(Generic[P, R]):
    """A function made a durable step by :func:`step`.

    Called inside a workflow, it returns an awaitable whose call is journaled: replayed
    from the journal on resume, run (and retried) otherwise. Called anywhere else, it is
    the plain function (a sync function returns its value, an async one a coroutine).
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None,
        retries: int,
        retry_delay: float,
        max_retry_delay: float,
        in_doubt: InDoubt,
        args_may_change: bool,
    ) -> None:
        if not callable(fn):
            raise ConfigurationTypeError(f"@step decorates a function, got {fn!r:.80}")
        if isinstance(fn, Workflow | WorkflowStep):
            raise ConfigurationTypeError(
                f"@step cannot decorate {fn!r}: it is already a workflow or a step"
            )
        self.fn = fn
        self.name = _checked_name("@step name", name or getattr(fn, "__qualname__", None))
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(f"@step retries must be an int >= 0, got {retries!r}")
        self.retries = retries
        self.retry_delay = check_number("@step retry_delay", retry_delay, 0)
        self.max_retry_delay = check_number("@step max_retry_delay", max_retry_delay, 0)
        if in_doubt not in ("rerun", "fail"):
            raise ConfigurationError(
                f"@step in_doubt must be 'rerun' (run it again after a crash, with the same "
                f"idempotency key) or 'fail' (settle it by hand), got {in_doubt!r}"
            )
        self.in_doubt: InDoubt = in_doubt
        self.args_may_change = bool(args_may_change)
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<step {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        journal = current_journal()
        if journal is None:
            return self.fn(*args, **kwargs)
        return self._journaled(journal, args, kwargs)  # type: ignore[return-value]

    async def _journaled(
        self, journal: OperationJournal, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        data = encode_args(f"step {self.name!r}", self.fn, args, kwargs)
        pos, found = journal.lookup("step", self.name, data, check_args=not self.args_may_change)
        if found is not None and found.outcome is not None:
            return journal.recorded_value(found, decode_value)  # a replay: no call
        workflow_name = journal.what

        async def invoke(call: Call) -> Outcome:
            ctx = StepContext(
                key=call.key,
                position=call.position,
                name=call.name,
                attempt=call.attempt,
                idempotency_key=call.idempotency_key,
                workflow=workflow_name,
            )
            token = _step_ctx.set(ctx)
            try:
                # An agent inside the step journals under the call's idempotency key (as
                # in a Plan step); a step it calls is a plain call.
                scope = DurableScope(
                    store=journal.store,
                    key=call.idempotency_key,
                    address=journal.key,  # its events and streams are the workflow's
                    attempt=call.attempt,
                )
                with bind_scope(scope):
                    if self.is_async:
                        value = await self.fn(*args, **kwargs)  # type: ignore[misc]
                    else:
                        value = await call_sync(self.fn, *args, **kwargs)
            finally:
                _step_ctx.reset(token)
            return Outcome.of(encode_value(f"step {self.name!r}", value), value)

        return await journal.operation(
            "step",
            self.name,
            data,
            invoke,
            in_doubt=self.in_doubt,
            check_args=not self.args_may_change,
            retries=self.retries,
            retry_delay=self.retry_delay,
            max_retry_delay=self.max_retry_delay,
            wait=self.in_doubt == "fail",
            decode=decode_value,
            position=pos,
            found=found,
        )


@overload
def step(fn: Callable[P, Coroutine[Any, Any, T]], /) -> WorkflowStep[P, Coroutine[Any, Any, T]]: ...
@overload
def step(fn: Callable[P, T], /) -> WorkflowStep[P, Any]: ...
@overload
def step(
    *,
    name: str | None = None,
    retries: int = 0,
    retry_delay: float = 1.0,
    max_retry_delay: float = 60.0,
    in_doubt: InDoubt = "rerun",
    args_may_change: bool = False,
) -> Callable[[Callable[P, T]], WorkflowStep[P, Any]]: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retries: int = 0,
    retry_delay: float = 1.0,
    max_retry_delay: float = 60.0,
    in_doubt: InDoubt = "rerun",
    args_may_change: bool = False,
) -> Any:
    """Make a function a durable step of the workflows that call it.

    ``@step`` or ``@step(name=..., retries=3, retry_delay=1.0, in_doubt="rerun")``, on an
    async or a sync function (a sync one runs off the event loop, in a worker thread).

    Args:
        fn: The function.
        name: Its journaled name (default: its ``__qualname__``); a resume checks that the
            call at each recorded position has the same name.
        retries: Attempts after the first when it raises; each failed attempt is recorded,
            and the last error is raised into the workflow (which may catch it).
        retry_delay: Seconds before the first retry; doubled for each next one (at most
            ``max_retry_delay``), with jitter.
        max_retry_delay: The longest delay between two attempts.
        in_doubt: What a resumed workflow does with a call that started before its process
            died and recorded no outcome: ``"rerun"`` it (at least once, with the same
            idempotency key) or ``"fail"`` (raise ``EffectInDoubtError``; settle it by hand).
        args_may_change: Accept other arguments on replay at a recorded position (by
            default that is a ``NonDeterministicWorkflowError``).
    """
    options = {
        "name": name,
        "retries": retries,
        "retry_delay": retry_delay,
        "max_retry_delay": max_retry_delay,
        "in_doubt": in_doubt,
        "args_may_change": args_may_change,
    }
    if fn is None:
        return lambda f: WorkflowStep(f, **options)  # type: ignore[arg-type]
    return WorkflowStep(fn, **options)  # type: ignore[arg-type]


# -- patches ------------------------------------------------------------------------------
def patched(patch_id: str) -> bool:
    """Whether the running workflow takes the new code path of the change ``patch_id``.

    True for a run that reaches this point for the first time since the patch was deployed
    (the answer is recorded at this position, so its resumes get True again); False for a
    run whose journal shows it had passed this point before (it recorded another call
    here), so code can change under runs in flight. Outside a workflow, True.
    """
    if not isinstance(patch_id, str) or not patch_id:
        raise ConfigurationError(f"patched() takes a non-empty str id, got {patch_id!r}")
    journal = current_journal()
    if journal is None:
        return True
    pos = journal.position(consume=False)
    entry = journal.entries.get(pos)
    if entry is None:
        _record_patch(journal, journal.position(), patch_id)
        return True
    if entry.op == "patch" and entry.name == patch_id:
        journal.position()
        journal.replayed += 1
        return True
    return False


def deprecate_patch(patch_id: str) -> bool:
    """Retire ``patched(patch_id)`` once no run that had passed it before the patch is left:
    replace the ``if stepstone.patched(id):`` with ``stepstone.deprecate_patch(id)`` and keep
    only the new path. Runs that recorded the patch skip its position; others record
    nothing. Always True."""
    if not isinstance(patch_id, str) or not patch_id:
        raise ConfigurationError(f"deprecate_patch() takes a non-empty str id, got {patch_id!r}")
    journal = current_journal()
    if journal is None:
        return True
    entry = journal.entries.get(journal.position(consume=False))
    if entry is not None and entry.op == "patch" and entry.name == patch_id:
        journal.position()
    return True


def _record_patch(journal: OperationJournal, pos: str, patch_id: str) -> None:
    intent = {"op": "patch", "name": patch_id, "args": None, "at": round(time.time(), 3)}
    outcome = {"op": "patch", "name": patch_id, "value": True}
    journal.entries[pos] = Entry("patch", patch_id, intent, outcome)
    journal.add("intent", pos, intent)
    journal.add("outcome", pos, outcome)
    journal.soon()


# -- workflows ----------------------------------------------------------------------------
KeyOption = str | Callable[..., str] | None


class Workflow(Generic[P, R]):
    """An async function made a durable workflow by :func:`workflow`.

    ``wf.using(store=..., key=...)`` binds where a run is recorded; ``.run(...)``,
    ``.run_sync(...)`` and ``.submit(...)`` start or resume it. Awaited inside another
    workflow, it is a child run under ``"<parent key>/<position>"``, journaled as one
    operation of the parent. Awaited anywhere else, it runs durably when it has a store
    (``@workflow(store=...)``), else as the plain function.
    """

    def __init__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        *,
        name: str | None,
        store: Store | None,
        key: KeyOption,
    ) -> None:
        if isinstance(fn, Workflow | WorkflowStep):
            raise ConfigurationTypeError(
                f"@workflow cannot decorate {fn!r}: it is already a workflow or a step"
            )
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationTypeError(
                f"@workflow decorates an async function (async def), got {fn!r:.80}; "
                "steps may be sync, the workflow body is async"
            )
        if store is not None and not isinstance(store, Store):
            raise ConfigurationTypeError(f"@workflow store= must be a Store, got {store!r:.80}")
        if key is not None and not (isinstance(key, str) or callable(key)):
            raise ConfigurationTypeError(
                f"@workflow key= must be a str template ('order-{{order_id}}') or a function "
                f"of the arguments returning the key, got {key!r:.80}"
            )
        self.fn = fn
        self.name = _checked_name("@workflow name", name or getattr(fn, "__qualname__", None))
        self.store = store
        self.key = key
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<workflow {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        journal = current_journal()
        if journal is not None:
            return self._child(journal, args, kwargs)
        if self.store is None:
            return self.fn(*args, **kwargs)
        return self.using().run(*args, **kwargs)

    def using(
        self,
        *,
        store: Store | None = None,
        key: str | None = None,
        queue: str = "default",
        priority: int = 0,
        delay: float = 0.0,
        dedupe_key: str | None = None,
        max_attempts: int = 3,
    ) -> BoundWorkflow[P, R]:
        """This workflow with where its run is recorded and how it is queued.

        Args:
            store: The store (default: the decorator's ``store=``).
            key: The run's key (default: the decorator's ``key=`` applied to the
                arguments, else a new key per call).
            queue, priority, delay, dedupe_key, max_attempts: How :meth:`BoundWorkflow.submit`
                queues it (as :func:`stepstone.submit`).
        """
        if store is not None and not isinstance(store, Store):
            raise ConfigurationTypeError(f"store must be a Store, got {store!r:.80}")
        if key is not None:
            check_name("key", key)
        return BoundWorkflow(
            self,
            store=store,
            key=key,
            queue=queue,
            priority=priority,
            delay=delay,
            dedupe_key=dedupe_key,
            max_attempts=max_attempts,
        )

    async def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run it with the decorator's store and key (see :meth:`BoundWorkflow.run`)."""
        return await self.using().run(*args, **kwargs)

    def run_sync(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Sync :meth:`run`."""
        return self.using().run_sync(*args, **kwargs)

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> RunHandle:
        """Queue it with the decorator's store and key (see :meth:`BoundWorkflow.submit`)."""
        return self.using().submit(*args, **kwargs)

    def key_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The key the decorator's ``key=`` gives for these arguments (None: no ``key=``).

        Raises:
            UserError: the template names no parameter of the workflow, or the key is empty.
        """
        if self.key is None:
            return None
        if callable(self.key):
            key = self.key(*args, **kwargs)
        else:
            try:
                bound = inspect.signature(self.fn).bind(*args, **kwargs)
                bound.apply_defaults()
                key = self.key.format_map(bound.arguments)
            except (KeyError, IndexError, TypeError) as exc:
                raise UserError(
                    f"workflow {self.name!r}: its key template {self.key!r} cannot be filled "
                    f"from the arguments ({type(exc).__name__}: {exc}); name parameters of "
                    "the function in braces, e.g. key='order-{order_id}'"
                ) from exc
        return check_name(f"workflow {self.name!r} key", key)

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The JSON that records this workflow's arguments."""
        return encode_args(f"workflow {self.name!r}", self.fn, args, kwargs)

    async def _child(
        self, journal: OperationJournal, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        data = self.encode(args, kwargs)
        pos = journal.position()
        key = f"{journal.key}/{pos}"

        async def invoke(call: Call) -> Outcome:
            value = await run_workflow(
                self.name, self.fn, journal.store, key, args, kwargs, data, parent=journal
            )
            return Outcome.of(encode_value(f"workflow {self.name!r}", value), value)

        return await journal.operation(
            "workflow",
            self.name,
            data,
            invoke,
            decode=decode_value,
            position=pos,
            describe=lambda: {"key": key},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class BoundWorkflow(Generic[P, R]):
    """A workflow with its store, key and queue options (``wf.using(...)``)."""

    workflow: Workflow[P, R]
    store: Store | None = None
    key: str | None = None
    queue: str = "default"
    priority: int = 0
    delay: float = 0.0
    dedupe_key: str | None = None
    max_attempts: int = 3

    def _store(self) -> Store:
        store = self.store or self.workflow.store
        if store is None:
            raise UserError(
                f"workflow {self.workflow.name!r} has no store: pass one with "
                f".using(store=Store(db='app.sqlite')) or @workflow(store=...)"
            )
        return store

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return (
            self.key
            or self.workflow.key_for(args, kwargs)
            or f"workflow:{self.workflow.name}:{new_uid()}"
        )

    async def run(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the workflow durably here, and return what it returned (or raise what it
        raised).

        A key whose run finished returns its recorded result and runs nothing; an
        unfinished run under it (crashed, failed, cancelled) is resumed: committed steps
        are replayed from the journal, and the body continues from the first step without
        an outcome.

        Raises:
            ConcurrentRunError: a live process runs this key.
            NonDeterministicWorkflowError: the body called another step (or other
                arguments) at a position the journal recorded.
            Exception: what the workflow raised (the run is recorded ``failed``).
        """
        wf = self.workflow
        store = self._store()
        key = self._key(args, kwargs)
        data = wf.encode(args, kwargs)
        return await run_workflow(wf.name, wf.fn, store, key, args, kwargs, data)  # type: ignore[no-any-return]

    def run_sync(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Sync :meth:`run` (refused inside a running event loop: await ``run`` there)."""
        return run_sync(
            self.run(*args, **kwargs),
            sync_name=f"workflow {self.workflow.name!r} run_sync()",
            async_name=f"{self.workflow.name}.run(...)",
        )

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> RunHandle:
        """Queue a run for a worker (``stepstone worker``), which imports the workflow by
        its import path (``module:name``: define it at module level); returns its handle,
        whose ``result()`` is an envelope with the return value as its payload (and the
        error of a run that raised)."""
        wf = self.workflow
        store = self._store()
        data = wf.encode(args, kwargs)
        env: Envelope[Any] = Envelope(task=wf.name, payload={"workflow_args": data})
        return submit(
            store,
            wf,
            env,
            key=self.key or wf.key_for(args, kwargs),
            queue=self.queue,
            priority=self.priority,
            delay=self.delay,
            dedupe_key=self.dedupe_key,
            max_attempts=self.max_attempts,
        )


def queued_args(workflow: Workflow[Any, Any], env: Envelope[Any]) -> tuple[Any, ...]:
    """The arguments a submitted envelope carries for ``workflow``:
    ``(args, kwargs, recorded JSON)``.

    Raises:
        UserError: the envelope was not made by ``submit`` of a workflow.
    """
    payload = env.payload
    if not isinstance(payload, dict) or "workflow_args" not in payload:
        raise UserError(
            f"workflow {workflow.name!r} was queued with a task that carries no arguments "
            f"({type(payload).__name__}); submit it with {workflow.name}.using(store=..., "
            "queue=...).submit(*args)"
        )
    data = payload["workflow_args"]
    args, kwargs = decode_args(data)
    return args, kwargs, data


@overload
def workflow(fn: Callable[P, Coroutine[Any, Any, T]], /) -> Workflow[P, T]: ...
@overload
def workflow(
    *, name: str | None = None, store: Store | None = None, key: KeyOption = None
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Workflow[P, T]]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    store: Store | None = None,
    key: KeyOption = None,
) -> Any:
    """Make an async function a durable workflow.

    ``@workflow`` or ``@workflow(name=..., store=..., key="order-{order_id}")``.

    Args:
        fn: The async function (its body calls ``@step`` functions and other workflows).
        name: Its journaled name (default: its ``__qualname__``); a key holding a run of
            another workflow is refused.
        store: Where its runs are recorded unless ``.using(store=...)`` says otherwise.
        key: The run key: a template filled with the arguments by name
            (``"order-{order_id}"``), or a function of the arguments returning it.
    """
    if fn is None:
        return lambda f: Workflow(f, name=name, store=store, key=key)
    return Workflow(fn, name=name, store=store, key=key)


def _checked_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty str, got {name!r:.80}")
    if "\0" in name:
        raise ConfigurationError(f"{what} must not hold a NUL character, got {name!r:.80}")
    return name
