"""Plan and Step semantics: guarantees 46-70 (docs/guarantees.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from stepstone import (
    Agent,
    Envelope,
    Plan,
    PlanCompileError,
    PlanRuntimeError,
    Step,
    Store,
    Tool,
    from_parallel,
    from_parallel_all,
    from_prev,
    from_start,
    from_step,
)
from stepstone.exceptions import ConfigurationError, ConfigurationTypeError


def echo(name: str, trail: list[str] | None = None) -> Any:
    def fn(payload: Any) -> str:
        if trail is not None:
            trail.append(name)
        return f"{name}({payload})"

    fn.__name__ = name
    return fn


def run(plan: Plan, task: str = "t", tools: list[Any] | None = None) -> Envelope[Any]:
    return Agent(engine=plan, tools=tools or [])(task)


def test_steps_run_sequentially_by_default() -> None:
    # guarantee 46
    trail: list[str] = []
    env = run(Plan(Step(echo("a", trail)), Step(echo("b", trail)), Step(echo("c", trail))))
    assert trail == ["a", "b", "c"] and env.payload == "c(b(a(t)))"


def test_targets_tool_name_callable_agent_and_async() -> None:
    # guarantee 47, 48, 67
    async def shout(text: str) -> str:
        await asyncio.sleep(0)
        return text.upper()

    inner = Agent(engine=Plan(Step(echo("inner"))), name="helper")
    plan = Plan(
        Step("lookup"),  # tool name: name defaults to it
        Step(shout),  # async callable: name defaults to __name__
        Step(inner),  # Agent: name defaults to agent.name
        Step("lookup", name="again"),  # same tool, another identity
    )
    assert [s.name for s in plan.steps] == ["lookup", "shout", "helper", "again"]
    env = run(plan, "x", tools=[echo("lookup")])
    assert env.payload == "lookup(inner(LOOKUP(X)))"
    with pytest.raises(PlanCompileError, match=r"tool 'lookup'.*not in the Agent's tools"):
        Agent(engine=Plan(Step("lookup")), tools=[])  # guarantee 60: at Agent construction


def test_task_and_context_resolution() -> None:
    # guarantee 49, 50, 51
    seen: list[Envelope[Any]] = []

    def capture(env: Envelope[Any]) -> str:
        seen.append(env)
        return "captured"

    class Source:
        def text(self) -> str:
            return "live view"

    plan = Plan(
        Step(echo("a")),
        Step(echo("b")),
        Step(
            capture,
            task=from_step("a"),
            context=[from_start, "literal note", from_prev],
            sources=[Source()],
        ),
        Step(capture, name="lit", task="a literal task", context=from_step("b")),
    )
    run(plan, "start")
    first, second = seen
    assert first.task == "a(start)" and first.payload == "a(start)"
    assert first.context == "start\n\nliteral note\n\nb(a(start))\n\nlive view"
    assert second.task == "a literal task" and second.payload == "a literal task"
    assert second.context == "b(a(start))"


def test_compile_validates_every_context_item_and_sentinel() -> None:
    # guarantee 50, 52, 60
    for name in ("", 3):  # given, not missing: not "a lambda has no usable name"
        with pytest.raises(PlanCompileError, match="Step name= must be a non-empty str"):
            Step(echo("a"), name=name)  # type: ignore[arg-type]
    ran: list[str] = []
    for option in ("input", "output"):  # refused before the step (and its effects) ran
        with pytest.raises(PlanCompileError, match=rf"step 'a': {option}=5 is not a type"):
            Plan(Step(lambda p: ran.append("a"), name="a", **{option: 5}))
    assert ran == []
    with pytest.raises(PlanCompileError, match=r"context\[1\].*names no step"):
        Plan(Step(echo("a")), Step(echo("b"), context=["ok", from_step("nope")]))
    with pytest.raises(PlanCompileError, match=r"context\[0\] must be a sentinel"):
        Plan(Step(echo("a"), context=[42]))  # type: ignore[list-item]
    with pytest.raises(PlanCompileError, match="parallel=True step"):
        Plan(Step(echo("a")), Step(echo("b"), task=from_parallel("a")))
    with pytest.raises(PlanCompileError, match=r"sources\[0\] has no \.text\(\)"):
        Plan(Step(echo("a"), sources=[object()]))
    with pytest.raises(PlanCompileError, match="two steps are named 'a'"):
        Plan(Step(echo("a")), Step(echo("a")))
    with pytest.raises(PlanCompileError, match="at least one Step"):
        Plan()


def test_a_sentinel_naming_a_later_step_is_a_compile_error() -> None:
    # guarantee 403: before, these compiled and the step got None (or the start input)
    ran: list[str] = []
    for make in (
        lambda: Plan(Step(echo("a", ran), task=from_step("b")), Step(echo("b", ran))),
        lambda: Plan(Step(echo("a", ran), context=["note", from_step("b")]), Step(echo("b", ran))),
        lambda: Plan(
            Step(echo("a", ran), task=from_parallel_all("b")),
            Step(echo("b", ran), parallel=True),
            Step(echo("c", ran), parallel=True),
        ),
    ):
        with pytest.raises(
            PlanCompileError, match=r"step 'a': .* names step 'b', which is declared after it"
        ):
            make()
    with pytest.raises(PlanCompileError, match=r"names step 'a', which is this step itself"):
        Plan(Step(echo("a", ran), task=from_step("a")))
    with pytest.raises(PlanCompileError, match=r"names step 'b', which runs in the same parallel"):
        Plan(
            Step(echo("a", ran), parallel=True, context=from_parallel("b")),
            Step(echo("b", ran), parallel=True),
        )
    # a loop that routes back reads the later step's output with from_prev
    plan = Plan(
        Step(echo("draft", ran)),
        Step(echo("review", ran), routes={"draft": lambda e: len(ran) < 3}),
    )
    assert run(plan).payload == "review(draft(review(draft(t))))"
    assert ran == ["draft", "review", "draft", "review"]


class Row(BaseModel):
    n: int


class Other(BaseModel):
    s: str


def test_input_output_types_checked_and_output_validated() -> None:
    # guarantee 52
    with pytest.raises(PlanCompileError, match="expects input Other but step 'make' outputs Row"):
        Plan(
            Step(lambda p: {"n": 1}, name="make", output=Row),
            Step(lambda r: r, name="use", input=Other),
        )
    got: list[Any] = []

    def use(r: Row) -> int:
        got.append(r)
        return r.n

    env = run(Plan(Step(lambda p: {"n": 4}, name="make", output=Row), Step(use, input=Row)))
    assert env.payload == 4 and got == [Row(n=4)]
    bad = run(Plan(Step(lambda p: {"n": "x"}, name="make", output=Row)))
    assert not bad.ok and bad.error is not None and bad.error.type == "ValidationError"


def test_parallel_band_runs_concurrently() -> None:
    # guarantee 53
    barrier = threading.Barrier(3, timeout=5)

    def branch(name: str) -> Any:
        def fn(payload: Any) -> str:
            barrier.wait()  # all three must be running at once to pass
            return name

        fn.__name__ = name
        return fn

    plan = Plan(
        Step(echo("prep")),
        Step(branch("x"), parallel=True),
        Step(branch("y"), parallel=True),
        Step(branch("z"), parallel=True),
        Step(lambda p: p, name="join"),
    )
    env = run(plan)
    assert env.payload == {"x": "x", "y": "y", "z": "z"}  # from_prev after a band


def test_parallel_sentinels() -> None:
    got: dict[str, Any] = {}

    def grab(name: str) -> Any:
        def fn(env: Envelope[Any]) -> str:
            got[name] = (env.task, env.payload)
            return "ok"

        fn.__name__ = name
        return fn

    plan = Plan(
        Step(echo("p"), parallel=True),
        Step(echo("q"), parallel=True),
        Step(grab("one"), task=from_parallel("q")),
        Step(grab("all"), task=from_parallel_all("p")),
    )
    run(plan, "s")
    assert got["one"] == ("q(s)", "q(s)")
    assert got["all"] == ("[p]\np(s)\n\n[q]\nq(s)", {"p": "p(s)", "q": "q(s)"})


def test_routes_first_truthy_wins_else_linear_and_detour() -> None:
    # guarantee 54, 58
    trail: list[str] = []
    plan = Plan(
        Step(
            echo("start", trail),
            routes={"never": lambda e: False, "b": lambda e: True, "c": lambda e: True},
        ),
        Step(echo("a", trail)),
        Step(echo("b", trail)),
        Step(echo("c", trail)),
        Step(echo("never", trail)),
    )
    run(plan)
    # jumped to b (first truthy), then linear from there: a detour, not a branch
    assert trail == ["start", "b", "c", "never"]
    trail.clear()
    run(
        Plan(
            Step(echo("s", trail), routes={"z": lambda e: False}),
            Step(echo("y", trail)),
            Step(echo("z", trail)),
        )
    )
    assert trail == ["s", "y", "z"]


class Triage(BaseModel):
    kind: Literal["urgent", "normal", "spam"]


def test_routes_by_literal_field_with_after_branches() -> None:
    # guarantee 55, 57
    trail: list[str] = []

    def triage(payload: Any) -> Triage:
        return Triage(kind="normal")

    plan = Plan(
        Step(triage, output=Triage, routes_by="kind", after_branches="archive"),
        Step(echo("urgent", trail)),
        Step(echo("normal", trail)),
        Step(echo("spam", trail)),
        Step(echo("archive", trail)),
    )
    env = run(plan, "mail")
    assert trail == ["normal", "archive"]  # one branch, the others skipped, then rejoin
    assert env.payload == "archive(normal(kind='normal'))"


def test_routes_by_compile_checks() -> None:
    # guarantee 55, 56, 57
    class Loose(BaseModel):
        kind: str

    class Wrong(BaseModel):
        kind: Literal["a", "zzz"]

    with pytest.raises(PlanCompileError, match="Literal"):
        Plan(Step(echo("r"), output=Loose, routes_by="kind"), Step(echo("a")))
    with pytest.raises(PlanCompileError, match="routes to 'zzz'"):
        Plan(Step(echo("r"), output=Wrong, routes_by="kind"), Step(echo("a")))
    with pytest.raises(PlanCompileError, match="no field 'nope'"):
        Plan(Step(echo("r"), output=Triage, routes_by="nope"))
    with pytest.raises(PlanCompileError, match="needs output="):
        Plan(Step(echo("r"), routes_by="kind"))
    with pytest.raises(PlanCompileError, match="mutually exclusive"):
        Plan(Step(echo("a"), routes={"a": bool}, routes_by="kind"))
    with pytest.raises(PlanCompileError, match="only valid with routes"):
        Plan(Step(echo("a"), after_branches="b"), Step(echo("b")))
    with pytest.raises(PlanCompileError, match="branches must lie between"):
        Plan(
            Step(echo("a"), routes={"c": bool}, after_branches="b"),
            Step(echo("x")),
            Step(echo("b")),
            Step(echo("c")),
        )


def test_loop_bounded_by_max_iterations() -> None:
    # guarantee 59, 33
    n = {"i": 0}

    def tick(payload: Any) -> int:
        n["i"] += 1
        return n["i"]

    env = run(Plan(Step(tick, routes={"tick": lambda e: True}), max_iterations=7))
    assert not env.ok and env.error is not None and env.error.type == "MaxIterationsExceeded"
    assert n["i"] == 8  # the first visit, then 7 routed re-visits


def test_route_predicate_raising_is_plan_runtime_error() -> None:
    # guarantee 61
    def boom(env: Envelope[Any]) -> bool:
        raise KeyError("missing field")

    plan = Plan(Step(echo("a"), routes={"b": boom}), Step(echo("b")))
    with pytest.raises(PlanRuntimeError, match=r"step 'a' for target 'b' raised KeyError") as info:
        run(plan)
    assert isinstance(info.value.__cause__, KeyError)


def test_run_many_order_errors_and_concurrency_cap() -> None:
    # guarantee 64, 65, 66, 68
    active = {"now": 0, "max": 0}
    lock = threading.Lock()

    def work(payload: Any) -> str:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(0.05)
        with lock:
            active["now"] -= 1
        if payload == "bad":
            raise ValueError("bad input")
        return f"ok:{payload}"

    plan = Plan(Step(work))
    out = plan.run_many(["a", "bad", "c", "d", "e"], concurrency=2)
    assert [e.payload for e in out] == ["ok:a", None, "ok:c", "ok:d", "ok:e"]
    assert out[1].error is not None and out[1].error.type == "ValueError"
    assert active["max"] == 2
    with pytest.raises(ValueError, match="concurrency"):
        plan.run_many(["a"], concurrency=0)

    async def go() -> list[Envelope[Any]]:
        env = Envelope(task="as envelope", payload="pre-set payload")
        return await plan.arun_many(["x", env])

    got = asyncio.run(go())
    assert [e.payload for e in got] == ["ok:x", "ok:pre-set payload"]


def test_run_many_tools_required_for_string_targets() -> None:
    # guarantee 67
    plan = Plan(Step("fetch"))
    out = plan.run_many(["a"])
    assert out[0].error is not None and "fetch" in out[0].error.message
    assert plan.run_many(["a"], tools=[echo("fetch")])[0].payload == "fetch(a)"


def test_to_dict_from_dict_round_trip() -> None:
    # guarantee 69, 70
    agent = Agent(engine=Plan(Step(echo("inner"))), name="writer")

    def is_long(env: Envelope[Any]) -> bool:
        return len(env.text()) > 100

    plan = Plan(
        Step("search", writes="hits"),
        Step(
            echo("rank"),
            task=from_step("search"),
            context=[from_start, "note"],
            parallel=True,
            output=Row,
        ),
        Step(echo("summarise"), parallel=True),
        Step(agent, routes={"search": is_long}),
        max_iterations=9,
    )
    data = plan.to_dict()
    assert data["version"] == 1 and data["max_iterations"] == 9
    assert [s["name"] for s in data["steps"]] == ["search", "rank", "summarise", "writer"]
    assert data["steps"][0]["target"] == {"tool": "search"}
    assert data["steps"][1]["task"] == {"sentinel": "step", "name": "search"}
    assert data["steps"][1]["parallel"] is True and data["steps"][0]["writes"] == "hits"
    registry = {
        "rank": echo("rank"),
        "summarise": echo("summarise"),
        "writer": agent,
        "is_long": is_long,
    }
    again = Plan.from_dict(data, registry=registry)
    assert again.to_dict() == data
    assert again.steps[1].output is Row and again.steps[3].routes == {"search": is_long}
    with pytest.raises(KeyError, match="'summarise'"):
        Plan.from_dict(data, registry={k: v for k, v in registry.items() if k != "summarise"})
    assert Plan.from_dict({"version": 1, "steps": data["steps"][:1]}).max_iterations == 100


def test_from_dict_plan_options(tmp_path: Any) -> None:
    store = Store()
    plan = Plan.from_dict(Plan(Step("x")).to_dict(), store=store, checkpoint_key="k")
    assert plan.store is store and plan.checkpoint_key == "k"


def test_agent_callable_and_step_failures_are_error_envelopes() -> None:
    def broken(payload: Any) -> str:
        raise OSError("disk full")

    agent = Agent(engine=Plan(Step(echo("a")), Step(broken)), name="pipeline")
    env = agent("task")
    assert not env.ok and env.error is not None
    assert (env.error.type, env.error.message, env.metadata["step"]) == (
        "OSError",
        "disk full",
        "broken",
    )

    async def go() -> Envelope[Any]:
        return await agent.run("task")

    assert asyncio.run(go()).error is not None


def test_functions_in_tools_become_named_tools() -> None:
    def fetch(url: str, retries: int = 2) -> str:
        """Fetch a URL.

        Args:
            url: What to fetch.
            retries: How often to retry.
        """
        return url

    agent = Agent(engine=Plan(Step("fetch")), tools=[fetch])
    t = agent.tool_map["fetch"]
    assert isinstance(t, Tool) and t.description == "Fetch a URL."
    assert t.parameters["properties"]["url"]["description"] == "What to fetch."
    assert t.parameters["required"] == ["url"]
    as_tool = Agent(engine=Plan(Step(echo("x"))), name="researcher").as_tool()
    assert as_tool.name == "researcher" and as_tool.agent is not None


def test_quick_sync_steps_of_concurrent_runs_move_to_the_loops_thread() -> None:
    """guarantee 341: runs sharing one loop (run_many) send a sync step to worker threads
    until it has proven quick, then run it on the loop's thread; a step that takes longer
    than a thread hop costs stays in worker threads. Every result is the same."""
    seen: dict[str, list[str]] = {"quick": [], "slow": []}

    def quick(payload: int) -> int:
        seen["quick"].append(threading.current_thread().name)
        return payload + 1

    def slow(payload: int) -> int:
        seen["slow"].append(threading.current_thread().name)
        time.sleep(0.002)
        return payload * 2

    plan = Plan(Step(quick), Step(slow), Step(quick, name="quick_again"))
    envs = plan.run_many([Envelope(task="t", payload=i) for i in range(20)], concurrency=4)
    assert [e.payload for e in envs] == [(i + 1) * 2 + 1 for i in range(20)]
    main = threading.main_thread().name
    assert main not in seen["quick"][:3] and main in seen["quick"]
    assert main not in seen["slow"]


def test_sync_steps_inline_on_private_loop_offloaded_on_a_shared_one() -> None:
    # A sync call's private loop runs nothing else: sync steps run inline (no thread hop).
    # On the caller's own loop, other tasks must keep running while a sync step blocks.
    threads: list[str] = []

    def where(payload: Any) -> str:
        threads.append(threading.current_thread().name)
        time.sleep(0.2)
        return "ok"

    agent = Agent(engine=Plan(Step(where)))
    assert agent("t").ok
    assert threads == [threading.main_thread().name]

    async def app() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await agent.run("t")
        task.cancel()
        return ticks

    assert asyncio.run(app()) >= 5
    assert threads[-1] != threading.main_thread().name

    # run_many shares its private loop among runs: their sync steps go to worker threads
    # (these take a millisecond: more than a thread hop costs), and once those runs are
    # done a later sync call runs inline again.
    threads.clear()

    def slowish(payload: Any) -> None:
        threads.append(threading.current_thread().name)
        time.sleep(0.001)

    fast = Agent(engine=Plan(Step(slowish, name="w")))
    assert all(env.ok for env in fast.engine.run_many(list("abcdef"), concurrency=3))
    assert threading.main_thread().name not in threads
    threads.clear()
    assert fast("t").ok and threads == [threading.main_thread().name]


def test_a_sync_step_on_the_loops_thread_may_call_asyncio_run() -> None:
    """guarantee 344: a sync step running on the loop's thread (a sync call's only task, or
    a step of concurrent runs proven quick) sees no running loop, as in a worker thread:
    asyncio.run inside it works and asyncio.get_running_loop() raises; the steps after it,
    and the thread's next sync calls, run on the thread's loop as before."""

    async def fetch(x: Any) -> str:
        await asyncio.sleep(0)
        return f"fetched {x}"

    def wrapped(payload: Any) -> str:
        return asyncio.run(fetch(payload))

    def no_loop(payload: Any) -> str:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return f"{payload}, no running loop"
        return "a running loop was visible"

    async def then_async(payload: str) -> tuple[str, bool]:
        await asyncio.sleep(0)
        return payload, asyncio.get_running_loop() is loops[0]

    loops: list[asyncio.AbstractEventLoop] = []

    async def remember(payload: Any) -> Any:
        loops.append(asyncio.get_running_loop())
        return payload

    plan = Plan(Step(remember), Step(wrapped), Step(no_loop), Step(then_async))
    agent = Agent(engine=plan)
    assert agent("a").payload == ("fetched a, no running loop", True)  # inline: only task
    assert agent("b").payload == ("fetched b, no running loop", True)
    assert loops[0] is loops[1]  # the thread's loop, reused
    # concurrent runs: the steps go inline once proven quick (asyncio.run is ~0.1 ms, so
    # it may or may not); every run works either way
    envs = plan.run_many([f"r{i}" for i in range(12)], concurrency=4)
    assert [e.payload[0] for e in envs] == [f"fetched r{i}, no running loop" for i in range(12)]


def _echo(payload: Any) -> Any:
    return payload


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Step(_echo, sources=None), "sources= must be a list of objects with a .text"),
        (lambda: Step(_echo, sources=5), "sources= must be a list"),
        (lambda: Step(_echo, parallel="no"), "parallel= must be True or False, got 'no'"),
        (lambda: Plan(Step(_echo), max_iterations=True), "max_iterations must be an int"),
        (lambda: Plan(Step(_echo), approvals=5), "approvals= must map call ids"),
        (lambda: Plan(Step(_echo), approvals=["c1"]), "approvals= must map call ids"),
        (lambda: Plan(Step(_echo), approvals={"c1": 1}), "call id 'c1' has 1 \\(int\\)"),
        (lambda: Plan(Step(_echo), approvals={"c1": ""}), "call id 'c1' has '' \\(str\\)"),
        (lambda: Plan.from_dict(5), "takes what Plan.to_dict returns"),  # type: ignore[arg-type]
        (lambda: Plan.from_dict({"steps": 5}), "a 'steps' list"),
        (lambda: Plan.from_dict({"steps": [{}]}), r"steps\[0\] is not a step"),
        (lambda: Plan.from_dict({"steps": [{"name": "a", "target": 5}]}), r"steps\[0\]"),
    ],
)
def test_arguments_of_the_wrong_kind_are_compile_errors(build: Any, message: str) -> None:
    # guarantee 60, 70: before, raw TypeErrors, ValueErrors and KeyErrors from inside
    with pytest.raises(PlanCompileError, match=message):
        build()


def test_run_many_refuses_one_task_or_a_bad_cap() -> None:
    # guarantee 66: before, run_many("abc") ran three tasks, 'a', 'b' and 'c'
    plan = Plan(Step(_echo))
    for tasks in ("abc", None):
        with pytest.raises(ConfigurationTypeError, match="run_many takes a list of tasks"):
            plan.run_many(tasks)  # type: ignore[arg-type]
    for cap in ("2", True, 0):
        with pytest.raises(ConfigurationError, match="concurrency must be an int >= 1"):
            plan.run_many(["a"], concurrency=cap)  # type: ignore[arg-type]
