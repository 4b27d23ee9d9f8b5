"""Durable pipelines for the randomized crash torture (``test_torture.py``).

Run as a script, one attempt of one pipeline in its own process, which the torture driver
SIGKILLs at a random moment and starts again until the pipeline finishes:

    torture_worker.py plan  STORE LOG OPTIONS   # Plans (writes=, a band, a loop, an LLM step)
    torture_worker.py graph STORE LOG OPTIONS   # a graph with a loop, resumed by invocation
    torture_worker.py agent STORE LOG OPTIONS   # a Runner run whose tools have side effects
    torture_worker.py replan STORE LOG OPTIONS  # a ReplanEngine run: planner, rounds of tasks

STORE is a SQLite path or a ``postgresql://`` URL; OPTIONS is JSON (see each ``run_*``).
The script prints ``ready`` once its store is open, then one JSON line with what the run
returned. Imported as a module (``tests.runner.torture_worker``) it is also where the
``stepstone worker`` processes of the queue scenarios find their targets (``queued_plan``,
``queued_graph``, ``queued_agent``), whose task carries the log path and the run's name.

Every step, node, tool call and model call appends ``"<run> <step> <pid>"`` to LOG with
one ``write`` and an ``fsync`` before it returns (a tool adds its idempotency key), so the
driver can count each side effect and tell which process made it. ``<step>`` names one
execution: ``s4@7`` (a Plan step and the position it ran at), ``b@3`` (a graph node and
its step), ``tool:2:1`` / ``model:2`` (an agent's call at turn 2, index 1), ``task:2.1``
/ ``plan:2`` (a replan run's task 1 of round 2, its function planner's answer for round 2).
An LLM loop inside a replan run logs under ``<run>~round2.task2`` / ``<run>~round1.planner``
(the place in the run its loop's key names).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

if __name__ == "__main__":  # the queue's targets are imported as tests.runner.torture_worker
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from stepstone import (
    Agent,
    Envelope,
    Plan,
    PlanRound,
    ReplanEngine,
    ReplanTask,
    Runner,
    RunnerConfig,
    Step,
    Store,
    ToolContext,
    from_step,
    tool,
)
from stepstone.exceptions import ConcurrentRunError
from stepstone.graph import END, CheckpointFilter, GraphBuilder, State, StoreCheckpointer, append
from stepstone.providers import ModelRequest
from stepstone.store import SQLiteBackend
from stepstone.testing import FunctionModel, Reply, call

#: Laps of the Plan's routed loop (``s4`` -> ``again`` -> ``s4``...).
LAPS = 3
#: Visits of the graph's looping node ``b``.
GRAPH_LOOPS = 5


def effect(log: str, run: str, step: str, extra: str = "") -> None:
    """Record one side effect: a line in ``log``, written and fsynced before returning."""
    line = f"{run} {step} {os.getpid()}" + (f" {extra}" if extra else "") + "\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def digest(*parts: Any) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


def open_store(where: str, opts: dict[str, Any] | None = None) -> Store:
    """The store at ``where``; OPTIONS ``sqlite`` sets the SQLite backend's knobs
    (``checkpoint_pages``, ``durability``, ``preallocate_wal``): a few checkpoint pages
    make kills land in SQLite's checkpoints and WAL restarts too."""
    if "://" in where:
        return Store(url=where)
    knobs = (opts or {}).get("sqlite")
    if knobs:
        return Store(backend=SQLiteBackend(where, **knobs))
    return Store(db=where)


# -- LLM agents: a scripted model, tools with side effects ----------------------------------
def _tool_effect(log: str, ctx: ToolContext) -> tuple[str, str]:
    """Log a tool call under its run and position, read from its idempotency key
    (``"{run_id}:tool:{turn}:{index}"``, the same on every replay and resume)."""
    run, kind, turn, index = ctx.idempotency_key.rsplit(":", 3)
    effect(log, run, f"{kind}:{turn}:{index}", ctx.idempotency_key)
    return run, f"{kind}:{turn}:{index}"


def agent_tools(log: str) -> list[Any]:
    """``work`` (in doubt: run again), ``charge`` (in doubt: ask a person), ``gated``
    (needs an approval), ``once`` (in doubt: fail the run)."""

    @tool
    def work(item: str, ctx: ToolContext) -> str:
        """Do some work with a side effect."""
        _tool_effect(log, ctx)
        return f"worked {item}"

    @tool(in_doubt="ask")
    def charge(item: str, ctx: ToolContext) -> str:
        """Charge for an item; a person decides when a crash leaves it in doubt."""
        _tool_effect(log, ctx)
        return f"charged {item}"

    @tool(requires_approval=True)
    def gated(item: str, ctx: ToolContext) -> str:
        """Ship an item; a person approves each call."""
        _tool_effect(log, ctx)
        return f"shipped {item}"

    @tool(in_doubt="fail")
    def once(item: str, ctx: ToolContext) -> str:
        """Send a message that must never go twice."""
        _tool_effect(log, ctx)
        return f"sent {item}"

    return [work, charge, gated, once]


#: The agent scenario's script: the tool calls of each turn (then a final answer).
AGENT_TURNS: list[list[tuple[str, str]]] = [
    [("work", "a"), ("work", "b"), ("charge", "c")],
    [("gated", "d"), ("work", "e")],
    [("charge", "f"), ("once", "g"), ("work", "h")],
    [("work", "i"), ("work", "j"), ("work", "k"), ("work", "l")],
]
#: The LLM step of the Plan scenario, and the queued agent: only tools that may rerun.
SIMPLE_TURNS: list[list[tuple[str, str]]] = [
    [("work", "a"), ("work", "b")],
    [("work", "c")],
]


def scripted_agent(
    log: str, run: str, turns: list[list[tuple[str, str]]], *, name: str = "torture"
) -> Agent:
    """An LLM agent on a scripted model: turn ``t`` calls ``turns[t]``, then answers.
    Each model call is logged as ``<run> model:<turn>``."""

    def script(request: ModelRequest) -> Any:
        effect(log, run, f"model:{request.turn}")
        if request.turn < len(turns):
            return Reply(tool_calls=[call(t, item=item) for t, item in turns[request.turn]])
        results = [r.content for m in request.messages for r in m.tool_results if not r.is_error]
        return f"done: {digest(*results)}"

    return Agent(name=name, model=FunctionModel(script), tools=agent_tools(log))


# -- Plans ------------------------------------------------------------------------------------
def _fold(payload: Any) -> dict[str, Any]:
    """A step's input as ``{run, acc, laps}``; a band's outputs (``{name: output}``) are
    folded into one."""
    if "run" in payload:
        return dict(payload)
    parts = [payload[name] for name in sorted(payload)]
    return {
        "run": parts[0]["run"],
        "acc": digest(*(p["acc"] for p in parts)),
        "laps": max(p["laps"] for p in parts),
    }


def _plan_step(log: str, name: str, *, pad: int = 0, lap: bool = False) -> Any:
    def fn(env: Envelope[Any]) -> dict[str, Any]:
        data = _fold(env.payload)
        effect(log, data["run"], f"{name}@{env.metadata['iteration']}")
        out = {**data, "acc": digest(data["acc"], name), "laps": data["laps"] + int(lap)}
        if pad:
            out["pad"] = "x" * pad
        return out

    fn.__name__ = name
    return fn


def _async_step(log: str, name: str) -> Any:
    sync = _plan_step(log, name)

    async def fn(env: Envelope[Any]) -> dict[str, Any]:
        out: dict[str, Any] = sync(env)
        return out

    fn.__name__ = name
    return fn


def _last_step(log: str) -> Any:
    def last(env: Envelope[Any]) -> dict[str, Any]:
        data = _fold(env.payload)
        effect(log, data["run"], f"last@{env.metadata['iteration']}")
        return {**data, "acc": digest(data["acc"], env.context or "")}

    return last


def plan_steps(log: str, run: str, *, llm: bool, prefix: str = "") -> list[Step]:
    """s0 s1 s2 [b0 b1 b2] merge s4 again(-> s4 until LAPS) [llm] last; ``prefix`` makes
    the ``writes=`` keys of one run its own."""
    steps = [
        Step(_plan_step(log, "s0"), writes=f"{prefix}s0"),
        Step(_async_step(log, "s1")),
        Step(_plan_step(log, "s2", pad=3000), writes=f"{prefix}s2"),
        Step(_plan_step(log, "b0"), parallel=True, writes=f"{prefix}b0"),
        Step(_async_step(log, "b1"), parallel=True),
        Step(_plan_step(log, "b2", pad=5000), parallel=True, writes=f"{prefix}b2"),
        Step(_plan_step(log, "merge"), writes=f"{prefix}merge"),
        Step(_plan_step(log, "s4", lap=True)),
        Step(
            _plan_step(log, "again"),
            routes={"s4": lambda env: env.payload["laps"] < LAPS},
            writes=f"{prefix}again",
        ),
    ]
    context = None
    if llm:
        agent = scripted_agent(log, f"{run}~llm", SIMPLE_TURNS, name="helper")
        steps.append(Step(agent, name="llm", task="use the tools", writes=f"{prefix}llm"))
        context = from_step("llm")
    steps.append(Step(_last_step(log), name="last", task=from_step("again"), context=context))
    return steps


def build_plan(store: Store | None, log: str, run: str, *, llm: bool) -> Agent:
    plan = Plan(
        *plan_steps(log, run, llm=llm, prefix=f"{run}."),
        store=store,
        checkpoint_key=run if store is not None else None,
        resume=store is not None,
        max_iterations=20,
    )
    return Agent(engine=plan)


def start_of(run: str) -> Envelope[Any]:
    return Envelope(task="go", payload={"run": run, "acc": "", "laps": 0})


async def run_plans(store: Store | None, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    """OPTIONS: ``runs`` (their keys), ``llm`` (with an LLM step), ``gather`` (the runs
    share one event loop, their commits grouped; else one sync call at a time, see
    :func:`plans_sync`)."""
    agents = {run: build_plan(store, log, run, llm=opts["llm"]) for run in opts["runs"]}
    envs = await asyncio.gather(
        *(a.run(start_of(run)) for run, a in agents.items()), return_exceptions=True
    )
    return {run: plan_result(store, run, env) for run, env in zip(agents, envs, strict=True)}


def plans_sync(store: Store, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Each run by a sync call, one after another (the commit on the caller's thread)."""
    out = {}
    for run in opts["runs"]:
        try:
            env = build_plan(store, log, run, llm=opts["llm"])(start_of(run))
        except ConcurrentRunError as exc:
            out[run] = {"concurrent": str(exc)}
        else:
            out[run] = plan_result(store, run, env)
    return out


def plan_result(
    store: Store | None, run: str, env: Envelope[Any] | BaseException
) -> dict[str, Any]:
    """What a Plan run gave: its payload (``"cached"`` when the run had finished before:
    a done run's resume returns its ``kv``, guarantee 23), its status and ``kv`` as
    ``store.read`` shows them (a padding as its length); ``concurrent`` when another
    process owned the run (guarantee 27)."""
    if isinstance(env, ConcurrentRunError):
        return {"concurrent": str(env)}
    if isinstance(env, BaseException):
        raise env
    if not env.ok:
        assert env.error is not None
        return {"error": env.error.to_dict()}
    state = store.read(run) if store is not None else {"status": "done", "kv": {}}
    return {
        "payload": "cached" if env.metadata.get("cached") else _shown(env.payload),
        "status": state["status"],
        "kv": _shown(state["kv"]),
    }


def _shown(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: len(v) if k == "pad" else _shown(v) for k, v in value.items()}
    return value


# -- Graphs -----------------------------------------------------------------------------------
class Walk(State):
    """The torture graph's state: ``n`` counts the nodes run (it is each node's step)."""

    run: str = ""
    log: str = ""
    n: int = 0
    acc: str = ""
    trace: Annotated[list[str], append] = Field(default_factory=list)


def _node(name: str, *, is_async: bool = False) -> Any:
    def update(state: Walk) -> dict[str, Any]:
        effect(state.log, state.run, f"{name}@{state.n}")
        return {"n": state.n + 1, "acc": digest(state.acc, name, state.n), "trace": [name]}

    if not is_async:
        update.__name__ = name
        return update

    async def node(state: Walk) -> dict[str, Any]:
        return update(state)

    node.__name__ = name
    return node


def _loop_router(state: Walk) -> str:
    return "b" if state.trace.count("b") < GRAPH_LOOPS else "c"


def build_graph(checkpointer: Any = None) -> Any:
    """a -> b (loops back to itself GRAPH_LOOPS times) -> c (async) -> d -> END."""
    builder = (
        GraphBuilder(Walk)
        .add_node("a", _node("a"))
        .add_node("b", _node("b"))
        .add_node("c", _node("c", is_async=True))
        .add_node("d", _node("d"))
        .add_edge("a", "b")
        .add_conditional_edge("b", _loop_router, targets=["b", "c"])
        .add_edge("c", "d")
        .add_edge("d", END)
        .set_entry("a")
    )
    if checkpointer is not None:
        builder = builder.with_checkpointer(checkpointer)
    return builder.compile()


def graph_result(state: Walk) -> dict[str, Any]:
    return {"n": state.n, "acc": state.acc, "trace": list(state.trace)}


async def run_graph(store: Store, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    """OPTIONS: ``run`` (the correlation id). Resumes the latest invocation that is not
    done, as a user would after a crash; starts one when there is none."""
    checkpointer = StoreCheckpointer(store)
    graph = build_graph(checkpointer)
    run = opts["run"]
    attempts = checkpointer.list(CheckpointFilter(correlation_id=run))
    if not attempts:
        final = await graph.ainvoke(Walk(run=run, log=log), correlation_id=run)
    elif attempts[-1].status == "done":
        final = Walk.model_validate(attempts[-1].state)
    else:
        final = await graph.ainvoke(resume_invocation=attempts[-1].invocation_id)
    return {run: {"payload": graph_result(final)}}


# -- Runner runs ------------------------------------------------------------------------------
async def run_agent(store: Store, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    """OPTIONS: ``run`` (the run id), ``async_writes``, ``approvals`` (a resume with these
    decisions; without them ``runner.run`` continues the run)."""
    run = opts["run"]
    agent = scripted_agent(log, run, AGENT_TURNS)
    runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=opts["async_writes"]))
    try:
        if opts.get("approvals"):
            result = await runner.resume(
                agent, run_id=run, thread_id=run, approvals=opts["approvals"]
            )
        else:
            result = await runner.run(agent, user_message="do it all", run_id=run, thread_id=run)
    except ConcurrentRunError as exc:  # another process runs it (guarantee 165)
        return {run: {"concurrent": str(exc)}}
    return {
        run: {
            "state": result.state,
            "payload": result.final_text,
            "pending": [
                {k: p.get(k) for k in ("call_id", "reason", "tool", "turn", "index")}
                for p in result.pending_approvals
            ],
            "error": result.error,
        }
    }


# -- ReplanEngine runs ------------------------------------------------------------------------
#: Each working round's tasks (tool and whether parallel), then a round answering done.
#: Task ``i`` of round ``r`` gets ``item="<r>.<i>"``: its place in the run, the name of
#: its journal row. The LLM worker's loop is keyed by that place (``round2:task2``).
REPLAN_ROUNDS: list[list[tuple[str, bool]]] = [
    [("work", True), ("work", True), ("work", True), ("work", False)],
    [("work", True), ("work", True), ("helper", True), ("work", False)],
    [("work", True), ("work", True)],
]
#: Where the LLM worker runs: its model calls log under ``<run>~round2.task2``.
REPLAN_HELPER = "round2.task2"


def _replan_round(number: int, results: list[str]) -> PlanRound:
    """The planner's answer for round ``number`` (1, 2...), given the results (or errors)
    of every earlier task as the planner sees them."""
    seen = digest(*results)
    if number > len(REPLAN_ROUNDS):
        return PlanRound(reasoning="all done", done=True, final_answer=seen)
    tasks = []
    for i, (name, parallel) in enumerate(REPLAN_ROUNDS[number - 1]):
        kwargs = (
            {"task": f"{number}.{i} {seen}"}
            if name == "helper"
            else {"item": f"{number}.{i}", "seen": seen}
        )
        tasks.append(ReplanTask(tool=name, kwargs=kwargs, parallel=parallel))
    return PlanRound(reasoning=f"round {number}", tasks=tasks)


def _from_prompt(prompt: str) -> tuple[int, list[str]]:
    """The round an LLM planner is asked for, and the outcomes in its prompt's history."""
    marker = "This is round "
    number = int(prompt[prompt.rindex(marker) + len(marker) :].split()[0])
    return number, re.findall(r"\] \w+\(.*\) -> (.*)$", prompt, re.MULTILINE)


def build_replan(store: Store | None, log: str, run: str, *, llm_planner: bool) -> Agent:
    """A replan run of ``REPLAN_ROUNDS`` (then done): ``work`` tasks with side effects and
    one LLM worker (``helper``, on a scripted model, whose tools have side effects); the
    planner a function (logs ``plan:<round>``) or, ``llm_planner``, an LLM agent on a
    scripted model (logs ``model:0`` under ``<run>~round<n>.planner``)."""

    def work(item: str, seen: str) -> str:
        """Process one item with a side effect."""
        effect(log, run, f"task:{item}")
        return digest(item, seen)

    helper = scripted_agent(log, f"{run}~{REPLAN_HELPER}", SIMPLE_TURNS, name="helper")
    helper.description = "Does some work with tools."
    planner: Any
    if llm_planner:

        def script(request: ModelRequest) -> Any:
            number, results = _from_prompt(request.messages[-1].text)
            effect(log, f"{run}~round{number}.planner", f"model:{request.turn}")
            return _replan_round(number, results).model_dump()

        planner = Agent(name="planner", model=FunctionModel(script), output=PlanRound)
    else:

        def planner(round: int, history: list[dict[str, Any]]) -> PlanRound:
            effect(log, run, f"plan:{round}")
            results = [str(t.get("result", t.get("error"))) for r in history for t in r["tasks"]]
            return _replan_round(round, results)

    engine = ReplanEngine(
        store=store, checkpoint_key=run if store is not None else None, resume=store is not None
    )
    return Agent(engine=engine, tools=[planner, work, helper])


async def run_replan(store: Store | None, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    """OPTIONS: ``run`` (the checkpoint key), ``llm_planner`` (the planner an LLM agent).
    Every attempt resumes the run (a done one gives its final answer, guarantee 197)."""
    run = opts["run"]
    agent = build_replan(store, log, run, llm_planner=opts["llm_planner"])
    try:
        env = await agent.run("process every item")
    except ConcurrentRunError as exc:  # another process owns the run (guarantee 198)
        return {run: {"concurrent": str(exc)}}
    if not env.ok:
        assert env.error is not None
        return {run: {"error": env.error.to_dict()}}
    return {run: {"payload": env.payload}}


# -- targets of the queue scenarios (``tests.runner.torture_worker:<name>``) -----------------
def _queued_fold(payload: Any) -> dict[str, Any]:
    if isinstance(payload, str):
        payload = json.loads(payload)
    if "cfg" in payload:
        return dict(payload)
    parts = [payload[name] for name in sorted(payload)]
    return {**parts[0], "acc": digest(*(p["acc"] for p in parts))}


def _queued_step(name: str) -> Any:
    def fn(env: Envelope[Any]) -> dict[str, Any]:
        data = _queued_fold(env.payload)
        cfg = data["cfg"]
        effect(cfg["log"], cfg["run"], f"{name}@{env.metadata['iteration']}")
        return {**data, "acc": digest(data.get("acc", ""), name)}

    fn.__name__ = name
    return fn


def queued_task(log: str, run: str) -> str:
    """The task of a queued Plan or agent run: its log and its name, as JSON."""
    return json.dumps({"cfg": {"log": log, "run": run}})


queued_plan = Plan(
    *(Step(_queued_step(f"q{i}")) for i in range(4)),
    *(Step(_queued_step(f"p{i}"), parallel=True) for i in range(3)),
    *(Step(_queued_step(f"r{i}")) for i in range(4)),
)

queued_graph = build_graph()


def queued_agent() -> Agent:
    """A factory target: the run's log and name are in its task (its first user message),
    which the model reads back from the request."""

    def script(request: ModelRequest) -> Any:
        cfg = json.loads(request.messages[0].text)["cfg"]
        effect(cfg["log"], cfg["run"], f"model:{request.turn}")
        if request.turn < len(SIMPLE_TURNS):
            calls = [call(t, item=item, log=cfg["log"]) for t, item in SIMPLE_TURNS[request.turn]]
            return Reply(tool_calls=calls)
        results = [r.content for m in request.messages for r in m.tool_results if not r.is_error]
        return f"done: {digest(*results)}"

    @tool
    def work(item: str, log: str, ctx: ToolContext) -> str:
        """Do some work with a side effect."""
        _tool_effect(log, ctx)
        return f"worked {item}"

    return Agent(name="queued", model=FunctionModel(script), tools=[work])


# -- the script -------------------------------------------------------------------------------
async def _main(scenario: str, where: str, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    store = open_store(where, opts)
    print("ready", flush=True)
    try:
        if scenario == "plan":
            return await run_plans(store, log, opts)
        if scenario == "graph":
            return await run_graph(store, log, opts)
        if scenario == "replan":
            return await run_replan(store, log, opts)
        return await run_agent(store, log, opts)
    finally:
        store.close()


def main() -> None:
    scenario, where, log, raw = sys.argv[1:5]
    opts: dict[str, Any] = json.loads(raw)
    if scenario == "plan" and not opts.get("gather"):
        with open_store(where, opts) as store:
            print("ready", flush=True)
            result = plans_sync(store, log, opts)
    else:
        result = asyncio.run(_main(scenario, where, log, opts))
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
