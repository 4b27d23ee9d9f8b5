"""Calling one node (function or Agent) and projecting states in and out of subgraphs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from stepstone.core._envelope import Envelope
from stepstone.core._threads import call_sync, is_awaitable
from stepstone.core._tool import is_async_callable
from stepstone.engines.graph._builder import NodeSpec
from stepstone.engines.graph._state import Reducer, State, append

if TYPE_CHECKING:
    from stepstone.engines.graph._compiled import CompiledGraph

__all__ = ["call_node", "project_in", "project_out", "update_reducers"]


async def call_node(spec: NodeSpec, state: State) -> Any:
    """Run a function node (sync ones in a worker thread) or an Agent node."""
    if spec.agent is not None:
        env: Envelope[Any] = await spec.agent.run(state.model_dump_json())
        if not env.ok:
            assert env.error is not None
            raise RuntimeError(f"agent failed: {env.error.type}: {env.error.message}")
        payload = env.payload
        if isinstance(payload, BaseModel):
            return payload.model_dump()
        if isinstance(payload, Mapping):
            return payload
        if spec.writes is not None:
            return {spec.writes: env.text()}
        raise TypeError(
            f"agent node {spec.name!r} answered {type(payload).__name__}; give the Agent "
            f"output=<a pydantic model of state fields>, or add_node(..., writes='field')"
        )
    fn = spec.fn
    # a sync node: in a worker thread, or on the loop's thread when that starves nothing
    result = await fn(state) if is_async_callable(fn) else await call_sync(fn, state)
    return await result if is_awaitable(result) else result


def project_in(spec: NodeSpec, sub: CompiledGraph[Any], state: State) -> State:
    """The subgraph's initial state: ``inputs(parent)``, or the shared fields."""
    cls = sub.state_cls
    if spec.inputs is not None:
        made: Any = spec.inputs(state)
        if isinstance(made, State) and isinstance(made, cls):
            return made
        projected: State = cls.model_validate(made)
        return projected
    shared = {k: v for k, v in dict(state).items() if k in cls.model_fields}
    initial: State = cls.model_validate(shared)
    return initial


def project_out(
    spec: NodeSpec, parent: CompiledGraph[Any], initial: State, final: State
) -> Mapping[str, Any]:
    """The parent's update: ``outputs(final)``, or what the subgraph changed in shared
    fields: the items it appended, for the parent's ``append`` fields, else the final value
    (which :func:`update_reducers` keeps from the parent's other reducers)."""
    if spec.outputs is not None:
        return spec.outputs(final)
    out: dict[str, Any] = {}
    for field in type(final).model_fields:
        if field not in parent.state_cls.model_fields:
            continue
        before, after = getattr(initial, field), getattr(final, field)
        if before == after:
            continue
        reducer = parent.reducers.get(field)
        if reducer is not None and reducer.extends is not None:
            before_l, after_l = list(before or ()), list(after or ())
            if after_l[: len(before_l)] != before_l:
                raise ValueError(
                    f"subgraph node {spec.name!r} rewrote the `{reducer.name}` field {field!r} "
                    "instead of appending to it; pass outputs=lambda sub: {...}"
                )
            out[field] = after_l[len(before_l) :]
        else:
            out[field] = after
    return out


def update_reducers(spec: NodeSpec, parent: CompiledGraph[Any]) -> Mapping[str, Reducer]:
    """The reducers ``spec``'s update goes through in ``parent``. A subgraph node without
    ``outputs=`` hands back the subgraph's final values, which started from the parent's
    and so already hold them: only its list fields whose reducer extends them (``append``,
    ``concat_flatten``) take the items the subgraph added (see :func:`project_out`), which
    are appended as they are."""
    if spec.subgraph is None or spec.outputs is not None:
        return parent.reducers
    return {field: append for field, r in parent.reducers.items() if r.extends is not None}
