"""GraphBuilder: declare nodes, edges, checkpointer and migrations; compile() validates."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from stepstone.core import is_agent_like
from stepstone.engines.graph._migrate import Migrate, MigrationRegistry
from stepstone.engines.graph._observe import Observer, check_observers
from stepstone.engines.graph._protocol import Checkpointer, check_checkpointer
from stepstone.engines.graph._state import State
from stepstone.exceptions import GraphCompileError

if TYPE_CHECKING:
    from stepstone.engines.graph._compiled import CompiledGraph

__all__ = ["END", "EdgeSpec", "GraphBuilder", "NodeSpec"]

S = TypeVar("S", bound=State)


class _End:
    """The end of a graph: ``add_edge("last", END)``; a router may return it."""

    _instance: _End | None = None

    def __new__(cls) -> _End:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "END"

    def __reduce__(self) -> str:
        return "END"


#: The end of a graph: ``add_edge("draft_timeline", END)``; routers may return it.
END: Any = _End()
_END_NAME = "__end__"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FanSpec:
    """What a fan-out node maps over and how (engine-internal)."""

    over: str
    into: str | None
    concurrency: int | None
    fn: Any = None  # fn(item) or fn(item, state) (with_state)
    with_state: bool = False
    agent: Any = None
    subgraph: CompiledGraph[Any] | None = None
    inputs: Callable[[Any, Any], Any] | None = None
    outputs: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One node (engine-internal)."""

    name: str
    fn: Any = None
    agent: Any = None
    writes: str | None = None
    subgraph: CompiledGraph[Any] | None = None
    inputs: Callable[[Any], Any] | None = None
    outputs: Callable[[Any], Mapping[str, Any]] | None = None
    fan: FanSpec | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EdgeSpec:
    """A node's outgoing edge: a fixed target or a router (engine-internal)."""

    target: str | None = None
    router: Callable[[Any], Any] | None = None
    targets: Mapping[str, str] | None = None


def _takes_state(fn: Callable[..., Any], where: str) -> bool:
    """Whether a branch function takes ``(item, state)``: two required parameters. One
    (or none but ``*args``) takes the item alone."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: give it the item
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    takes_any = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params) or any(
        p.kind in positional for p in params
    )
    if len(required) > 2 or not takes_any:
        raise GraphCompileError(
            f"{where}: a branch function takes (item) or (item, state), got {fn!r} with "
            f"{len(required)} required argument(s)"
        )
    return len(required) == 2


def _target_name(target: Any, where: str) -> str:
    if target is END:
        return _END_NAME
    if not isinstance(target, str) or not target:
        raise GraphCompileError(f"{where}: a target is a node name or END, got {target!r}")
    return target


class GraphBuilder(Generic[S]):
    """Builds a typed-state graph: nodes, edges, a checkpointer, state migrations.

    Every method returns the builder, so calls chain; :meth:`compile` validates the whole
    graph and returns a runnable :class:`CompiledGraph`.

    Args:
        state_cls: The graph's :class:`State` subclass.

    Example::

        graph = (
            GraphBuilder(Mission)
            .add_node("define_objective", define_objective)
            .add_node("size_crew", size_crew)
            .add_edge("define_objective", "size_crew")
            .add_edge("size_crew", END)
            .set_entry("define_objective")
            .with_checkpointer(SQLiteCheckpointer("checkpoints.sqlite"))
            .compile()
        )
        final = graph.invoke(Mission(destination="Lunar South Pole"), correlation_id="m-1")
    """

    def __init__(self, state_cls: type[S]) -> None:
        if not (isinstance(state_cls, type) and issubclass(state_cls, State)):
            raise GraphCompileError(
                f"GraphBuilder takes a State subclass, got {state_cls!r}; declare "
                "`class MyState(State): ...` with your fields"
            )
        self.state_cls = state_cls
        self._nodes: dict[str, NodeSpec] = {}
        self._edges: dict[str, list[EdgeSpec]] = {}
        self._entry: str | None = None
        self._checkpointer: Checkpointer | None = None
        self._migrations = MigrationRegistry(state_cls)
        self._observers: list[Observer] = []

    def _add(self, spec: NodeSpec) -> GraphBuilder[S]:
        if not isinstance(spec.name, str) or not spec.name or spec.name == _END_NAME:
            raise GraphCompileError(
                f"node names are non-empty strings other than {_END_NAME!r}, got {spec.name!r}"
            )
        if "#" in spec.name:
            raise GraphCompileError(f"node name {spec.name!r} must not contain '#'")
        if spec.name in self._nodes:
            raise GraphCompileError(
                f"node {spec.name!r} is added twice; give the second one another name"
            )
        self._nodes[spec.name] = spec
        return self

    def add_node(
        self, name: str, fn: Callable[..., Any] | Any, *, writes: str | None = None
    ) -> GraphBuilder[S]:
        """Add a node.

        Args:
            name: The node's name (its identity in edges, positions and errors).
            fn: ``fn(state) -> dict | None``, sync or async, returning the fields to update;
                or a stepstone ``Agent``: it is run with the state as JSON text as its task,
                and its payload (a dict or pydantic model of fields) is the update.
            writes: For an Agent whose answer is text: the field the text goes to.
        """
        if is_agent_like(fn):
            return self._add(NodeSpec(name=name, agent=fn, writes=writes))
        if not callable(fn):
            raise GraphCompileError(
                f"node {name!r}: expected a function state -> dict (or an Agent), got {fn!r}"
            )
        if writes is not None:
            raise GraphCompileError(
                f"node {name!r}: writes= is for Agent nodes; a function returns "
                f"{{{writes!r}: value}} itself"
            )
        return self._add(NodeSpec(name=name, fn=fn))

    def add_subgraph_node(
        self,
        name: str,
        subgraph: CompiledGraph[Any],
        *,
        inputs: Callable[[S], Any] | None = None,
        outputs: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> GraphBuilder[S]:
        """Add a node that runs a compiled graph with its own state class.

        The parent's checkpointer saves after every node inside the subgraph too; a crash
        inside it resumes inside it. The subgraph's own checkpointer, if any, is not used.

        Args:
            name: The node's name (the subgraph's namespace in positions).
            subgraph: ``GraphBuilder(SubState)...compile()``.
            inputs: ``inputs(parent_state)`` gives the subgraph's initial state (a dict or
                a SubState). Default: the parent's fields that the subgraph state has.
            outputs: ``outputs(final_sub_state)`` gives the parent's update. Default: the
                shared fields the subgraph changed (items it appended, for ``append``
                fields of the parent).

        Raises:
            GraphCompileError: ``subgraph`` is not a compiled graph, or ``inputs`` or
                ``outputs`` is neither a function nor None.
        """
        from stepstone.engines.graph._compiled import CompiledGraph

        if not isinstance(subgraph, CompiledGraph):
            raise GraphCompileError(
                f"subgraph node {name!r} takes a compiled graph "
                f"(GraphBuilder(SubState)...compile()), got {subgraph!r}"
            )
        # Called only when the node runs: a value that is not a function would fail there.
        sub = subgraph.state_cls.__name__
        for option, value, expected in (
            ("inputs", inputs, f"parent_state -> the initial {sub} (a dict, or a {sub} instance)"),
            ("outputs", outputs, f"final {sub} -> the parent's update (a dict of fields)"),
        ):
            if value is not None and not callable(value):
                raise GraphCompileError(
                    f"subgraph node {name!r}: {option}= is a function {expected}, or None "
                    f"for the default, got {value!r}; pass e.g. {option}=lambda s: {{...}}"
                )
        return self._add(NodeSpec(name=name, subgraph=subgraph, inputs=inputs, outputs=outputs))

    def add_fan_out_node(
        self,
        name: str,
        branch: Callable[..., Any] | Any,
        *,
        over: str,
        into: str | None = None,
        concurrency: int | None = None,
        inputs: Callable[[Any, S], Any] | None = None,
        outputs: Callable[[Any], Any] | None = None,
    ) -> GraphBuilder[S]:
        """Add a node that runs ``branch`` once per item of the list field ``over``, the
        branches in parallel (at most ``concurrency`` at once), and merges what they return.

        Each finished branch is checkpointed with its result; a resume runs only the
        branches that have none. The results are merged in the list's order, whatever
        order the branches finished in.

        Args:
            name: The node's name.
            branch: ``fn(item)`` or ``fn(item, state)``, sync or async; an ``Agent`` (its
                task is the item, as JSON unless it is text); or a compiled graph, run
                once per item from ``inputs(item, state)`` (default: the item itself, a
                dict of the subgraph's fields).
            over: The state field holding the list of items.
            into: A field that gets the list of the branches' results, in item order,
                through that field's reducer (``append`` adds them, ``concat_flatten``
                their items, ``merge_all`` merges dicts). Without it, each branch returns
                a dict of field updates, applied one after another in item order through
                the fields' reducers.
            concurrency: At most this many branches at once (None: all).
            inputs: For a subgraph branch: ``inputs(item, state)`` gives its initial
                state (a dict or an instance).
            outputs: For a subgraph branch: ``outputs(final)`` gives its result. Default:
                with ``into``, the final state; without, what it changed in the fields
                it shares with this graph (as :meth:`add_subgraph_node` hands back).

        Raises:
            GraphCompileError: ``over`` or ``into`` is not a field of the state,
                ``concurrency`` is not a positive int, ``branch`` is not a function, an
                Agent or a compiled graph, or ``inputs``/``outputs`` is given for a branch
                that is not a subgraph (or is not a function).
        """
        where = f"fan-out node {name!r}"
        self._check_fan_fields(where, over, into)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise GraphCompileError(
                f"{where}: concurrency is a positive int (branches at once) or None for all "
                f"at once, got {concurrency!r}"
            )
        kind = _fan_branch(where, branch, inputs, outputs)
        fan = FanSpec(over=over, into=into, concurrency=concurrency, **kind)
        return self._add(NodeSpec(name=name, fan=fan))

    def _check_fan_fields(self, where: str, over: str, into: str | None) -> None:
        fields = self.state_cls.model_fields
        for option, named in (("over", over), ("into", into)):
            if named is None and option == "into":
                continue
            if not isinstance(named, str) or named not in fields:
                raise GraphCompileError(
                    f"{where}: {option}= names a field of {self.state_cls.__name__}, got "
                    f"{named!r}; its fields are {sorted(fields)}"
                )

    def add_edge(self, source: str, target: str | Any) -> GraphBuilder[S]:
        """After ``source`` completes, run ``target`` (a node name, or ``END``)."""
        self._edges.setdefault(source, []).append(
            EdgeSpec(target=_target_name(target, f"add_edge({source!r}, {target!r})"))
        )
        return self

    def add_conditional_edge(
        self,
        source: str,
        router: Callable[[S], Any],
        targets: Sequence[str | Any] | Mapping[str, str | Any] | None = None,
    ) -> GraphBuilder[S]:
        """After ``source`` completes, run the node ``router(state)`` names.

        Args:
            source: The node the edge leaves.
            router: ``router(state) -> node name | END`` (or a key of ``targets`` when it
                is a mapping). A pure function of the state: it is re-evaluated on resume.
            targets: The possible targets (checked at compile time and at run time), as a
                list of names, or a mapping from the router's return values to names.

        Raises:
            GraphCompileError: ``router`` is not callable, or ``targets`` is not a
                non-empty list or mapping of node names (a string is refused, not read as
                a list of letters).
        """
        where = f"add_conditional_edge({source!r}, ...)"
        if not callable(router):
            raise GraphCompileError(f"{where}: router must be a function state -> node name")
        mapping: dict[str, str] | None = None
        if isinstance(targets, Mapping):
            mapping = {str(k): _target_name(v, where) for k, v in targets.items()}
        elif targets is not None:
            if isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
                raise GraphCompileError(
                    f"{where}: targets is a list of node names (or END), or a mapping from "
                    f"the router's return values to node names, got {targets!r}; for one "
                    "target pass a list, e.g. targets=['next_node', END]"
                )
            mapping = {}
            for t in targets:
                name = _target_name(t, where)
                mapping[name] = name
        if mapping == {}:
            raise GraphCompileError(
                f"{where}: targets is empty; list the nodes the router may return, or omit "
                "targets= to allow every node"
            )
        self._edges.setdefault(source, []).append(EdgeSpec(router=router, targets=mapping))
        return self

    def set_entry(self, name: str) -> GraphBuilder[S]:
        """The first node of every fresh invoke."""
        self._entry = name
        return self

    def with_checkpointer(self, checkpointer: Checkpointer) -> GraphBuilder[S]:
        """Save a record after every completed node (outermost and inside subgraphs) and
        every finished fan-out branch, before the next one starts.

        Args:
            checkpointer: A built-in one (``SQLiteCheckpointer``, ``InMemoryCheckpointer``,
                ``StoreCheckpointer``), or one of your own: a
                :class:`~stepstone.graph.Checkpointer` (``save``, ``load``, ``list``,
                ``delete`` and their async forms).
        """
        self._checkpointer = check_checkpointer(checkpointer)
        return self

    def with_observer(self, observer: Observer) -> GraphBuilder[S]:
        """Tell ``observer(event)`` (sync or async) of every invoke of the graph: each node's
        start and end, each checkpoint saved, and the run's end (a
        :class:`~stepstone.graph.GraphEvent`). It runs beside the graph, never holds a node
        up, and what it raises is logged and dropped: it cannot change a run's outcome.
        ``invoke(observers=[...])`` adds observers for one invoke."""
        self._observers.extend(check_observers([observer], "with_observer"))
        return self

    def with_state_migration(
        self, from_version: str, to_version: str, migrate: Migrate
    ) -> GraphBuilder[S]:
        """Register one migration edge of the state class's schema.

        ``migrate`` is pure: it takes the saved state as a plain dict and returns the dict
        at ``to_version`` (typically ``{**state, "new_field": default}``). When a record's
        ``schema_version`` differs from the class's, the shortest chain of edges (BFS) is
        applied once, on load; the saved record is not rewritten.
        """
        self._migrations.add(from_version, to_version, migrate)
        return self

    # -- compile -------------------------------------------------------------------------
    def compile(self) -> CompiledGraph[S]:
        """Validate and freeze the graph.

        Raises:
            GraphCompileError: no or unknown entry, an edge naming an unknown node, a node
                without (or with two) outgoing edges, an unreachable node, a migration
                on a state class without ``schema_version``, or pickle + migrations. The
                message names the node and the fix.
        """
        from stepstone.engines.graph import _checks
        from stepstone.engines.graph._compiled import CompiledGraph

        entry = _checks.check_entry(self.state_cls.__name__, self._nodes, self._entry)
        edges = _checks.check_edges(self._nodes, self._edges)
        _checks.check_every_node_leaves(self._nodes, edges)
        _checks.check_reachable(self._nodes, edges, entry)
        _checks.check_migrations(self.state_cls, self._migrations, self._checkpointer)
        _checks.check_subgraph_inputs(self.state_cls, self._nodes)
        return CompiledGraph(
            state_cls=self.state_cls,
            nodes=dict(self._nodes),
            edges=edges,
            entry=entry,
            checkpointer=self._checkpointer,
            migrations=self._migrations,
            observers=tuple(self._observers),
        )


def _fan_branch(
    where: str,
    branch: Callable[..., Any] | Any,
    inputs: Callable[..., Any] | None,
    outputs: Callable[..., Any] | None,
) -> dict[str, Any]:
    """The FanSpec fields of a fan-out node's branch: a subgraph, an Agent or a function."""
    from stepstone.engines.graph._compiled import CompiledGraph

    for option, value in (("inputs", inputs), ("outputs", outputs)):
        if value is not None and not isinstance(branch, CompiledGraph):
            raise GraphCompileError(
                f"{where}: {option}= is for a branch that is a compiled graph; a function "
                "branch takes the item (and the state) and returns its result itself"
            )
        if value is not None and not callable(value):
            raise GraphCompileError(
                f"{where}: {option}= is a function, got {value!r}; pass e.g. "
                f"{option}=lambda {'item, state' if option == 'inputs' else 'final'}: ..."
            )
    if isinstance(branch, CompiledGraph):
        return {"subgraph": branch, "inputs": inputs, "outputs": outputs}
    if is_agent_like(branch):
        return {"agent": branch}
    if callable(branch):
        return {"fn": branch, "with_state": _takes_state(branch, where)}
    raise GraphCompileError(
        f"{where}: the branch is a function fn(item) or fn(item, state), an Agent, "
        f"or a compiled graph, got {branch!r}"
    )
