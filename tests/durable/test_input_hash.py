"""Effect input hashes: the same digest in every process, and old journals still resume."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import itertools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel

from stepstone import Agent, AgentCheckpointCorruptionError, Runner, Store, tool
from stepstone.durable._effects import hash_json
from stepstone.durable._journal_format import expand
from stepstone.engines.llm import EffectKey
from stepstone.exceptions import SerializationError
from stepstone.store import Claim, JournalRow, RunHead
from stepstone.testing import FunctionModel, call
from tests.durable.journal_edit import entries

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("fixtures") / "agent_journal_hash1.json"


def _python(script: Path, *args: str, seed: int) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a new interpreter under ``PYTHONHASHSEED=seed``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": str(seed)}
    out = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out


def _version_1(value: Any, separators: tuple[str, str] = (",", ":")) -> str:
    """The digest stepstone wrote before input hash version 2 (kept here to compare with)."""
    text = json.dumps(value, sort_keys=True, separators=separators, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


HASHES = """
import dataclasses, json, sys
from pydantic import BaseModel
from stepstone.durable._effects import hash_json
from stepstone.engines.llm import EffectKey

class Tagged(BaseModel):
    name: str
    tags: set[str]

@dataclasses.dataclass
class Box:
    items: frozenset[str]
    note: str = "n"

words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
values = {
    "set": set(words),
    "frozenset": frozenset(words),
    "bytes set": {w.encode() for w in words},
    "set of tuples": {(w, len(w)) for w in words},
    "set of frozensets": {frozenset(words[:3]), frozenset(words[3:])},
    "nested": {"args": {"tags": set(words), "plain": [1, 2.5, None, True, "x"]}},
    "model": Tagged(name="t", tags=set(words)),
    "dataclass": Box(items=frozenset(words)),
    "mixed keys": {1: "one", "two": 2, (3, 4): set(words)},
}
out = {k: hash_json(v) for k, v in values.items()}
key = EffectKey(run_id="r", kind="tool", turn=0, index=0, name="tag", input={"tags": set(words)})
out["EffectKey.input_hash"] = key.input_hash()
print(json.dumps(out))
"""


def test_hash_json_is_the_same_under_every_hash_seed(tmp_path: Path) -> None:
    # guarantee 136
    script = tmp_path / "hashes.py"
    script.write_text(HASHES)
    runs = [json.loads(_python(script, seed=seed).stdout) for seed in (0, 1, 2, 3)]
    for name in runs[0]:
        assert len({r[name] for r in runs}) == 1, name


WORKER = """
import dataclasses, datetime, json, logging, sys
from stepstone import Agent, Runner, Store, tool
from stepstone.testing import FunctionModel, call
from tests.durable.journal_edit import entries

mode, db = sys.argv[1], sys.argv[2]
ledger = db + ".ledger"
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")

def ran(line):
    with open(ledger, "a") as f:
        f.write(line + "\\n")

@tool
def tag(tags: set[str]) -> str:
    '''Tag the ticket.'''
    ran("tag " + ",".join(sorted(tags)))
    return "tagged " + ",".join(sorted(tags))

@tool
def note(
    text: str,
    at: datetime.datetime,
    scores: dict[str, float],
    pair: tuple[int, int],
    one: set[str],
) -> str:
    '''Write a note.'''
    ran("note")
    return "noted"

@tool(requires_approval=True)
def close(reason: str) -> str:
    '''Close the ticket.'''
    ran("close " + reason)
    return "closed"

replies = {
    0: [
        call("tag", tags=["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]),
        call(
            "note",
            text="h\\u00e9llo",
            at="2026-05-01T10:00:00",
            scores={"b": 0.5, "a": 1.0},
            pair=[1, 2],
            one=["solo"],
        ),
    ],
    1: call("close", reason="fixed"),
    2: "done",
}
agent = Agent(
    name="tagger", model=FunctionModel(lambda r: replies[r.turn]), tools=[tag, note, close]
)
with Store(db=db) as store:
    runner = Runner(store=store)
    if mode == "start":
        result = runner.run_sync(agent, user_message="tag it", run_id=sys.argv[3], thread_id="t")
    else:
        result = runner.resume_sync(
            agent, run_id=sys.argv[3], thread_id="t", approvals={sys.argv[4]: True}
        )
print(json.dumps(result.to_dict()))
"""


def test_a_set_argument_resumes_in_a_process_with_another_hash_seed(tmp_path: Path) -> None:
    # guarantee 136
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db = str(tmp_path / "runs.sqlite")
    first = json.loads(_python(script, "start", db, "s", seed=1).stdout)
    assert first["state"] == "paused"
    call_id = first["pending_approvals"][0]["call_id"]
    resumed = json.loads(_python(script, "approve", db, "s", call_id, seed=2).stdout)
    assert resumed["state"] == "completed", resumed["error"]
    assert resumed["final_text"] == "done"
    lines = Path(db + ".ledger").read_text().splitlines()
    assert sorted(lines[:2]) == ["note", "tag alpha,beta,delta,epsilon,gamma,zeta"]  # each once
    assert lines[2:] == ["close fixed"]
    # A set's digest is of version 2; plain arguments keep the digest they always had.
    with Store(db=db) as store:
        effects = {e.name: e.data for e in entries(store, "agent:s:checkpoint:latest")}
    assert effects["tool:0:0"]["input_hash_version"] == 2
    assert "input_hash_version" not in effects["tool:1:0"]
    close_args = {"name": "close", "args": {"reason": "fixed"}}
    assert effects["tool:1:0"]["input_hash"] == _version_1(close_args)


def _load_fixture(store: Store) -> str:
    """Put the journal of the fixture (written by stepstone's hash version 1) in ``store``;
    the id of the call it waits to be approved."""
    frozen = json.loads(FIXTURE.read_text())
    for run in frozen["runs"]:
        head = RunHead(**run["head"])
        rows = [JournalRow(*r) for r in run["rows"]]
        store.backend.run_transact(
            head.key, lambda h, kv, head=head, rows=rows: Claim(head=head, rows=rows)
        )
    return str(frozen["pending"][0])


@pytest.mark.parametrize("seed", [2, 3])
def test_a_run_journaled_by_hash_version_1_resumes_under_another_hash_seed(
    tmp_path: Path, seed: int
) -> None:
    # guarantee 137
    db = str(tmp_path / "old.sqlite")
    with Store(db=db) as store:
        call_id = _load_fixture(store)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = _python(script, "approve", db, "old", call_id, seed=seed)
    resumed = json.loads(out.stdout)
    assert resumed["state"] == "completed", resumed["error"]
    assert resumed["final_text"] == "done"
    # tag and note ran in the old run: replayed, not run again.
    assert Path(db + ".ledger").read_text().splitlines() == ["close fixed"]
    assert [e["content"] for e in resumed["tool_executions"]] == [
        "tagged alpha,beta,delta,epsilon,gamma,zeta",
        "noted",
        "closed",
    ]
    # The set's old digest (its order under PYTHONHASHSEED=1) cannot be reproduced: taken
    # as the same call, with a warning. note's plain arguments, its datetime, tuple and
    # one-element set gave version 1's digest again: checked, no warning.
    warnings = [line for line in out.stderr.splitlines() if "older stepstone" in line]
    assert len(warnings) == 1 and "'tag'" in warnings[0] and "tool:0:0" in warnings[0]
    with Store(db=db) as store:
        found = entries(store, "agent:old:checkpoint:latest")
    old_rows = [e.data for e in found if e.kind in ("intent", "outcome")]
    assert all("input_hash_version" not in r for r in old_rows)  # none held a set after
    again = json.loads(_python(script, "approve", db, "old", call_id, seed=seed + 10).stdout)
    assert again == resumed  # finished: its stored result, from any process


def test_plain_json_digests_are_those_of_hash_version_1() -> None:
    # guarantee 137
    class Color(enum.Enum):
        RED = "red"

    class Size(enum.IntEnum):
        S = 1

    class Label(BaseModel):
        name: str
        at: datetime.date

    class Holder(BaseModel):
        one: set[str]

    @dataclasses.dataclass
    class Point:
        x: int
        y: float

    values: list[Any] = [
        None,
        True,
        0,
        -3,
        2.5,
        float("nan"),
        "héllo \u2603",
        [],
        {},
        [1, "a", None, [2.0, {"k": False}]],
        {"b": 1, "a": {"z": [1, 2], "y": None}},
        {1: "int keys", 2: "sorted as numbers"},
        (1, 2),
        {"when": datetime.datetime(2026, 5, 1, 10, 0), "day": datetime.date(2026, 5, 1)},
        {"price": decimal.Decimal("9.50"), "id": uuid.UUID(int=7), "raw": b"\x00b"},
        {"color": Color.RED, "size": Size.S, "day": Label(name="x", at=datetime.date(2026, 1, 2))},
        {"point": Point(1, 2.5), "model with a one-element set": Holder(one={"a"})},
    ]
    for value in values:
        digest = hash_json({"name": "t", "args": value})
        assert getattr(digest, "version", 1) == 1
        assert digest == _version_1({"name": "t", "args": value}), value
        key = EffectKey(run_id="r", kind="tool", turn=0, index=0, name="t", input=value)
        assert key.input_hash() == _version_1(value, (", ", ": "))
    # A set of one element or none had a stable text too: its digest is a canonical one
    # now, and version 1's, recomputed, is what an old row is checked against.
    for small in ({"solo"}, set(), frozenset({1})):
        digest = hash_json({"name": "t", "args": {"one": small}})
        assert digest.version == 2 and not digest.unstable
        assert digest.legacy == _version_1({"name": "t", "args": {"one": small}})


class Opaque:
    """An object whose str() shows its memory address."""


class OtherOpaque:
    """Another one."""


def test_a_value_without_a_stable_text_is_hashed_by_its_type() -> None:
    # guarantee 138
    a, b = hash_json({"x": Opaque()}), hash_json({"x": Opaque()})
    assert a == b and a.version == 2 and a.unstable
    assert hash_json({"x": OtherOpaque()}) != a
    assert hash_json({"x": [Opaque(), 1]}) != hash_json({"x": [Opaque(), 2]})
    cycle: list[Any] = [1]
    cycle.append(cycle)
    with pytest.raises(SerializationError, match="contains itself"):
        hash_json({"x": cycle})


def _with_extra(tags: set[str]) -> set[str]:
    return tags | {"extra"}


def test_a_set_argument_that_changes_on_resume_is_corruption(tmp_path: Path) -> None:
    # guarantee 139
    ran: list[str] = []

    def agent(changed: bool) -> Agent:
        @tool(name="tag")
        def tag(tags: set[str]) -> str:
            """Tag the ticket."""
            ran.append("tag")
            return "tagged"

        @tool(name="tag")
        def tag_changed(tags: Annotated[set[str], AfterValidator(_with_extra)]) -> str:
            """Tag the ticket (now with one more tag)."""
            ran.append("tag")
            return "tagged"

        @tool(requires_approval=True)
        def close() -> str:
            """Close the ticket."""
            ran.append("close")
            return "closed"

        replies = {0: call("tag", tags=["b", "a", "c"]), 1: call("close"), 2: "done"}
        model = FunctionModel(lambda r: replies[r.turn])
        return Agent(name="t", model=model, tools=[tag_changed if changed else tag, close])

    with Store(db=tmp_path / "s.sqlite") as store:
        runner = Runner(store=store)
        first = runner.run_sync(agent(False), user_message="go", run_id="s", thread_id="t")
        assert first.state == "paused" and ran == ["tag"]
        approvals = {first.pending_approvals[0]["call_id"]: True}
        with pytest.raises(AgentCheckpointCorruptionError, match="check determinism"):
            runner.resume_sync(agent(True), run_id="s", thread_id="t", approvals=approvals)
        assert ran == ["tag"]
        done = runner.resume_sync(agent(False), run_id="s", thread_id="t", approvals=approvals)
        assert done.state == "completed" and ran == ["tag", "close"]


def test_a_damaged_input_hash_version_is_corruption(tmp_path: Path) -> None:
    # guarantee 139
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db = str(tmp_path / "runs.sqlite")
    first = json.loads(_python(script, "start", db, "s", seed=1).stdout)
    key = "agent:s:checkpoint:latest"
    with Store(db=db) as store:
        head = store.backend.run_get(key)
        stored = store.backend.run_journal(key)
    assert head is not None
    rows = expand(stored)  # as the first format wrote them
    for bad, first_format in itertools.product((3, "2", True, None), (True, False)):
        damaged = []
        for row in rows if first_format else stored:
            data = json.loads(row.data)
            if row.kind == "outcome" and row.name == "tool:0:0":
                assert data["input_hash_version"] == 2
                data["input_hash_version"] = bad
            for entry in data.get("e", []) if row.kind == "entries" else []:
                if entry[:4] == ["i", "tool", 0, 0]:
                    assert entry[7] == 2
                    entry[7] = bad
            damaged.append(JournalRow(row.seq, row.kind, row.name, json.dumps(data)))
        old = dataclasses.replace(head, journal_len=len(damaged))
        agent_db = str(tmp_path / f"damaged-{bad}-{first_format}.sqlite")
        with Store(db=agent_db) as store:
            store.backend.run_transact(
                key, lambda h, kv, rows=damaged, old=old: Claim(head=old, rows=rows)
            )
        call_id = first["pending_approvals"][0]["call_id"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "1"}
        out = subprocess.run(
            [sys.executable, str(script), "approve", agent_db, "s", call_id],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert out.returncode != 0
        assert "AgentCheckpointCorruptionError" in out.stderr
        assert "tool:0:0" in out.stderr, out.stderr
        assert not Path(agent_db + ".ledger").exists()  # nothing ran
