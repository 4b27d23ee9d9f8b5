"""Agent journal formats: what a run shows stays the same whatever format wrote it.

The fixture holds runs journaled by the first agent journal format and every view of them
as that stepstone showed them (see ``agent_runs.py``).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from stepstone import Runner, Store
from stepstone.store import Claim, JournalRow, RunHead
from tests.durable.agent_runs import RAN, approval_agent, crash_agent, views, write_runs

FIXTURE = Path(__file__).with_name("fixtures") / "agent_journal_v1.json.gz"


def frozen() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    return data


def load_frozen(store: Store) -> None:
    """Put the fixture's runs, heads and journal rows as they were written, in ``store``."""
    for run in frozen()["runs"]:
        head = RunHead(**run["head"])
        rows = [JournalRow(*r) for r in run["rows"]]
        store.backend.run_transact(
            head.key, lambda h, kv, head=head, rows=rows: Claim(head=head, rows=rows)
        )


# (the times of each row's commit, and those derived from them, too: guarantees 420, 421)
_TIMES = {
    "timestamp_ms",
    "started_at_s",
    "at_ms",
    "started_at",
    "committed_at",
    "duration_seconds",
    "gap_seconds",
}
_ORIGIN = re.compile(r"plan:[0-9a-f]{12}:llm")


def _untimed(value: Any) -> Any:
    """``value`` with every time a run took replaced (they differ from run to run)."""
    if isinstance(value, dict):
        return {k: 0 if k in _TIMES else _untimed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


#: Fields `show` gained for a model call since the fixture was frozen (its model and
#: tokens, for the inspector's turns): views of old runs show them too, as additions.
_ADDED_TO_EFFECTS = {"model", "input_tokens", "output_tokens", "usage"}


def as_frozen(shown: dict[str, Any]) -> dict[str, Any]:
    """``shown`` without the fields added to the views since the fixture was frozen."""
    out: dict[str, Any] = json.loads(json.dumps(shown))
    for key, entry in out.items():
        if key == "runs":
            continue
        for view in (entry, *(v for v in entry.values() if isinstance(v, dict))):
            agent = view.get("show", {}).get("agent") if isinstance(view, dict) else None
            for effect in (agent or {}).get("effects", ()):
                for field in _ADDED_TO_EFFECTS:
                    effect.pop(field, None)
    return out


def comparable(shown: dict[str, Any]) -> Any:
    """Views of runs with their times and the Plan's random origin taken out, and the count
    of journal rows (``steps``, the commits of a run in the current format)."""
    out = json.loads(_ORIGIN.sub("plan:ORIGIN:llm", json.dumps(_untimed(shown))))
    for key, entry in out.items():
        if key != "runs":
            entry["show"].pop("steps")
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (paths, at most 20), to read a failure."""
    if type(a) is not type(b):
        return [f"{path}: {a!r:.200} != {b!r:.200}"]
    if isinstance(a, dict):
        out = [f"{path}/{k}: only on one side" for k in set(a) ^ set(b)]
        if not out and list(a) != list(b):
            out.append(f"{path}: keys in another order {list(a)} != {list(b)}")
        for k in a:
            if k in b:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out[:20]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ][:20]
    return [] if a == b else [f"{path}: {a!r:.200} != {b!r:.200}"]


def test_runs_journaled_in_the_first_format_show_what_they_showed(tmp_path: Path) -> None:
    # guarantee 450
    with Store(db=tmp_path / "old.sqlite") as store:
        load_frozen(store)
        shown = as_frozen(views(store))
    assert shown == frozen()["views"], differences(shown, frozen()["views"])


def test_the_same_runs_show_the_same_views_in_the_current_format(tmp_path: Path) -> None:
    # guarantee 450
    db = tmp_path / "new.sqlite"
    write_runs(db)
    with Store(db=db) as store:
        shown = as_frozen(views(store))
    now, then = comparable(shown), comparable(frozen()["views"])
    assert now == then, differences(now, then)


def _kinds(store: Store, key: str) -> list[str]:
    return [row.kind for row in store.backend.run_journal(key)]


async def test_a_run_paused_in_the_first_format_resumes_in_the_current_one(
    tmp_path: Path,
) -> None:
    # guarantee 453
    key = "agent:approval-held:checkpoint:latest"
    with Store(db=tmp_path / "old.sqlite") as store:
        load_frozen(store)
        old = frozen()["views"][key]
        call_id = old["read"]["payload"]["terminal_result"]["pending_approvals"][0]["call_id"]
        runner = Runner(store=store)
        RAN.clear()
        done = await runner.resume(
            approval_agent(), run_id="approval-held", thread_id="t3", approvals={call_id: True}
        )
        assert done.state == "completed" and done.final_text == "refund handled"
        assert RAN == ["refund o-1"]  # lookup ran in the old run: replayed
        assert done.replayed_effect_count >= 2
        kinds = _kinds(store, key)
        assert "entries" not in kinds[: len(old["history"])]  # the old rows, kept
        assert set(kinds[len(old["history"]) :]) == {"entries"}  # then one row per commit
        chain = runner.checkpoints("approval-held")
        assert chain[: len(old["checkpoints"])] == old["checkpoints"]
        assert [c["phase"] for c in chain[len(old["checkpoints"]) :]][:1] == ["run_started"]
        assert chain[-1]["phase"] == "run_terminal" and store.read(key) == chain[-1]
        again = await runner.resume(approval_agent(), run_id="approval-held", thread_id="t3")
        assert again == done and RAN == ["refund o-1"]


async def test_a_run_killed_in_the_first_format_resumes_in_the_current_one(
    tmp_path: Path,
) -> None:
    # guarantee 453, 160: its tool call in doubt runs again (in_doubt="rerun"), the one
    # it finished before is replayed
    key = "agent:crash:checkpoint:latest"
    with Store(db=tmp_path / "old.sqlite") as store:
        load_frozen(store)
        RAN.clear()
        done = await Runner(store=store).resume(crash_agent(), run_id="crash", thread_id="t7")
        assert done.state == "completed" and done.final_text == "survived"
        assert RAN == ["explode 6"]
        assert [e["content"] for e in done.tool_executions] == [
            "value 5: " + "v" * 200,
            "exploded 6",
        ]
        snapshot = Runner(store=store).snapshot("crash")
        assert snapshot["llm_calls"] == 3 and snapshot["state"] == "completed"
        assert _kinds(store, key)[-1] == "entries"
