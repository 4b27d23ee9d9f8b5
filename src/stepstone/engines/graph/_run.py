"""One invoke in progress: its sink, positions and observers, and how it saves."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from stepstone.durable._effects import DurableScope
from stepstone.engines.graph._observe import EventKind, GraphEvent, Observer, Observers
from stepstone.engines.graph._records import FanOutAt, Frame, NodePosition
from stepstone.engines.graph._sink import Sink
from stepstone.engines.graph._state import Patch, State, dump_state, json_patch, object_patch
from stepstone.exceptions import CheckpointSaveFailed, ConcurrentRunError, RunCancelledError

__all__ = ["GraphRun"]


@dataclasses.dataclass(slots=True, kw_only=True)
class GraphRun:
    """One invoke: where it saves (None without a checkpointer) and its positions.

    A fan-out branch that is a subgraph runs its nodes in a copy with ``branch`` set: that
    copy saves nothing (the branch's result is saved when it finishes) and keys the LLM
    loops of its nodes by the branch.
    """

    sink: Sink | None
    invocation_id: str
    correlation_id: str
    attempt: int
    positions: list[NodePosition]
    observers: Observers
    pending_push: list[Frame] = dataclasses.field(default_factory=list)
    branch: tuple[FanOutAt, int] | None = None
    #: The finished branches of the fan-outs a resumed record carried: index -> result.
    fan_done: dict[FanOutAt, dict[int, Any]] = dataclasses.field(default_factory=dict)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    @property
    def saves(self) -> bool:
        """Whether completed nodes are saved (a checkpointer, outside fan-out branches)."""
        return self.sink is not None and self.branch is None

    def for_branch(self, at: FanOutAt, index: int) -> GraphRun:
        """The run a subgraph branch's nodes go through (see the class docstring)."""
        return dataclasses.replace(
            self, positions=list(self.positions), pending_push=[], branch=(at, index)
        )

    def emit(self, kind: EventKind, extra: tuple[Observer, ...] = (), **fields: Any) -> None:
        """Tell the observers (no event is made when there are none)."""
        if self.observers or extra:
            if self.branch is not None and "branch" not in fields:
                fields["branch"] = self.branch[1]
            event = GraphEvent(
                kind=kind,
                invocation_id=self.invocation_id,
                correlation_id=self.correlation_id,
                attempt_index=self.attempt,
                **fields,
            )
            self.observers.emit(event, extra)

    def next_step(self, ns: tuple[str, ...]) -> int:
        steps = [p.step for p in self.positions if p.namespace == ns]
        return max(steps) + 1 if steps else 0

    @property
    def pickled(self) -> bool:
        return self.sink is not None and self.sink.codec.serialization == "pickle"

    def state_out(self, state: State | None) -> Any:
        """A state as a record holds it: itself when pickled, else its JSON form."""
        if state is None:
            return None
        return state if self.pickled else dump_state(state)

    def patch(self, new: State, set_fields: list[str], extend: dict[str, list[Any]]) -> Patch:
        if self.pickled:
            return object_patch(new, set_fields, extend)
        return json_patch(new, set_fields, extend, f"node update of {type(new).__name__}")

    def scope(self, ns: tuple[str, ...], node: str, step: int) -> DurableScope | None:
        """An LLM loop inside this node visit journals under a key of its position."""
        sink = self.sink
        if sink is None or sink.store is None or sink.origin is None:
            return None
        # The chain's origin, not the invocation id: a resume is a new invocation of the
        # same chain and must find the same loop at the same node position; a fresh
        # invocation starts a chain of its own, even under the same correlation id.
        where = "/".join((*ns, node))
        if self.branch is not None:
            (fan_ns, fan_node, fan_step), index = self.branch
            where = f"{'/'.join((*fan_ns, fan_node))}:{fan_step}[{index}]/{where}"
        return DurableScope(
            store=sink.store,
            key=f"graph:{sink.origin}:{where}:{step}",
            address=self.correlation_id,  # a node's messages, events and streams
        )

    async def save(self, pos: NodePosition, patch: Patch, pop: int, next_node: str | None) -> None:
        """Save one completed node (a journal: head + row, one transaction)."""
        if self.saves:
            async with self.lock:
                push, self.pending_push = self.pending_push, []
                plain = {"pos": pos.to_json(), "pop": pop, "push": [f.to_plain() for f in push]}
                body = {"patch": patch, "push": [f.to_body() for f in push]}
                await self._commit(
                    "node", pos.node_name, plain, body, next_node, len(self.positions) + 1
                )
        self.pending_push.clear()
        self.positions.append(pos)

    async def save_branch(self, at: FanOutAt, index: int, result: Any) -> None:
        """Save one finished fan-out branch's result (its fan-out node is still running)."""
        if not self.saves:
            return
        async with self.lock:
            push, self.pending_push = self.pending_push, []
            plain = {
                "fan": [list(at[0]), at[1], at[2]],
                "index": index,
                "push": [f.to_plain() for f in push],
            }
            body = {"result": result, "push": [f.to_body() for f in push]}
            await self._commit("branch", at[1], plain, body, at[1], len(self.positions))

    async def _commit(
        self,
        kind: str,
        node: str,
        plain: dict[str, Any],
        body: dict[str, Any],
        next_node: str | None,
        iteration: int,
    ) -> None:
        assert self.sink is not None
        try:
            data = self.sink.codec.encode(plain, body)
            await self.sink.commit(kind, node, data, next_node, iteration)
        except (ConcurrentRunError, RunCancelledError):
            raise  # ownership: the run is someone else's, or an operator stopped it
        except Exception as exc:
            what = f"node {node!r}" if kind == "node" else f"a branch of fan-out node {node!r}"
            raise CheckpointSaveFailed(
                f"invocation {self.invocation_id!r}: the checkpoint after {what} could not "
                f"be saved ({type(exc).__name__}: {exc}); what it did is not in the record, "
                f"so resuming runs it again: invoke(resume_invocation={self.invocation_id!r})",
                invocation_id=self.invocation_id,
                node_name=node,
            ) from exc
