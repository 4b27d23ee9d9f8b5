"""ReplanEngine on PostgreSQL: mid-round resume, the record, ownership."""

from __future__ import annotations

import pytest

from stepstone import Agent, PlanRound, ReplanEngine, Store, Task, Tool
from tests.engines.replan.test_replan import Flaky, Script, _round_of, done, named

pytestmark = pytest.mark.postgres


def test_failed_task_resumes_mid_round_on_postgres(pg_url: str) -> None:
    # guarantee 191, 192, 196
    flaky = Flaky()
    flaky.fail = {"c"}
    script = Script(_round_of(["a", "b", "c"]), _round_of(["d"]), done("pg"))
    with Store(url=pg_url) as store:
        opts = {"store": store, "checkpoint_key": "pg-mid"}
        first = Agent(
            engine=ReplanEngine(**opts), tools=[script.planner_tool(), named("work", flaky.work)]
        )
        env = first("go")
        assert env.error is not None and env.error.type == "ConnectionError"
        record = store.read("pg-mid")
        assert record["status"] == "failed" and record["round"] == 1
        assert [t.get("result") for t in record["rounds"][0]["tasks"]] == ["A", "B", None]
        again = Agent(
            engine=ReplanEngine(resume=True, **opts),
            tools=[script.planner_tool(), named("work", flaky.work)],
        )("go")
        assert again.ok and again.payload == "pg"
        record = store.read("pg-mid")
    assert sorted(flaky.calls) == ["a", "b", "c", "c", "d"]
    assert [c["round"] for c in script.calls] == [1, 2, 3]
    assert record["status"] == "done" and record["final_answer"] == "pg"
    assert [r["round"] for r in record["rounds"]] == [1, 2, 3]
    assert record["rounds"][1]["tasks"][0]["result"] == "D"


def test_a_typed_result_survives_resume_on_postgres(pg_url: str) -> None:
    # guarantee 196
    def planner(round: int, history: list[dict[str, object]]) -> PlanRound:
        if round == 1:
            return PlanRound(reasoning="r", tasks=[Task(tool="stats", kwargs={"n": 3})])
        return PlanRound(reasoning="d", done=True, final_answer=str(history[0]["tasks"]))

    def stats(n: int) -> dict[str, object]:
        """Numbers."""
        return {"n": n, "squares": [i * i for i in range(n)], "none": None}

    with Store(url=pg_url) as store:
        env = Agent(
            engine=ReplanEngine(store=store, checkpoint_key="pg-typed"),
            tools=[Tool.from_function(planner, name="planner"), stats],
        )("go")
        assert env.ok
        record = store.read("pg-typed")
    assert record["rounds"][0]["tasks"][0]["result"] == {
        "n": 3,
        "squares": [0, 1, 4],
        "none": None,
    }
