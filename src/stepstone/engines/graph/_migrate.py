"""State schema migrations: pure ``dict -> dict`` edges, shortest chain by BFS."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from stepstone.engines.graph._state import State
from stepstone.exceptions import (
    CheckpointStateMigrationChainAmbiguous,
    CheckpointStateMigrationFailed,
    CheckpointStateMigrationMissing,
    GraphCompileError,
)

__all__ = ["Migrate", "MigrationRegistry"]

Migrate = Callable[[dict[str, Any]], dict[str, Any]]


class MigrationRegistry:
    """The migration edges of one state class (a graph's ``with_state_migration`` calls)."""

    def __init__(self, state_cls: type[State]) -> None:
        self.state_cls = state_cls
        self.edges: dict[str, dict[str, Migrate]] = {}

    def add(self, from_version: str, to_version: str, migrate: Migrate) -> None:
        """Register one edge; a duplicate or self edge is a compile error."""
        name = self.state_cls.__name__
        if not isinstance(from_version, str) or not isinstance(to_version, str):
            raise GraphCompileError(
                f"with_state_migration({from_version!r}, {to_version!r}, ...) on {name}: "
                "versions are strings such as 'v1'"
            )
        if from_version == to_version:
            raise GraphCompileError(
                f"with_state_migration({from_version!r}, {to_version!r}, ...) on {name} "
                "migrates a version to itself; give two different versions"
            )
        if not callable(migrate):
            raise GraphCompileError(
                f"with_state_migration({from_version!r}, {to_version!r}, migrate) on {name}: "
                f"migrate must be a function dict -> dict, got {migrate!r}"
            )
        targets = self.edges.setdefault(from_version, {})
        if to_version in targets:
            raise GraphCompileError(
                f"the migration {from_version!r} -> {to_version!r} of {name} is registered "
                "twice; keep one with_state_migration call per edge"
            )
        targets[to_version] = migrate

    def chain(self, from_version: str, to_version: str) -> list[tuple[str, str, Migrate]]:
        """The shortest chain of edges from ``from_version`` to ``to_version`` (BFS).

        Raises:
            CheckpointStateMigrationMissing: no chain exists.
            CheckpointStateMigrationChainAmbiguous: two different shortest chains exist.
        """
        name = self.state_cls.__name__
        # BFS that counts the shortest paths into each version, so ambiguity is detected
        # exactly (two equally short chains), not by the order edges were registered in.
        depth = {from_version: 0}
        count = {from_version: 1}
        parent: dict[str, str] = {}
        queue = deque([from_version])
        while queue:
            v = queue.popleft()
            for w in self.edges.get(v, {}):
                if w not in depth:
                    depth[w] = depth[v] + 1
                    count[w] = count[v]
                    parent[w] = v
                    queue.append(w)
                elif depth[w] == depth[v] + 1:
                    count[w] += count[v]
        if to_version not in depth:
            known = sorted(f"{a}->{b}" for a, bs in self.edges.items() for b in bs)
            raise CheckpointStateMigrationMissing(
                f"no migration chain from schema_version {from_version!r} to {to_version!r} "
                f"for {name} (registered edges: {known or 'none'}); register one with "
                f"GraphBuilder(...).with_state_migration({from_version!r}, ..., migrate)",
                from_version=from_version,
                to_version=to_version,
            )
        if count[to_version] > 1:
            raise CheckpointStateMigrationChainAmbiguous(
                f"{count[to_version]} different shortest migration chains lead from "
                f"{from_version!r} to {to_version!r} for {name}; remove an edge so that "
                "one chain is the shortest",
                from_version=from_version,
                to_version=to_version,
            )
        path = [to_version]
        while path[-1] != from_version:
            path.append(parent[path[-1]])
        path.reverse()
        return [(a, b, self.edges[a][b]) for a, b in itertools.pairwise(path)]

    def migrate(self, data: Mapping[str, Any], from_version: str, *, where: str) -> State:
        """Validate saved ``data`` (at ``from_version``) as the current state class,
        migrating it first when the versions differ and the class opts in."""
        cls = self.state_cls
        target = cls.schema_version
        current: dict[str, Any] = dict(data)
        if target and from_version != target:
            for a, b, fn in self.chain(from_version, target):
                try:
                    out = fn(dict(current))
                except Exception as exc:
                    raise CheckpointStateMigrationFailed(
                        f"migration {a!r} -> {b!r} of {cls.__name__} raised "
                        f"{type(exc).__name__}: {exc} (loading {where}); fix the migration "
                        "function, the saved record is unchanged",
                        from_version=from_version,
                        to_version=target,
                    ) from exc
                if not isinstance(out, dict):
                    raise CheckpointStateMigrationFailed(
                        f"migration {a!r} -> {b!r} of {cls.__name__} returned "
                        f"{type(out).__name__}, not a dict (loading {where}); return the "
                        "state dict at the new version, e.g. {**state, 'new_field': ''}",
                        from_version=from_version,
                        to_version=target,
                    )
                current = out
            try:
                return cls.model_validate(current)
            except ValidationError as exc:
                raise CheckpointStateMigrationFailed(
                    f"the state migrated from {from_version!r} to {target!r} does not "
                    f"validate as {cls.__name__} (loading {where}): {exc}; make the last "
                    "migration fill every new required field",
                    from_version=from_version,
                    to_version=target,
                ) from exc
        return cls.model_validate(current)
