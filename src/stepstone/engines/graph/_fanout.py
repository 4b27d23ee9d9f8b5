"""Fan-out nodes: one branch per item of a list field, in parallel, each finished branch
saved with its result, the results merged in item order through the fields' reducers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from stepstone.core._envelope import Envelope
from stepstone.core._serialization import to_json_value
from stepstone.core._threads import call_sync, is_awaitable
from stepstone.core._tool import is_async_callable
from stepstone.durable._effects import bind_scope
from stepstone.engines.graph._builder import FanSpec, NodeSpec
from stepstone.engines.graph._nodes import project_out
from stepstone.engines.graph._observe import Observer
from stepstone.engines.graph._records import FanOutAt
from stepstone.engines.graph._run import GraphRun
from stepstone.engines.graph._state import Reducer, State, append, apply_update
from stepstone.exceptions import (
    CheckpointSaveFailed,
    ConcurrentRunError,
    NodeException,
    RunCancelledError,
)

if TYPE_CHECKING:
    from stepstone.engines.graph._compiled import CompiledGraph

__all__ = ["run_fan_out"]

#: Errors of the run itself, never a branch's: they stop the fan-out as they are.
_RUN_ERRORS = (CheckpointSaveFailed, ConcurrentRunError, RunCancelledError)


async def run_fan_out(
    engine: CompiledGraph[Any],
    run: GraphRun,
    graph: CompiledGraph[Any],
    spec: NodeSpec,
    state: State,
    ns: tuple[str, ...],
    step: int,
    extra: tuple[Observer, ...],
) -> tuple[State, list[str], dict[str, list[Any]]]:
    """Run the fan-out node ``spec`` of ``graph``; its merged update as
    :func:`~stepstone.engines.graph._state.apply_update` returns one.

    Raises:
        NodeException: a branch raised (the first one, by the time it failed; branches
            already running finish and are saved, no new one starts).
    """
    fan = spec.fan
    assert fan is not None
    name = spec.name
    items = _items(state, fan, name)
    at: FanOutAt = (ns, name, step)
    done: dict[int, Any] = run.fan_done.pop(at, {})  # saved before a resume: not run again
    todo = [i for i in range(len(items)) if i not in done]
    gate = asyncio.Semaphore(fan.concurrency or max(len(todo), 1))
    failed: list[tuple[int, BaseException]] = []
    where = {"node_name": name, "namespace": ns, "step": step}

    async def branch(i: int) -> None:
        async with gate:
            if failed:  # a sibling failed: start nothing new
                return
            run.emit("node_start", extra, state=state, branch=i, **where)
            try:
                result = _stored(run, await _call(engine, run, graph, spec, state, items[i], i, at))
            except _RUN_ERRORS as exc:
                failed.append((i, exc))
                return
            except Exception as exc:  # noqa: BLE001 - a branch's error fails the node, below
                failed.append((i, exc))
                run.emit("node_end", extra, error=exc, branch=i, **where)
                return
            run.emit("node_end", extra, state=state, branch=i, **where)
            try:
                await run.save_branch(at, i, result)
            except Exception as exc:  # noqa: BLE001 - a failed save stops the run, below
                failed.append((i, exc))
                return
            done[i] = result
            if run.saves:
                run.emit("checkpoint_saved", extra, state=state, branch=i, **where)

    await asyncio.gather(*(branch(i) for i in todo))
    if failed:
        i, exc = failed[0]
        if not isinstance(exc, Exception) or isinstance(exc, _RUN_ERRORS):
            raise exc
        raise NodeException(
            f"fan-out node {name!r}: branch {i} (item {items[i]!r:.60}) raised "
            f"{type(exc).__name__}: {exc}",
            node_name=name,
            recoverable_state=state,
            namespace=ns,
        ) from exc
    results = [done[i] for i in range(len(items))]
    if fan.into is not None:
        return apply_update(state, {fan.into: results}, node=name, reducers=graph.reducers)
    return _merge(state, results, name, _result_reducers(fan, graph))


def _items(state: State, fan: FanSpec, name: str) -> list[Any] | tuple[Any, ...]:
    """The list a fan-out node maps over (TypeError naming the field when it is not one)."""
    items = getattr(state, fan.over)
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            f"fan-out node {name!r} maps over field {fan.over!r}, which holds "
            f"{type(items).__name__} {items!r:.80}, not a list"
        )
    return items


def _merge(
    state: State, results: list[Any], name: str, reducers: Mapping[str, Reducer]
) -> tuple[State, list[str], dict[str, list[Any]]]:
    """The branches' updates (dicts of fields, or None) applied one after another, in
    item order, through ``reducers``."""
    current, set_fields, extend = state, list[str](), dict[str, list[Any]]()
    for i, result in enumerate(results):
        if result is None:
            continue
        if not isinstance(result, Mapping):
            raise TypeError(
                f"fan-out node {name!r}: branch {i} returned {type(result).__name__}, not a "
                f"dict of fields to update; return a dict, or pass into='field' to collect "
                "the results in a list field"
            )
        current, fields, items_added = apply_update(current, result, node=name, reducers=reducers)
        set_fields += [f for f in fields if f not in set_fields]
        for field, added in items_added.items():
            extend.setdefault(field, []).extend(added)
    return current, set_fields, extend


def _result_reducers(fan: FanSpec, graph: CompiledGraph[Any]) -> Mapping[str, Reducer]:
    """The reducers a branch's update goes through: a subgraph's default result is what it
    changed in shared fields (the items it added, for extending fields), as for a subgraph
    node (see ``update_reducers``)."""
    if fan.subgraph is None or fan.outputs is not None:
        return graph.reducers
    return {field: append for field, r in graph.reducers.items() if r.extends is not None}


def _stored(run: GraphRun, result: Any) -> Any:
    """A branch's result as its record keeps it (its JSON form in a JSON record), and as it
    is merged, so a resumed fan-out merges exactly what an uninterrupted one would."""
    if run.sink is None or run.pickled:
        return result
    return to_json_value(result, where="a fan-out branch's result", strict=True)


async def _call(
    engine: CompiledGraph[Any],
    run: GraphRun,
    graph: CompiledGraph[Any],
    spec: NodeSpec,
    state: State,
    item: Any,
    index: int,
    at: FanOutAt,
) -> Any:
    """One branch: the function, the Agent or the subgraph, for ``item``."""
    fan = spec.fan
    assert fan is not None
    mine = run.for_branch(at, index)
    if fan.subgraph is not None:
        sub = fan.subgraph
        made = fan.inputs(item, state) if fan.inputs is not None else item
        initial = made if isinstance(made, sub.state_cls) else sub.state_cls.model_validate(made)
        final = await engine._execute(mine, sub, initial, (*at[0], spec.name), sub.entry, 0, [])
        if fan.outputs is not None:
            return fan.outputs(final)
        if fan.into is not None:
            return final
        return project_out(spec, graph, initial, final)
    with bind_scope(mine.scope(at[0], spec.name, at[2])):
        if fan.agent is not None:
            return await _call_agent(spec.name, fan, item)
        args = (item, state) if fan.with_state else (item,)
        fn = fan.fn
        result = await fn(*args) if is_async_callable(fn) else await call_sync(fn, *args)
        return await result if is_awaitable(result) else result


async def _call_agent(name: str, fan: FanSpec, item: Any) -> Any:
    task = item if isinstance(item, str) else json.dumps(to_json_value(item, strict=True))
    env: Envelope[Any] = await fan.agent.run(task)
    if not env.ok:
        assert env.error is not None
        raise RuntimeError(f"agent failed: {env.error.type}: {env.error.message}")
    payload = env.payload
    if fan.into is not None:
        return payload
    if isinstance(payload, BaseModel):
        return payload.model_dump()
    if isinstance(payload, Mapping):
        return payload
    raise TypeError(
        f"fan-out node {name!r}: its agent answered {type(payload).__name__}; give the "
        "Agent output=<a pydantic model of state fields>, or pass into='field' to collect "
        "the answers in a list field"
    )
