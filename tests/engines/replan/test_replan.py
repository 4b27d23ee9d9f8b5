"""ReplanEngine: planner rounds, parallel and sequential tasks, errors, durable resume."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Agent,
    ConcurrentRunError,
    LLMEngine,
    Plan,
    PlanCompileError,
    PlanPaused,
    PlanRound,
    ReplanEngine,
    ReplanTask,
    Step,
    Store,
    StoreKeyConflictError,
    Task,
    Tool,
)
from stepstone.exceptions import MaxRoundsExceeded, PlannerOutputError
from stepstone.testing import FakeModel, FunctionModel


class Script:
    """A function planner answering from a list of PlanRounds, recording what it got."""

    def __init__(self, *rounds: PlanRound) -> None:
        self.rounds = list(rounds)
        self.calls: list[dict[str, Any]] = []

    def planner(self, task: str, history: list[dict[str, Any]], round: int) -> PlanRound:
        self.calls.append({"task": task, "history": history, "round": round})
        return self.rounds[round - 1]

    def planner_tool(self) -> Tool:
        return Tool.from_function(self.planner, name="planner")


def done(answer: str = "finished") -> PlanRound:
    return PlanRound(reasoning="that is all", done=True, final_answer=answer)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(text: str, times: int = 1) -> str:
    """Repeat text."""
    return text * times


def named(name: str, fn: Any) -> Tool:
    return Tool.from_function(fn, name=name)


def agent_for(script: Script, *tools: Any, **engine: Any) -> Agent:
    return Agent(engine=ReplanEngine(**engine), tools=[script.planner_tool(), *tools])


# -- construction ----------------------------------------------------------------------
def test_constructor_defaults_and_aliases() -> None:
    # guarantee 75
    eng = ReplanEngine()
    assert (eng.planner_name, eng.store, eng.checkpoint_key, eng.resume, eng.max_rounds) == (
        "planner",
        None,
        None,
        False,
        20,
    )
    assert ReplanTask is Task
    assert Task(tool="x", kwargs={"a": 1}).parallel is True
    assert PlanRound(reasoning="r").tasks == [] and PlanRound(reasoning="r").done is False


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_rounds": 0}, "max_rounds=0"),
        ({"max_rounds": True}, "max_rounds=True"),
        ({"planner_name": ""}, "planner_name=''"),
        ({"store": Store()}, "checkpoint_key= is missing"),
        ({"checkpoint_key": "k"}, "store= is missing"),
        ({"resume": True}, "resume=True) needs store="),
    ],
)
def test_bad_configuration_is_refused_at_construction(kwargs: dict[str, Any], needle: str) -> None:
    # guarantee 199
    with pytest.raises(PlanCompileError, match=re.escape(needle)):
        ReplanEngine(**kwargs)


def test_missing_planner_and_unusable_function_planner_fail_at_agent_construction() -> None:
    # guarantee 199
    with pytest.raises(PlanCompileError, match=r"no tool named 'boss'.*tools: add"):
        Agent(engine=ReplanEngine(planner_name="boss"), tools=[add])

    def planner(task: str, budget: int) -> PlanRound:
        return done()

    with pytest.raises(PlanCompileError, match=r"requires argument\(s\) \['budget'\]"):
        Agent(engine=ReplanEngine(), tools=[planner, add])


# -- the loop ---------------------------------------------------------------------------
def test_rounds_planner_input_and_final_answer() -> None:
    # guarantee 71, 72, 74
    script = Script(
        PlanRound(
            reasoning="two sums",
            tasks=[
                Task(tool="add", kwargs={"a": 1, "b": 2}),
                Task(tool="echo", kwargs={"text": "ab", "times": 2}),
            ],
        ),
        PlanRound(reasoning="use them", tasks=[Task(tool="add", kwargs={"a": 3, "b": 4})]),
        done("3, abab, 7"),
    )
    env = agent_for(script, add, echo)("compute things")
    assert env.ok and env.payload == "3, abab, 7"
    assert env.metadata["rounds"] == 3
    assert [c["round"] for c in script.calls] == [1, 2, 3]  # once per round
    first, third = script.calls[0], script.calls[2]
    # The engine writes the planner's input: the task, every worker's name and schema...
    assert first["task"].startswith("Task:\ncompute things")
    assert "- add: Add two integers." in first["task"]
    assert '"required": ["a", "b"]' in first["task"] and "- echo: Repeat text." in first["task"]
    assert "- planner" not in first["task"]  # the planner is not offered to itself
    assert first["history"] == []
    # ...and the history of earlier rounds with every task's tool, kwargs and result.
    assert third["history"][0]["tasks"][1] == {
        "tool": "echo",
        "kwargs": {"text": "ab", "times": 2},
        "parallel": True,
        "result": "abab",
    }
    assert third["history"][1]["tasks"][0]["result"] == 7
    assert '[1.1] echo({"text": "ab", "times": 2}) -> result: abab' in third["task"]


def test_tools_are_resolved_at_run_time_from_the_agent() -> None:
    # guarantee 72
    script = Script(
        PlanRound(reasoning="r", tasks=[Task(tool="add", kwargs={"a": 1, "b": 1})]), done()
    )
    engine = ReplanEngine()
    first = Agent(engine=engine, tools=[script.planner_tool(), add])

    def add2(a: int, b: int) -> int:
        return a + b + 100

    second = Agent(engine=engine, tools=[script.planner_tool(), named("add", add2)])
    assert first("x").ok and second("x").ok
    results = [c["history"][0]["tasks"][0]["result"] for c in script.calls if c["round"] == 2]
    assert results == [2, 102]


def test_parallel_tasks_run_together_and_sequential_ones_after_in_order() -> None:
    # guarantee 73
    order: list[str] = []
    barrier = threading.Barrier(3, timeout=30)

    def meet(name: str) -> str:
        """Wait until the three parallel tasks are all running."""
        barrier.wait()  # raises BrokenBarrierError unless all three run at once
        order.append(f"p:{name}")
        return name

    def after(name: str) -> str:
        """Runs after the parallel group."""
        order.append(f"s:{name}")
        return name

    tasks = [
        Task(tool="after", kwargs={"name": "1"}, parallel=False),
        Task(tool="meet", kwargs={"name": "a"}),
        Task(tool="after", kwargs={"name": "2"}, parallel=False),
        Task(tool="meet", kwargs={"name": "b"}),
        Task(tool="meet", kwargs={"name": "c"}),
        Task(tool="after", kwargs={"name": "3"}, parallel=False),
    ]
    script = Script(PlanRound(reasoning="fan out", tasks=tasks), done())
    env = agent_for(script, meet, after)("go")
    assert env.ok, env.error
    assert sorted(order[:3]) == ["p:a", "p:b", "p:c"]
    assert order[3:] == ["s:1", "s:2", "s:3"]


def test_async_tools_run_concurrently_too() -> None:
    # guarantee 73
    started: list[str] = []
    both = asyncio.Event()

    async def wait_for_peer(name: str) -> str:
        """Finish only once both tasks have started."""
        started.append(name)
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), timeout=30)
        return name

    tasks = [Task(tool="wait_for_peer", kwargs={"name": n}) for n in ("x", "y")]
    script = Script(PlanRound(reasoning="r", tasks=tasks), done())
    assert agent_for(script, wait_for_peer)("go").ok


def test_unknown_tool_and_bad_kwargs_become_errors_the_planner_sees() -> None:
    # guarantee 193
    script = Script(
        PlanRound(
            reasoning="try things",
            tasks=[
                Task(tool="nope", kwargs={}),
                Task(tool="add", kwargs={"a": "x", "b": 1}),
                Task(tool="add", kwargs={"a": 1, "b": 2, "c": 3}),
                Task(tool="planner", kwargs={}),
                Task(tool="add", kwargs={"a": 1, "b": 2}),
            ],
        ),
        done(),
    )
    env = agent_for(script, add)("go")
    assert env.ok and env.payload == "finished"
    seen = script.calls[1]["history"][0]["tasks"]
    assert seen[0]["error"]["type"] == "UnknownTool"
    assert "'nope' is not a tool of this agent; the tools are: add" in seen[0]["error"]["message"]
    assert seen[1]["error"] == {
        "type": "InvalidArguments",
        "message": "add: a: Input should be a valid integer, unable to parse string as an integer",
    }
    assert "unexpected argument(s) ['c']" in seen[2]["error"]["message"]
    assert "is the planner itself" in seen[3]["error"]["message"]
    assert seen[4]["result"] == 3
    assert "[1.0] nope({}) -> error UnknownTool" in script.calls[1]["task"]


def test_kwargs_go_verbatim_to_a_tool_taking_var_kwargs() -> None:
    # guarantee 74
    got: list[dict[str, Any]] = []

    def record(**kwargs: Any) -> str:
        """Record the arguments."""
        got.append(kwargs)
        return "ok"

    script = Script(
        PlanRound(reasoning="r", tasks=[Task(tool="record", kwargs={"x": [1], "y": {"z": None}})]),
        done(),
    )
    assert agent_for(script, record)("go").ok
    assert got == [{"x": [1], "y": {"z": None}}]


def test_max_rounds_is_an_error_envelope_naming_the_limit(tmp_path: Path) -> None:
    # guarantee 194
    forever = PlanRound(reasoning="more", tasks=[Task(tool="add", kwargs={"a": 1, "b": 1})])
    script = Script(*[forever] * 3, done("late"))
    with Store(db=tmp_path / "r.sqlite") as store:
        agent = agent_for(script, add, max_rounds=2, store=store, checkpoint_key="loop")
        env = agent("go")
        assert not env.ok and env.error is not None
        assert env.error.type == "MaxRoundsExceeded"
        assert "max_rounds=2" in env.error.message and "'planner'" in env.error.message
        record = store.read("loop")
        assert record["status"] == "failed" and record["round"] == 2
        assert record["error"]["type"] == "MaxRoundsExceeded"
        # A resume with more rounds continues from round 3, without re-asking rounds 1-2.
        more = agent_for(script, add, max_rounds=5, store=store, checkpoint_key="loop", resume=True)
        env2 = more("go")
        assert env2.ok and env2.payload == "late"
        assert [c["round"] for c in script.calls] == [1, 2, 3, 4]
    assert issubclass(MaxRoundsExceeded, Exception)


@pytest.mark.parametrize("answer", [{"reasoning": "a dict"}, "just text", None])
def test_planner_returning_something_else_is_an_error_naming_it(answer: Any) -> None:
    # guarantee 195
    def planner(task: str) -> Any:
        return answer

    env = Agent(engine=ReplanEngine(), tools=[planner, add])("go")
    assert not env.ok and env.error is not None
    assert env.error.type == PlannerOutputError.__name__
    assert "planner 'planner' returned" in env.error.message
    assert type(answer).__name__ in env.error.message and "not a PlanRound" in env.error.message
    assert "output=PlanRound" in env.error.message


def test_llm_planner_with_structured_output() -> None:
    # guarantee 71, 72
    model = FakeModel(
        [
            {"reasoning": "sum first", "tasks": [{"tool": "add", "kwargs": {"a": 2, "b": 3}}]},
            {"reasoning": "done", "done": True, "final_answer": "five"},
        ]
    )
    planner = Agent(engine=LLMEngine(model), name="planner", output=PlanRound)
    env = Agent(engine=ReplanEngine(), tools=[planner, add])("add two and three")
    assert env.ok and env.payload == "five"
    second = model.requests[1].messages[-1].text
    assert second.startswith("Task:\nadd two and three")
    assert '[1.0] add({"a": 2, "b": 3}) -> result: 5' in second
    # Without output=PlanRound the planner answers text: a clear error, not a crash.
    text_planner = Agent(engine=LLMEngine(FakeModel(["plan: add"])), name="planner")
    bad = Agent(engine=ReplanEngine(), tools=[text_planner, add])("go")
    assert bad.error is not None and bad.error.type == "PlannerOutputError"
    assert "returned str 'plan: add'" in bad.error.message


def test_agent_workers_and_a_plan_as_a_tool() -> None:
    # guarantee 74
    writer = Agent(engine=LLMEngine(FakeModel(["a draft"])), name="writer")
    pipeline = Agent(engine=Plan(Step(lambda p: f"<{p}>", name="wrap")), name="wrapper")
    script = Script(
        PlanRound(
            reasoning="delegate",
            tasks=[
                Task(tool="writer", kwargs={"task": "draft it"}),
                Task(tool="wrapper", kwargs={"task": "x"}),
            ],
        ),
        done(),
    )
    env = agent_for(script, writer, pipeline)("go")
    assert env.ok
    assert [t["result"] for t in script.calls[1]["history"][0]["tasks"]] == ["a draft", "<x>"]


# -- durability -------------------------------------------------------------------------
def test_record_shape_after_each_round(tmp_path: Path) -> None:
    # guarantee 71, 196
    seen: list[dict[str, Any]] = []
    store = Store(db=tmp_path / "r.sqlite")

    def planner(round: int) -> PlanRound:
        if round > 1:
            seen.append(store.read("shape"))
            return done("ok")
        return PlanRound(
            reasoning="one of each",
            tasks=[Task(tool="add", kwargs={"a": 1, "b": 2}), Task(tool="ghost", kwargs={})],
        )

    with store:
        env = Agent(engine=ReplanEngine(store=store, checkpoint_key="shape"), tools=[planner, add])(
            "the task"
        )
        assert env.ok and env.metadata["checkpoint_key"] == "shape"
        # Round 1 was committed before the planner was asked for round 2.
        assert seen[0]["status"] == "running" and seen[0]["round"] == 1
        assert seen[0]["next_step"] == "round 2"
        record = store.read("shape")
        entry = store.read_entry("shape")
    assert entry is not None and entry.kind == "checkpoint" and entry.run_kind == "replan"
    assert record == {
        "status": "done",
        "round": 2,
        "rounds": [
            {
                "round": 1,
                "reasoning": "one of each",
                "tasks": [
                    {"tool": "add", "kwargs": {"a": 1, "b": 2}, "parallel": True, "result": 3},
                    {
                        "tool": "ghost",
                        "kwargs": {},
                        "parallel": True,
                        "error": {
                            "type": "UnknownTool",
                            "message": "tool 'ghost' is not a tool of this agent; the tools "
                            "are: add",
                        },
                    },
                ],
            },
            {
                "round": 2,
                "reasoning": "that is all",
                "tasks": [],
                "done": True,
                "final_answer": "ok",
            },
        ],
        "final_answer": "ok",
        "task": "the task",
        "next_step": None,
        "error": None,
        "run_uid": env.metadata["run_uid"],
        "checkpoint_version": 1,
    }


class Flaky:
    """Workers whose calls are counted; ``fail`` names the inputs that raise once."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: set[str] = set()
        self.pause: set[str] = set()

    def work(self, item: str) -> str:
        """Process one item."""
        self.calls.append(item)
        if item in self.fail:
            self.fail.discard(item)
            raise ConnectionError(f"upstream down for {item}")
        if item in self.pause:
            self.pause.discard(item)
            raise PlanPaused(f"waiting for approval of {item}")
        return item.upper()


def _round_of(items: list[str], sequential: tuple[str, ...] = ()) -> PlanRound:
    return PlanRound(
        reasoning="items",
        tasks=[Task(tool="work", kwargs={"item": i}, parallel=i not in sequential) for i in items],
    )


def test_failed_task_resumes_mid_round_without_rerunning_siblings(tmp_path: Path) -> None:
    # guarantee 191, 192
    flaky = Flaky()
    flaky.fail = {"b"}
    script = Script(_round_of(["a", "b", "c", "d"], sequential=("d",)), done("all"))
    with Store(db=tmp_path / "r.sqlite") as store:
        opts = {"store": store, "checkpoint_key": "mid"}
        env = agent_for(script, named("work", flaky.work), **opts)("go")
        assert not env.ok and env.error is not None
        assert env.error.type == "ConnectionError" and "upstream down for b" in env.error.message
        assert env.metadata["round"] == 1 and env.metadata["task"] == 1
        assert env.metadata["tool"] == "work"
        record = store.read("mid")
        assert record["status"] == "failed" and record["next_step"] == "round 1"
        assert record["error"]["task"] == 1
        tasks = record["rounds"][0]["tasks"]
        assert [t.get("result") for t in tasks] == ["A", None, "C", None]
        assert tasks[1].get("pending") and tasks[3].get("pending")  # d never ran
        assert sorted(flaky.calls) == ["a", "b", "c"]
        again = agent_for(script, named("work", flaky.work), resume=True, **opts)("go")
        assert again.ok and again.payload == "all"
    assert sorted(flaky.calls) == ["a", "b", "b", "c", "d"]  # only b again, then d
    assert [c["round"] for c in script.calls] == [1, 2]  # round 1 not re-planned


def test_a_task_returning_an_error_envelope_fails_the_run(tmp_path: Path) -> None:
    # guarantee 192, 402: before, the envelope was stored as the task's result and the run
    # could finish ok
    from stepstone import Envelope, ErrorInfo

    down = {"on": True}

    def lookup(item: str) -> Any:
        """Look an item up."""
        if down["on"]:
            info = ErrorInfo(type="LookupFailed", message=f"no record of {item}")
            return Envelope(task=item, payload=None, error=info)
        return item.upper()

    script = Script(_round_of(["a", "b"], sequential=("b",)), done("all"))
    with Store(db=tmp_path / "r.sqlite") as store:
        opts = {"store": store, "checkpoint_key": "env"}
        env = agent_for(script, named("work", lookup), **opts)("go")
        assert not env.ok and env.error is not None
        assert (env.error.type, env.error.message) == ("LookupFailed", "no record of a")
        assert (env.metadata["round"], env.metadata["task"], env.metadata["tool"]) == (1, 0, "work")
        record = store.read("env")
        assert record["status"] == "failed" and record["next_step"] == "round 1"
        assert record["error"]["type"] == "LookupFailed" and record["error"]["task"] == 0
        assert [t.get("result") for t in record["rounds"][0]["tasks"]] == [None, None]
        down["on"] = False
        again = agent_for(script, named("work", lookup), resume=True, **opts)("go")
        assert again.ok and again.payload == "all"
        tasks = store.read("env")["rounds"][0]["tasks"]
        assert [t.get("result") for t in tasks] == ["A", "B"]


def test_paused_task_pauses_the_run_and_resumes_at_it(tmp_path: Path) -> None:
    # guarantee 192
    flaky = Flaky()
    flaky.pause = {"b"}
    script = Script(_round_of(["a", "b"], sequential=("b",)), done("approved"))
    with Store(db=tmp_path / "r.sqlite") as store:
        opts = {"store": store, "checkpoint_key": "p"}
        env = agent_for(script, named("work", flaky.work), **opts)("go")
        assert env.error is not None and env.error.type == "PlanPaused"
        assert env.error.retryable and "approval of b" in env.error.message
        assert store.read("p")["status"] == "paused"
        again = agent_for(script, named("work", flaky.work), resume=True, **opts)("go")
        assert again.payload == "approved"
    assert flaky.calls == ["a", "b", "b"]


def test_failing_planner_fails_the_round_and_resume_asks_again(tmp_path: Path) -> None:
    # guarantee 195
    answers: list[Any] = [RuntimeError("model overloaded"), done("second try")]

    def planner(round: int) -> PlanRound:
        item = answers.pop(0)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]

    with Store(db=tmp_path / "r.sqlite") as store:
        opts = {"store": store, "checkpoint_key": "pl"}
        env = Agent(engine=ReplanEngine(**opts), tools=[planner])("go")
        assert env.error is not None and env.error.type == "RuntimeError"
        assert env.metadata["step"] == "planner" and env.metadata["round"] == 1
        assert store.read("pl")["status"] == "failed"
        again = Agent(engine=ReplanEngine(resume=True, **opts), tools=[planner])("go")
        assert again.payload == "second try"


def test_llm_planner_and_worker_inside_a_durable_plan_step_resume(tmp_path: Path) -> None:
    # guarantee 191, 192: the LLM loops of the planner and of each task journal under keys
    # of their position in the replan run. Before, they numbered the loops they started:
    # on resume the planner's answer was replayed, so the worker took the planner's key and
    # the run was stuck for good ("already exists with another user_message")
    down = [True]

    def worker_model(request: Any) -> str:
        if down[0]:
            raise ValueError("worker model down")
        return "dug up 3 facts"

    dig = {"tool": "worker", "kwargs": {"task": "dig"}}
    planner_model = FakeModel([  # one script for both runs: each round is asked once
        {"reasoning": "ask the worker", "tasks": [dig]},
        {"reasoning": "enough", "done": True, "final_answer": "3 facts"},
    ])  # fmt: skip

    def build() -> Agent:
        planner = Agent(engine=LLMEngine(planner_model), name="planner", output=PlanRound)
        worker = Agent(
            engine=LLMEngine(FunctionModel(worker_model), max_retries=0),
            name="worker",
            description="Digs.",
        )
        research = Agent(
            engine=ReplanEngine(store=store, checkpoint_key="inner", resume=True),
            tools=[planner, worker],
            name="research",
        )
        plan = Plan(Step("research", writes="r"), store=store, checkpoint_key="outer", resume=True)
        return Agent(engine=plan, tools=[research])

    with Store(db=tmp_path / "r.sqlite") as store:
        first = build()("investigate")
        assert (
            not first.ok and first.error is not None and "worker model down" in first.error.message
        )
        down[0] = False
        again = build()("investigate")
        assert again.ok, again.error
        assert again.payload == "3 facts" and store.read("inner")["status"] == "done"
        assert len(planner_model.requests) == 2
        origin = store.backend.run_get("inner").meta["origin"]  # type: ignore[union-attr]
        loops = [k for k in store.keys(prefix="inner:") if k.endswith(":llm")]
        assert loops == [
            f"inner:{origin}:round1:planner:llm",
            f"inner:{origin}:round1:task0:llm",
            f"inner:{origin}:round2:planner:llm",
        ]


def test_resume_on_done_returns_the_cached_answer(tmp_path: Path) -> None:
    # guarantee 197
    script = Script(_round_of(["a"]), done("cached"))
    flaky = Flaky()
    with Store(db=tmp_path / "r.sqlite") as store:
        opts = {"store": store, "checkpoint_key": "d"}
        assert agent_for(script, named("work", flaky.work), **opts)("go").payload == "cached"
        env = agent_for(script, named("work", flaky.work), resume=True, **opts)("go")
        assert env.payload == "cached" and env.metadata["cached"] is True
        assert env.metadata["rounds"] == 2
        assert len(script.calls) == 2 and flaky.calls == ["a"]
        # resume=False starts over.
        fresh = agent_for(script, named("work", flaky.work), **opts)("go")
        assert fresh.payload == "cached" and "cached" not in fresh.metadata
        assert len(script.calls) == 4 and flaky.calls == ["a", "a"]


def test_ownership_statuses_and_kind_conflicts(tmp_path: Path) -> None:
    # guarantee 198
    statuses: list[str] = []
    store = Store(db=tmp_path / "r.sqlite")

    def planner(round: int) -> PlanRound:
        statuses.append(store.read("own")["status"])
        # A second run on the same key while this one is live is refused.
        with pytest.raises(ConcurrentRunError, match="'own' is owned by live run"):
            Agent(engine=ReplanEngine(store=store, checkpoint_key="own"), tools=[planner])("x")
        return done()

    with store:
        assert Agent(engine=ReplanEngine(store=store, checkpoint_key="own"), tools=[planner])(
            "x"
        ).ok
        assert statuses == ["claimed"] and store.read("own")["status"] == "done"
        Agent(engine=Plan(Step(lambda p: 1, name="s"), store=store, checkpoint_key="plan-run"))("x")
        with pytest.raises(StoreKeyConflictError, match="holds a plan run, not a replan run"):
            Agent(engine=ReplanEngine(store=store, checkpoint_key="plan-run"), tools=[planner])("x")


def test_inspect_shows_the_rounds(tmp_path: Path) -> None:
    # guarantee 196
    from typer.testing import CliRunner

    from stepstone.cli import app

    flaky = Flaky()
    flaky.fail = {"b"}
    script = Script(_round_of(["a", "b", "c"], sequential=("c",)), done())
    db = tmp_path / "r.sqlite"
    with Store(db=db) as store:
        agent_for(script, named("work", flaky.work), store=store, checkpoint_key="insp")("go")
    result = CliRunner().invoke(app, ["inspect", "--db", str(db), "insp"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "insp  replan run  status failed  next step round 1" in out
    assert "round 1: items" in out
    assert "work (sequential)" in out and '"A"' in out
    assert "stopped the run (see error)" in out and "pending" in out
    assert "ConnectionError: upstream down for b" in out


def test_a_corrupt_record_names_its_key(tmp_path: Path) -> None:
    # guarantee 196
    from stepstone.durable import claim_run
    from stepstone.exceptions import CheckpointCorruptError

    with Store(db=tmp_path / "r.sqlite") as store:
        claim = claim_run(store, "bad", kind="replan", resume=False, first_step="round 1")
        assert claim.run is not None
        claim.run.commit_sync(
            status="failed", next_step="round 1", rows=[("task", "3.0", {"round": 3, "index": 0})]
        )
        claim.run.release()
        with pytest.raises(CheckpointCorruptError, match=r"'bad' is corrupt.*unknown round"):
            store.read("bad")
        script = Script(done())
        before = store.backend.run_get("bad")
        with pytest.raises(CheckpointCorruptError, match=r"store.delete\('bad'\)"):
            agent_for(script, store=store, checkpoint_key="bad", resume=True)("go")
        assert store.backend.run_get("bad") == before  # refused before the claim (132)
        # A lost row is found by the head's count, before the claim too.
        store.backend.kv_delete("bad")
        claim = claim_run(store, "bad", kind="replan", resume=False, first_step="round 1")
        assert claim.run is not None
        claim.run.commit_sync(status="failed", next_step="round 1", rows=[("start", None, {})])
        claim.run.release()
        with contextlib.closing(sqlite3.connect(tmp_path / "r.sqlite")) as con, con:
            con.execute("UPDATE stepstone_runs SET journal_len = 2 WHERE key = 'bad'")
        con.close()
        before = store.backend.run_get("bad")
        with pytest.raises(CheckpointCorruptError, match=r"rows \[1\] are missing"):
            agent_for(script, store=store, checkpoint_key="bad", resume=True)("go")
        assert store.backend.run_get("bad") == before
        # A field name a flipped byte changed is never skipped (131).
        plan = {"reasoning": "r", "tasks": [{"tool": "x"}]}
        for start, task, what in (
            ("go", {"round": 1, "index": 0, "tool": "x", "resulX": 5}, r"\['resulX'\]"),
            ("go", {"round": 1, "index": 0, "tool": "x"}, "no one result or error"),
            ("go", {"round": 1, "index": 0, "tool": "y", "result": 1}, "planned 'x' there"),
            (7, {"round": 1, "index": 0, "tool": "x", "result": 1}, "task is not text"),
        ):
            store.backend.kv_delete("bad")
            claim = claim_run(store, "bad", kind="replan", resume=False, first_step="round 1")
            assert claim.run is not None
            rows = [("start", None, {"task": start}), ("round", "1", {"round": 1, "plan": plan})]
            claim.run.commit_sync(
                status="failed", next_step="round 1", rows=[*rows, ("task", "1.0", task)]
            )
            claim.run.release()
            with pytest.raises(CheckpointCorruptError, match=what):
                store.read("bad")
        # The key was released: after a delete, a fresh run works at once.
        store.delete("bad")
        assert agent_for(script, store=store, checkpoint_key="bad")("go").ok


def test_session_sees_planner_tasks_and_checkpoints(tmp_path: Path) -> None:
    # guarantee 71
    from stepstone import EventType, Session

    session = Session()
    script = Script(_round_of(["a", "b"]), done())
    flaky = Flaky()
    with Store(db=tmp_path / "r.sqlite") as store:
        agent = Agent(
            engine=ReplanEngine(store=store, checkpoint_key="ev"),
            tools=[script.planner_tool(), named("work", flaky.work)],
            session=session,
        )
        env = agent("go")
    starts = [
        (e.payload["step"], e.payload["round"]) for e in session.of_type(EventType.STEP_START)
    ]
    assert starts[0] == ("planner", 1) and starts[-1] == ("planner", 2)
    assert sorted(starts[1:3]) == [("work", 1), ("work", 1)]
    checkpoints = session.of_type(EventType.CHECKPOINT)
    # one per planner answer and one per task outcome
    assert [e.payload["status"] for e in checkpoints] == ["running"] * 3 + ["done"]
    assert {e.run_id for e in checkpoints} == {env.metadata["run_uid"]}
