"""What ``POST /runs`` may start: a registered name, or an import path under the server's
import paths. Nothing is imported from anywhere else: a request naming ``os:system`` is
refused before any import, whatever Python's path holds."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stepstone.durable._queue import resolve_target
from stepstone.exceptions import UserError

__all__ = ["TargetError", "Targets"]


class TargetError(UserError):
    """A target the server will not start (the message names it and the fix)."""


def _under(paths: Iterable[str | None], roots: Sequence[Path]) -> bool:
    """Whether every one of ``paths`` (files or folders) lies under one of ``roots``."""
    found = [p for p in paths if p]
    if not found:
        return False
    for raw in found:
        where = Path(raw).resolve()
        if not any(where == root or root in where.parents for root in roots):
            return False
    return True


class Targets:
    """Resolves targets for the server.

    Args:
        import_paths: The folders modules may be imported from (put first on
            ``sys.path``, as ``stepstone worker --import-path`` does).
        registry: Targets by name, looked up first.
    """

    def __init__(self, import_paths: Sequence[Path], registry: Mapping[str, Any]) -> None:
        self.roots = [Path(p).resolve() for p in import_paths]
        self.registry = dict(registry)
        for root in reversed(self.roots):
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))

    def _check_module(self, target: str, mod_name: str) -> None:
        """Refuse ``mod_name`` unless it and each package above it live under the import
        paths (a package is imported to find its submodules: it must be allowed too)."""
        parts = mod_name.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            module = sys.modules.get(name)
            if module is not None:
                spec = getattr(module, "__spec__", None)
                places = [getattr(module, "__file__", None)]
                places += list(getattr(module, "__path__", None) or [])
                origin = None if spec is None else spec.origin
                places.append(origin if origin not in ("built-in", "frozen") else None)
            else:
                try:
                    spec = importlib.util.find_spec(name)
                except (ImportError, ValueError):
                    spec = None
                if spec is None:
                    raise TargetError(
                        f"target {target!r}: no module {name!r} under the server's import "
                        f"paths ({self._roots()}); check the name, or start the server with "
                        "--import-path DIR"
                    )
                places = [spec.origin if spec.origin not in ("built-in", "frozen") else None]
                places += list(spec.submodule_search_locations or [])
            if not _under(places, self.roots):
                raise TargetError(
                    f"target {target!r}: module {name!r} is not under the server's import "
                    f"paths ({self._roots()}); the server imports nothing else (register "
                    "it, or pass --import-path DIR)"
                )

    def _roots(self) -> str:
        return ", ".join(str(r) for r in self.roots) or "none"

    def resolve(self, target: Any) -> Any:
        """The object ``target`` names.

        Raises:
            TargetError: not a name, not registered and not under the import paths, or
                its module fails to import (the message says which).
        """
        if not isinstance(target, str) or not target:
            raise TargetError(
                f"target must be a registered name or an import path 'package.module:name', "
                f"got {target!r:.80}"
            )
        if target in self.registry:
            return self.registry[target]
        mod_name, colon, attr = target.partition(":")
        names = [*mod_name.split("."), *attr.split(".")]
        if not colon or not all(part.isidentifier() for part in names):
            raise TargetError(
                f"target {target!r} is neither registered nor an import path; write it as "
                "'package.module:name'"
            )
        self._check_module(target, mod_name)
        try:
            obj = resolve_target(target)
        except UserError as exc:
            raise TargetError(str(exc)) from None
        self._check_reached(target, mod_name, attr)
        return obj

    def _check_reached(self, target: str, mod_name: str, attr: str) -> None:
        """Refuse a target whose attribute path goes through a module the target's module
        imported (``app:os.system``), or that names a function, class or workflow defined
        in a module outside the import paths (``app:helper`` after ``from lib import
        helper``): the server runs only code that lives under its import paths."""
        obj: Any = sys.modules[mod_name]
        for part in attr.split("."):
            obj = getattr(obj, part)
            if isinstance(obj, types.ModuleType) and not self._module_under(obj):
                raise TargetError(
                    f"target {target!r} reaches module {obj.__name__!r}, which is not under "
                    f"the server's import paths ({self._roots()}); name a target defined "
                    "under them, or register it"
                )
        for code in (obj, getattr(obj, "fn", None), getattr(obj, "__wrapped__", None)):
            if not (inspect.isfunction(code) or inspect.isclass(code)):
                continue
            home = sys.modules.get(getattr(code, "__module__", "") or "")
            if home is None or not self._module_under(home):
                raise TargetError(
                    f"target {target!r} is defined in module {code.__module__!r}, which is "
                    f"not under the server's import paths ({self._roots()}); the server "
                    "runs only code that lives under them (register it, or pass "
                    "--import-path DIR)"
                )

    def _module_under(self, module: types.ModuleType) -> bool:
        places = [getattr(module, "__file__", None), *(getattr(module, "__path__", None) or [])]
        return _under(places, self.roots)
