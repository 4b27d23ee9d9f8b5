"""Typed graph state: frozen pydantic models, reducers, and applying node updates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from stepstone.core._serialization import to_json_value

__all__ = [
    "Patch",
    "Reducer",
    "State",
    "append",
    "apply_patch",
    "apply_update",
    "dump_state",
    "json_patch",
    "object_patch",
    "reducers_of",
]

S = TypeVar("S", bound="State")


class State(BaseModel):
    """The typed, immutable state a graph passes from node to node.

    Subclass it with your fields. Nodes never mutate it: they return a dict of field
    updates, which the engine merges (last write wins, or the field's reducer) into a new
    instance.

    Attributes:
        schema_version: Version of the field layout, stored with every checkpoint. ``""``
            (the default) opts the class out of migrations; any other value opts it in, and
            a record saved under another version is migrated on load through the edges
            registered with ``GraphBuilder.with_state_migration``.

    Example::

        class Mission(State):
            schema_version: ClassVar[str] = "v1"
            destination: str
            objective: str = ""
            trace: Annotated[list[str], append] = []
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: ClassVar[str] = ""


class Reducer:
    """How a field merges a node's update into its current value.

    Put one in the field's ``Annotated`` metadata. ``Reducer(fn)`` wraps any
    ``fn(current, update) -> new`` function; :data:`append` is the built-in list reducer,
    and the only one checkpointed as a delta (other reducers save the merged value).

    Args:
        fn: ``fn(current, update) -> new value``.
        name: Shown in errors (default: the function's name).
    """

    def __init__(self, fn: Callable[[Any, Any], Any], *, name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reducer")

    def __call__(self, current: Any, update: Any) -> Any:
        return self.fn(current, update)

    def __repr__(self) -> str:
        return f"Reducer({self.name})"


def _append(current: Any, update: Any) -> list[Any]:
    if not isinstance(update, (list, tuple)):
        raise TypeError(
            f"an `append` field takes a list of new items, got {type(update).__name__} "
            f"{update!r}; return [item] instead of item"
        )
    return [*(current or ()), *update]


#: The list reducer: a node's update (a list) is added to the end of the field.
#: ``trace: Annotated[list[str], append] = []``; a node returns ``{"trace": ["node_a"]}``.
append = Reducer(_append, name="append")


def reducers_of(cls: type[State]) -> dict[str, Reducer]:
    """The reducer of every field of ``cls`` that declares one."""
    out: dict[str, Reducer] = {}
    for name, info in cls.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Reducer):
                out[name] = meta
    return out


#: A checkpoint delta: ``{"set": {field: json}, "extend": {field: [json items]}}``. It can
#: be applied to a state's JSON form without knowing the state class.
Patch = dict[str, dict[str, Any]]


def apply_update(
    state: S, update: Mapping[str, Any], *, node: str, reducers: Mapping[str, Reducer]
) -> tuple[S, list[str], dict[str, list[Any]]]:
    """Merge a node's ``update`` into ``state``.

    Returns:
        The new state, the fields set to a new value (last write wins, or a reducer other
        than :data:`append`), and the items each :data:`append` field gained.

    Raises:
        TypeError, ValueError: an unknown field, a reducer refusing the value, or a new
            state that does not validate (the engine wraps them in ``NodeException``).
    """
    cls = type(state)
    unknown = sorted(k for k in update if k not in cls.model_fields)
    if unknown:
        raise ValueError(
            f"node {node!r} returned unknown field(s) {unknown} for {cls.__name__}; "
            f"its fields are {sorted(cls.model_fields)}"
        )
    merged: dict[str, Any] = {}
    extend: dict[str, list[Any]] = {}
    for field, value in update.items():
        reducer = reducers.get(field)
        if reducer is None:
            merged[field] = value
        else:
            merged[field] = reducer(getattr(state, field), value)
            if reducer is append:
                extend[field] = list(value)
    try:
        new = cls.model_validate({**dict(state), **merged})
    except ValidationError as exc:
        raise ValueError(f"node {node!r} returned an update that does not validate: {exc}") from exc
    return new, [f for f in merged if f not in extend], extend


def json_patch(
    new: State, set_fields: list[str], extend: Mapping[str, list[Any]], where: str
) -> Patch:
    """The JSON checkpoint :data:`Patch` of one update (see :func:`apply_update`)."""
    patch: Patch = {}
    if set_fields:
        dumped = new.model_dump(mode="json", include=set(set_fields))
        patch["set"] = {f: dumped[f] for f in set_fields}
    if extend:
        patch["extend"] = {f: to_json_value(v, where=f"{where}[{f!r}]") for f, v in extend.items()}
    return patch


def object_patch(new: State, set_fields: list[str], extend: Mapping[str, list[Any]]) -> Patch:
    """The pickle checkpoint :data:`Patch` of one update (Python values, not JSON)."""
    patch: Patch = {}
    if set_fields:
        patch["set"] = {f: getattr(new, f) for f in set_fields}
    if extend:
        patch["extend"] = {f: list(v) for f, v in extend.items()}
    return patch


def apply_patch(state: Any, patch: Mapping[str, Any]) -> Any:
    """Apply a checkpoint :data:`Patch` to a saved state: a JSON dict (JSON records) or a
    State instance (pickle records). Returns the patched state."""
    if isinstance(state, BaseModel):
        changes = dict(patch.get("set", {}))
        for field, items in patch.get("extend", {}).items():
            changes[field] = [*(getattr(state, field) or ()), *items]
        return state.model_copy(update=changes)
    data = dict(state)
    for field, value in patch.get("set", {}).items():
        data[field] = value
    for field, items in patch.get("extend", {}).items():
        data[field] = [*(data.get(field) or ()), *items]
    return data


def dump_state(state: BaseModel) -> dict[str, Any]:
    """A state's JSON form (what JSON checkpoints store)."""
    dumped: dict[str, Any] = state.model_dump(mode="json")
    return dumped
