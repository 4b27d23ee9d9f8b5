"""Typed graph state: frozen pydantic models, reducers, and applying node updates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from stepstone.core._serialization import to_json_value
from stepstone.exceptions import ReducerError, StateValidationError

__all__ = [
    "Patch",
    "Reducer",
    "State",
    "append",
    "concat_flatten",
    "last_write_wins",
    "merge",
    "merge_all",
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
    ``fn(current, update) -> new`` function. The built-ins are :data:`append`,
    :data:`concat_flatten`, :data:`merge`, :data:`merge_all` and :data:`last_write_wins`
    (a field without a reducer behaves as ``last_write_wins``).

    Args:
        fn: ``fn(current, update) -> new value``. Raise ``TypeError`` or ``ValueError`` to
            refuse an update; the engine reports it as a ``ReducerError`` naming the field.
        name: Shown in errors (default: the function's name).
        extends: For a reducer whose result is always ``[*current, *items]``: a function
            ``update -> items``. Such a field is checkpointed as a delta (only the new
            items are written); other reducers save the merged value.
    """

    def __init__(
        self,
        fn: Callable[[Any, Any], Any],
        *,
        name: str | None = None,
        extends: Callable[[Any], list[Any]] | None = None,
    ) -> None:
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "reducer"))
        self.extends = extends

    def __call__(self, current: Any, update: Any) -> Any:
        return self.fn(current, update)

    def __repr__(self) -> str:
        return f"Reducer({self.name})"


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _list_current(reducer: str, current: Any) -> list[Any]:
    """``current`` of a list field (None counts as empty); anything else is refused: a
    string would otherwise be taken apart into its characters."""
    if current is None:
        return []
    if not isinstance(current, (list, tuple)):
        raise TypeError(
            f"`{reducer}` keeps a list, but the field's current value is {_shown(current)}; "
            f"declare the field as a list, e.g. Annotated[list[str], {reducer}] = []"
        )
    return list(current)


def _list_update(reducer: str, update: Any, hint: str) -> list[Any]:
    if not isinstance(update, (list, tuple)):
        raise TypeError(f"`{reducer}` takes a list of new items, got {_shown(update)}; {hint}")
    return list(update)


def _dict_current(reducer: str, current: Any) -> dict[Any, Any]:
    if current is None:
        return {}
    if not isinstance(current, Mapping):
        raise TypeError(
            f"`{reducer}` keeps a dict, but the field's current value is {_shown(current)}; "
            f"declare the field as a dict, e.g. Annotated[dict[str, int], {reducer}] = {{}}"
        )
    return dict(current)


def _append_items(update: Any) -> list[Any]:
    return _list_update("append", update, "return [item] instead of item")


def _append(current: Any, update: Any) -> list[Any]:
    items = _append_items(update)
    return [*_list_current("append", current), *items]


def _flatten_items(update: Any) -> list[Any]:
    lists = _list_update("concat_flatten", update, "return a list of lists, e.g. [[a, b], [c]]")
    out: list[Any] = []
    for i, part in enumerate(lists):
        if not isinstance(part, (list, tuple)):
            raise TypeError(
                f"`concat_flatten` takes a list of lists, but item [{i}] is {_shown(part)}; "
                f"wrap it: [{part!r}], or use `append` for single items"
            )
        out.extend(part)
    return out


def _concat_flatten(current: Any, update: Any) -> list[Any]:
    items = _flatten_items(update)
    return [*_list_current("concat_flatten", current), *items]


def _merge(current: Any, update: Any) -> dict[Any, Any]:
    if not isinstance(update, Mapping):
        raise TypeError(
            f"`merge` takes a dict of keys to set, got {_shown(update)}; return "
            "{'key': value}, or use `merge_all` for a list of dicts"
        )
    return {**_dict_current("merge", current), **update}


def _merge_all(current: Any, update: Any) -> dict[Any, Any]:
    parts = _list_update("merge_all", update, "return a list of dicts, or use `merge` for one dict")
    out = _dict_current("merge_all", current)
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise TypeError(
                f"`merge_all` takes a list of dicts, but item [{i}] is {_shown(part)}; "
                "return a dict for each item"
            )
        out.update(part)
    return out


def _last_write_wins(current: Any, update: Any) -> Any:
    return update


#: Adds a node's update (a list) at the end of the field:
#: ``trace: Annotated[list[str], append] = []``; a node returns ``{"trace": ["node_a"]}``.
append = Reducer(_append, name="append", extends=_append_items)

#: Adds the items of each list of a node's update (a list of lists) at the end of the
#: field: ``{"hits": [["a", "b"], ["c"]]}`` adds ``"a", "b", "c"``.
concat_flatten = Reducer(_concat_flatten, name="concat_flatten", extends=_flatten_items)

#: Updates the field (a dict) with a node's update (a dict): keys it names are replaced,
#: the others kept.
merge = Reducer(_merge, name="merge")

#: Updates the field (a dict) with each dict of a node's update (a list of dicts), in
#: order: a later dict wins on a key both set.
merge_all = Reducer(_merge_all, name="merge_all")

#: The update replaces the field's value: what a field without a reducer does. Declare it
#: to say so explicitly.
last_write_wins = Reducer(_last_write_wins, name="last_write_wins")


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
        The new state, the fields set to a new value (last write wins, or a reducer without
        ``extends``), and the items each extending field (``append``...) gained.

    Raises:
        StateValidationError: an unknown field, or a new state that does not validate.
        ReducerError: a field's reducer refused the value (it names the field).
    """
    cls = type(state)
    unknown = sorted(k for k in update if k not in cls.model_fields)
    if unknown:
        raise StateValidationError(
            f"node {node!r} returned unknown field(s) {unknown} for {cls.__name__}; "
            f"its fields are {sorted(cls.model_fields)}",
            node_name=node,
            recoverable_state=state,
        )
    merged: dict[str, Any] = {}
    extend: dict[str, list[Any]] = {}
    for field, value in update.items():
        reducer = reducers.get(field)
        if reducer is None:
            merged[field] = value
            continue
        try:
            merged[field] = reducer(getattr(state, field), value)
            if reducer.extends is not None:
                extend[field] = list(reducer.extends(value))
        except Exception as exc:
            raise ReducerError(
                f"node {node!r}: the `{reducer.name}` reducer of field {field!r} of "
                f"{cls.__name__} refused the update: {exc}",
                node_name=node,
                field=field,
                reducer=reducer.name,
                recoverable_state=state,
            ) from exc
    try:
        new = cls.model_validate({**dict(state), **merged})
    except ValidationError as exc:
        raise StateValidationError(
            f"node {node!r} returned an update that does not validate: {exc}",
            node_name=node,
            recoverable_state=state,
        ) from exc
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
