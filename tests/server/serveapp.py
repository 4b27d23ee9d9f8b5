"""Targets the server tests start through ``POST /runs`` (a worker imports this module
from the folder the server was given with ``--import-path``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from stepstone import Agent, Plan, Step, Store, recv, step, tool, workflow
from stepstone.graph import END, GraphBuilder, State, append
from stepstone.testing import FunctionModel, call

_stores: dict[str, Store] = {}


def _store() -> Store:
    """The store the server and its workers use (named by the environment)."""
    where = os.environ["SERVEAPP_STORE"]
    if where not in _stores:
        _stores[where] = Store(url=where) if "://" in where else Store(db=where)
    return _stores[where]


@step
def shout(text: str) -> str:
    return text.upper() + "!"


@workflow
async def hello(name: str) -> str:
    """A run that ends at once with a result."""
    return await shout(f"hello {name}")


def _wait_for(path: Path, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


@step
def emit(key: str, n: int, gate: str) -> int:
    """Append ``n`` values to the run's stream ``tokens``; with a gate, value ``i`` waits
    for the file ``<gate>.<i>`` (the test paces the writes)."""
    backend = _store().backend
    for i in range(n):
        if gate:
            _wait_for(Path(f"{gate}.{i}"))
        backend.stream_append(key, "tokens", json.dumps({"i": i, "text": f"tok{i}"}), None)
    return n


@workflow
async def talker(key: str, n: int, gate: str = "") -> int:
    """A run that streams ``n`` values, then ends."""
    return await emit(key, n, gate)


@step
def explode(row: int) -> None:
    raise ValueError(f"bad row {row}")


@workflow
async def broken(row: int) -> None:
    """A run that fails."""
    await explode(row)


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


def _reply(request: Any) -> Any:
    return call("refund", order="o-1") if request.turn == 0 else "refund done"


approver = Agent(model=FunctionModel(_reply), tools=[refund])


def _fetch(payload: Any) -> str:
    return f"{payload}: 3 rows"


def _check(payload: Any) -> str:
    if str(payload).startswith("bad"):
        raise ValueError(f"bad rows in {payload!r}")
    return f"checked {payload}"


#: A two-step Plan: ``fetch``, then ``check`` (which fails on a payload starting "bad").
pipeline = Plan(Step(_fetch, name="fetch"), Step(_check, name="check"))


@workflow
async def waiter(topic: str) -> Any:
    """A run that waits for a message on ``topic`` and answers with it."""
    return await recv(topic)


#: A module and a class this module imported from outside the server's import paths:
#: `serveapp:os.system` and `serveapp:JSONDecoder` must be refused.
JSONDecoder = json.JSONDecoder


class Trip(State):
    """What a graph run's nodes did, in order."""

    trace: Annotated[list[str], append] = Field(default_factory=list)


def _node(name: str) -> Any:
    def run(state: Trip) -> dict[str, Any]:
        return {"trace": [name]}

    run.__name__ = name
    return run


#: A graph: book -> pack -> leave.
trip = (
    GraphBuilder(Trip)
    .add_node("book", _node("book"))
    .add_node("pack", _node("pack"))
    .add_node("leave", _node("leave"))
    .add_edge("book", "pack")
    .add_edge("pack", "leave")
    .add_edge("leave", END)
    .set_entry("book")
    .compile()
)
