"""The replan journal round-trips: rows written by the engine replay to the same rounds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stepstone.core._serialization import dumps, to_typed_json
from stepstone.engines.replan._record import Round, replay, task_row
from stepstone.engines.replan._schema import PlanRound, Task
from stepstone.store._base import JournalRow

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
tasks = st.builds(
    Task,
    tool=st.text(min_size=1, max_size=6),
    kwargs=st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    parallel=st.booleans(),
)
outcome = st.one_of(
    json_values.map(lambda v: {"result": to_typed_json(v)}),
    st.builds(
        lambda t, m: {"error": {"type": t, "message": m}}, st.text(max_size=6), st.text(max_size=12)
    ),
    st.none(),  # still pending
)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[PlanRound, list[dict[str, Any] | None]]]:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        plan = PlanRound(
            reasoning=draw(st.text(max_size=10)), tasks=draw(st.lists(tasks, max_size=4))
        )
        outs = [draw(outcome) for _ in plan.tasks]
        out.append((plan, outs))
    return out


@settings(max_examples=60, deadline=None)
@given(runs())
def test_journal_round_trip(rounds: list[tuple[PlanRound, list[dict[str, Any] | None]]]) -> None:
    # guarantee 191, 196
    rows: list[tuple[str, str | None, Any]] = [("start", None, {"task": "t"})]
    expected: list[Round] = []
    for number, (plan, outs) in enumerate(rounds, 1):
        rnd = Round(number, plan)
        rows.append(rnd.row())
        for index, out in enumerate(outs):
            if out is not None:
                rnd.outcomes[index] = out
                rows.append(task_row(number, index, plan.tasks[index].tool, out))
        expected.append(rnd)
    journal = [JournalRow(i, kind, name, dumps(data)) for i, (kind, name, data) in enumerate(rows)]
    rep = replay("k", journal)
    assert rep.task == "t"
    assert [r.history() for r in rep.rounds] == [r.history() for r in expected]
    assert [r.plan for r in rep.rounds] == [r.plan for r in expected]
