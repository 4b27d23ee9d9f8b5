"""The checks ``GraphBuilder.compile`` runs, one named function each, in order.

Each raises :class:`GraphCompileError` naming the node and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stepstone.engines.graph._builder import _END_NAME, EdgeSpec, NodeSpec
from stepstone.engines.graph._migrate import MigrationRegistry
from stepstone.engines.graph._protocol import Checkpointer
from stepstone.engines.graph._state import State
from stepstone.exceptions import GraphCompileError

__all__ = [
    "check_edges",
    "check_entry",
    "check_every_node_leaves",
    "check_migrations",
    "check_reachable",
    "check_subgraph_inputs",
]


def check_entry(cls: str, nodes: Mapping[str, NodeSpec], entry: str | None) -> str:
    """The graph has nodes and an entry that is one of them; returns the entry."""
    if not nodes:
        raise GraphCompileError(f"graph of {cls} has no nodes; add one with add_node()")
    if entry is None:
        first = next(iter(nodes))
        raise GraphCompileError(
            f"graph of {cls} has no entry node; call set_entry({first!r}) (or the node "
            "that should run first)"
        )
    if entry not in nodes:
        raise GraphCompileError(
            f"entry node {entry!r} is not a node of the graph; add it with "
            f"add_node({entry!r}, fn) or fix set_entry() (nodes: {sorted(nodes)})"
        )
    return entry


def check_edges(
    nodes: Mapping[str, NodeSpec], declared: Mapping[str, Sequence[EdgeSpec]]
) -> dict[str, EdgeSpec]:
    """Every edge leaves a node, once, towards nodes or END; returns each node's edge."""
    edges: dict[str, EdgeSpec] = {}
    for source, specs in declared.items():
        if source == _END_NAME:
            raise GraphCompileError("END has no outgoing edges; remove add_edge(END, ...)")
        if source not in nodes:
            raise GraphCompileError(
                f"an edge leaves {source!r}, which is not a node; add it with "
                f"add_node({source!r}, fn) or fix the edge (nodes: {sorted(nodes)})"
            )
        if len(specs) > 1:
            raise GraphCompileError(
                f"node {source!r} has {len(specs)} outgoing edges; a node has exactly one "
                "(use add_conditional_edge to choose between targets)"
            )
        spec = specs[0]
        named = [spec.target] if spec.target else list((spec.targets or {}).values())
        for target in named:
            if target != _END_NAME and target not in nodes:
                raise GraphCompileError(
                    f"edge {source!r} -> {target!r}: {target!r} is not a node; add it "
                    f"with add_node({target!r}, fn), or use END to finish"
                )
        edges[source] = spec
    return edges


def check_every_node_leaves(nodes: Mapping[str, NodeSpec], edges: Mapping[str, EdgeSpec]) -> None:
    """Every node has an outgoing edge."""
    for name in nodes:
        if name not in edges:
            raise GraphCompileError(
                f"node {name!r} has no outgoing edge; add add_edge({name!r}, END) or an "
                "edge to the next node"
            )


def check_reachable(
    nodes: Mapping[str, NodeSpec], edges: Mapping[str, EdgeSpec], entry: str
) -> None:
    """Every node can be reached from the entry (a router without targets reaches all)."""
    reachable = {entry}
    todo = [entry]
    while todo:
        spec = edges[todo.pop()]
        nxt = (
            [spec.target]
            if spec.target
            else (list(spec.targets.values()) if spec.targets else list(nodes))
        )
        for t in nxt:
            if t != _END_NAME and t not in reachable:
                reachable.add(t)
                todo.append(t)
    unreachable = [n for n in nodes if n not in reachable]
    if unreachable:
        raise GraphCompileError(
            f"node {unreachable[0]!r} cannot be reached from entry {entry!r}; add "
            "an edge to it or remove it"
        )


def check_migrations(
    state_cls: type[State],
    migrations: MigrationRegistry,
    checkpointer: Checkpointer | None,
) -> None:
    """Migrations need a ``schema_version`` and a JSON checkpointer."""
    cls = state_cls.__name__
    if migrations.edges and not state_cls.schema_version:
        raise GraphCompileError(
            f"{cls} registers state migrations but has no schema_version; declare "
            f'`schema_version: ClassVar[str] = "v2"` on {cls}'
        )
    pickled = getattr(checkpointer, "serialization", "json") == "pickle"
    if migrations.edges and checkpointer is not None and pickled:
        raise GraphCompileError(
            f"the graph of {cls} registers state migrations but its checkpointer uses "
            "serialization='pickle', which cannot be migrated; use serialization='json'"
        )


def check_subgraph_inputs(state_cls: type[State], nodes: Mapping[str, NodeSpec]) -> None:
    """A subgraph without ``inputs=`` gets every field it requires from the parent state."""
    for node in nodes.values():
        if node.subgraph is not None and node.inputs is None:
            sub_cls = node.subgraph.state_cls
            missing = [
                f
                for f, info in sub_cls.model_fields.items()
                if info.is_required() and f not in state_cls.model_fields
            ]
            if missing:
                raise GraphCompileError(
                    f"subgraph node {node.name!r}: {sub_cls.__name__} requires "
                    f"{missing}, which {state_cls.__name__} does not have; pass "
                    "inputs=lambda state: {...} to build the subgraph's state"
                )
