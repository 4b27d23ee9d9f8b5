"""Arguments and results of workflows and steps through the typed JSON codec.

A call's arguments are recorded as one JSON value: a list of the positional arguments, or
``{"args": [...], "kwargs": {...}}`` when it has keyword arguments. Each value is tagged
JSON (:func:`~stepstone.core.to_typed_json`), so pydantic models, dataclasses, datetimes
and the other types the codec tags come back as themselves; a value the codec cannot hold
is a :class:`~stepstone.exceptions.SerializationError` naming the call and the argument,
never a silent ``str()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from stepstone.core._serialization import from_typed_json, to_typed_json
from stepstone.exceptions import SerializationError

__all__ = ["decode_args", "decode_value", "encode_args", "encode_value"]

#: Values that are their own JSON (a float may not be: NaN and the infinities are tagged).
_PLAIN = frozenset({str, int, bool, type(None)})


def encode_args(
    what: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The JSON value that records a call of ``fn`` (``what``: ``"step 'charge'"``).

    Raises:
        SerializationError: an argument the codec cannot hold, named by its parameter.
    """
    plain = _PLAIN
    if not kwargs and all(type(a) in plain for a in args):
        return list(args)
    try:
        positional = to_typed_json(list(args), strict=True)
        if not kwargs:
            return positional
        return {"args": positional, "kwargs": to_typed_json(kwargs, strict=True)}
    except SerializationError:
        pass
    names = _parameter_names(fn, args, kwargs)
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else f"#{i}"
        _strict(value, f"{what} argument {name!r}")
    for name, value in kwargs.items():
        _strict(value, f"{what} argument {name!r}")
    raise SerializationError(f"{what}: its arguments cannot be stored")  # pragma: no cover


def _strict(value: Any, where: str) -> None:
    try:
        to_typed_json(value, strict=True, where=where)
    except SerializationError as exc:
        raise SerializationError(
            f"{exc} Arguments of steps and workflows are journaled so a resume can check "
            "and replay them: pass data (an id, a model, a dataclass), not a live object"
        ) from None


def _parameter_names(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            names.extend(f"{p.name}[{i}]" for i in range(len(args) - len(names)))
    return names


def decode_args(data: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments :func:`encode_args` recorded."""
    if isinstance(data, dict):
        args, kwargs = data.get("args", []), data.get("kwargs", {})
    else:
        args, kwargs = data, {}
    return tuple(from_typed_json(args)), dict(from_typed_json(kwargs))


def decode_value(data: Any) -> Any:
    """A value :func:`encode_value` recorded."""
    if type(data) in _PLAIN:
        return data
    return from_typed_json(data)


def encode_value(what: str, value: Any) -> Any:
    """``value`` (a step's or workflow's return value) as tagged JSON.

    Raises:
        SerializationError: the codec cannot hold it (the message names ``what``).
    """
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    try:
        return to_typed_json(value, strict=True, where=f"the return value of {what}")
    except SerializationError as exc:
        raise SerializationError(
            f"{exc} A step's or workflow's return value is journaled so a resume can replay "
            "it: return data (a dict, a model, a dataclass), not a live object"
        ) from None
