"""GraphBuilder validation, State and reducers, node kinds, routing."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from stepstone import Agent
from stepstone.engines.llm import LLMEngine
from stepstone.graph import (
    END,
    GraphBuilder,
    GraphCompileError,
    InMemoryCheckpointer,
    NodeException,
    Reducer,
    State,
    append,
)
from stepstone.testing import FakeModel


class S(State):
    text: str = ""
    count: int = 0
    log: Annotated[list[str], append] = Field(default_factory=list)
    total: Annotated[int, Reducer(lambda a, b: a + b, name="add")] = 0


def _chain(*names: str) -> GraphBuilder[S]:
    b = GraphBuilder(S)
    for n in names:
        b.add_node(n, lambda s, n=n: {"log": [n]})
    for a, z in itertools.pairwise(names):
        b.add_edge(a, z)
    return b


def test_state_is_frozen_and_strict() -> None:
    s = S()
    with pytest.raises(ValidationError):
        s.text = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        S(unknown=1)  # type: ignore[call-arg]


def test_reducers_and_last_write_wins() -> None:
    # guarantee 115: append accumulates; plain fields take the last write; custom reducers merge
    g = (
        GraphBuilder(S)
        .add_node("a", lambda s: {"text": "first", "log": ["a"], "total": 2})
        .add_node("b", lambda s: {"text": "second", "log": ["b", "b2"], "total": 3})
        .add_edge("a", "b")
        .add_edge("b", END)
        .set_entry("a")
        .compile()
    )
    final = g.invoke(S(log=["seed"]))
    assert final == S(text="second", log=["seed", "a", "b", "b2"], total=5)


def test_bad_updates_become_node_exceptions() -> None:
    def run(update: Any) -> NodeException:
        g = GraphBuilder(S).add_node("n", lambda s: update).add_edge("n", END).set_entry("n")
        with pytest.raises(NodeException) as info:
            g.compile().invoke(S())
        return info.value

    assert "unknown field(s) ['nope']" in str(run({"nope": 1}))
    assert "return [item]" in str(run({"log": "not-a-list"}))
    assert "does not validate" in str(run({"count": "many"}))
    assert "return a dict" in str(run(["not", "a", "dict"]))
    assert run({"nope": 1}).node_name == "n"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GraphBuilder(S).compile(), "no nodes"),
        (lambda: _chain("a").add_edge("a", END).compile(), r"set_entry\('a'\)"),
        (lambda: _chain("a").add_edge("a", END).set_entry("z").compile(), "entry node 'z'"),
        (
            lambda: _chain("a").set_entry("a").compile(),
            r"node 'a' has no outgoing edge; add add_edge\('a', END\)",
        ),
        (
            lambda: _chain("a").add_edge("a", "ghost").set_entry("a").compile(),
            r"'ghost' is not a node; add it with add_node\('ghost'",
        ),
        (
            lambda: _chain("a").add_edge("a", END).add_edge("ghost", END).set_entry("a").compile(),
            "an edge leaves 'ghost'",
        ),
        (
            lambda: _chain("a", "b").add_edge("a", END).add_edge("b", END).set_entry("a").compile(),
            "node 'a' has 2 outgoing edges",
        ),
        (
            lambda: _chain("a", "b", "c").add_edge("c", END).set_entry("b").compile(),
            "node 'a' cannot be reached",
        ),
        (lambda: _chain("a", "a"), "node 'a' is added twice"),
        (lambda: GraphBuilder(S).add_node("x", 42), "node 'x': expected a function"),
        (lambda: GraphBuilder(dict), "State subclass"),  # type: ignore[arg-type, type-var]
        (
            lambda: GraphBuilder(S).add_node("n", lambda s: None).with_checkpointer("db.sqlite"),
            "with_checkpointer",
        ),  # type: ignore[arg-type]
        (
            lambda: GraphBuilder(S).add_conditional_edge("a", lambda s: "b", [123]),
            "a target is a node name or END",
        ),
        (
            lambda: (
                GraphBuilder(S).add_node("a", lambda s: None).add_subgraph_node("sub", object())
            ),
            "compiled graph",
        ),  # type: ignore[arg-type]
    ],
)
def test_compile_errors_name_the_node_and_the_fix(build: Any, message: str) -> None:
    with pytest.raises(GraphCompileError, match=message):
        build()


def test_duplicate_migration_edge_is_refused() -> None:
    from typing import ClassVar

    class V(State):
        schema_version: ClassVar[str] = "v2"

    b = GraphBuilder(V).with_state_migration("v1", "v2", lambda d: d)
    with pytest.raises(GraphCompileError, match="registered twice"):
        b.with_state_migration("v1", "v2", lambda d: d)
    with pytest.raises(GraphCompileError, match="to itself"):
        b.with_state_migration("v2", "v2", lambda d: d)


async def test_sync_and_async_nodes_and_conditional_routing() -> None:
    async def grow(state: S) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"count": state.count + 1, "log": [f"grow{state.count + 1}"]}

    def done(state: S) -> None:
        return None

    g = (
        GraphBuilder(S)
        .add_node("grow", grow)
        .add_node("done", done)
        .add_conditional_edge(
            "grow", lambda s: "again" if s.count < 3 else "stop", {"again": "grow", "stop": "done"}
        )
        .add_edge("done", END)
        .set_entry("grow")
        .compile()
    )
    final = await g.ainvoke(S())
    assert final.log == ["grow1", "grow2", "grow3"]


def test_router_errors_are_node_exceptions_after_the_node_is_saved() -> None:
    cp = InMemoryCheckpointer()

    def router(state: S) -> str:
        raise ZeroDivisionError("bad router")

    g = (
        GraphBuilder(S)
        .add_node("a", lambda s: {"log": ["a"]})
        .add_node("b", lambda s: None)
        .add_conditional_edge("a", router)
        .add_edge("b", END)
        .set_entry("a")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(NodeException, match="router after node 'a'") as info:
        g.invoke(S())
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert [p.node_name for p in cp.list()[0].completed_positions] == ["a"]

    g2 = (
        GraphBuilder(S)
        .add_node("a", lambda s: None)
        .add_node("b", lambda s: None)
        .add_conditional_edge("a", lambda s: "nowhere", ["b", END])
        .add_edge("b", END)
        .set_entry("a")
        .compile()
    )
    with pytest.raises(NodeException, match="returned 'nowhere'"):
        g2.invoke(S())


def test_invoke_checks_its_arguments() -> None:
    from stepstone.exceptions import UserError

    g = _chain("a").add_edge("a", END).set_entry("a").compile()
    with pytest.raises(UserError, match="initial S instance"):
        g.invoke({"text": "x"})  # type: ignore[arg-type]


async def test_sync_invoke_inside_a_running_loop_names_ainvoke() -> None:
    g = _chain("a").add_edge("a", END).set_entry("a").compile()
    with pytest.raises(RuntimeError, match=r"await graph.ainvoke"):
        g.invoke(S())


class Crew(BaseModel):
    count: int


def test_agent_nodes_with_the_scripted_model() -> None:
    # Agents as nodes: a structured payload is the update; writes= takes a text answer
    model = FakeModel(["Land near Shackleton crater.", {"count": 4}])
    writer = Agent(engine=LLMEngine(model), name="writer")
    sizer = Agent(engine=LLMEngine(model), name="sizer", output=Crew)
    g = (
        GraphBuilder(S)
        .add_node("objective", writer, writes="text")
        .add_node("crew", sizer)
        .add_edge("objective", "crew")
        .add_edge("crew", END)
        .set_entry("objective")
        .compile()
    )
    final = g.invoke(S())
    assert final.text == "Land near Shackleton crater."
    assert final.count == 4
    # the agent's task is the state as JSON
    assert '"text":""' in str(model.requests[0].messages[-1])


def test_agent_node_failure_is_a_node_exception() -> None:
    agent = Agent(engine=LLMEngine(FakeModel([ValueError("model exploded")])), name="a")
    g = GraphBuilder(S).add_node("ask", agent, writes="text").add_edge("ask", END).set_entry("ask")
    with pytest.raises(NodeException) as info:
        g.compile().invoke(S())
    assert info.value.node_name == "ask"
    assert "model exploded" in str(info.value)
    with pytest.raises(GraphCompileError, match="writes= is for Agent nodes"):
        GraphBuilder(S).add_node("f", lambda s: None, writes="text")


async def test_a_quick_sync_node_of_concurrent_invocations_moves_to_the_loops_thread() -> None:
    """guarantee 341: graph invocations sharing one loop send a sync node to worker threads
    until it has proven quick, then run it on the loop's thread; results are the same."""
    seen: list[int] = []

    def tick(s: S) -> dict[str, Any]:
        seen.append(threading.get_ident())
        return {"total": 1}

    g = (
        GraphBuilder(S)
        .add_node("tick", tick)
        .add_node("tock", tick)
        .add_edge("tick", "tock")
        .add_edge("tock", END)
        .set_entry("tick")
        .compile()
    )
    loop_thread = threading.get_ident()
    # A busy machine can stretch a call past the quick mark and restart its streak: run
    # rounds of 40 concurrent invocations until the node has moved (at most 50 rounds).
    for _ in range(50):
        finals = await asyncio.gather(*(g.ainvoke(S()) for _ in range(40)))
        assert [f.total for f in finals] == [2] * 40
        if loop_thread in seen:
            break
    assert loop_thread not in seen[:3] and loop_thread in seen
