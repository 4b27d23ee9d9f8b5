"""Fan-out nodes: one branch per item, in parallel under a cap, each finished branch saved,
results merged in item order; a resume (after a failure or a SIGKILL) runs only the
branches with no saved result (guarantees 601-604)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import Counter as Tally
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from stepstone import Agent, LLMEngine, Store
from stepstone.graph import (
    END,
    CheckpointFilter,
    GraphBuilder,
    GraphCompileError,
    GraphEvent,
    InMemoryCheckpointer,
    NodeException,
    SQLiteCheckpointer,
    State,
    StoreCheckpointer,
    append,
    concat_flatten,
    merge,
    merge_all,
)
from stepstone.testing import FakeModel
from tests import _spawn

WORKER = Path(__file__).with_name("fan_worker.py")


class Batch(State):
    urls: list[str] = Field(default_factory=list)
    pages: Annotated[list[str], append] = Field(default_factory=list)
    words: Annotated[list[str], concat_flatten] = Field(default_factory=list)
    sizes: Annotated[dict[str, int], merge] = Field(default_factory=dict)
    seen: Annotated[dict[str, int], merge_all] = Field(default_factory=dict)
    total: int = 0


def _fan(branch: Any, cp: Any = None, **options: Any) -> Any:
    b = (
        GraphBuilder(Batch)
        .add_fan_out_node("fetch", branch, over="urls", **options)
        .add_edge("fetch", END)
        .set_entry("fetch")
    )
    return (b.with_checkpointer(cp) if cp is not None else b).compile()


def test_results_are_merged_in_item_order_under_the_concurrency_cap() -> None:
    # guarantee 601
    running = 0
    peak = 0

    async def fetch(url: str) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05 / (1 + len(url)))  # later items finish first
        running -= 1
        return f"<{url}>"

    urls = ["a", "bb", "ccc", "dddd", "eeeee"]
    final = _fan(fetch, InMemoryCheckpointer(), into="pages", concurrency=2).invoke(
        Batch(urls=urls)
    )
    assert final.pages == [f"<{u}>" for u in urls]
    assert peak == 2
    unbounded = _fan(fetch, into="pages").invoke(Batch(urls=urls))  # None: all at once
    assert unbounded.pages == final.pages and peak == 5


def test_into_goes_through_the_fields_reducer() -> None:
    # guarantee 601
    words = _fan(lambda url: url.split("/"), into="words").invoke(Batch(urls=["a/b", "c"]))
    assert words.words == ["a", "b", "c"]
    seen = _fan(lambda url: {url: len(url)}, into="seen").invoke(Batch(urls=["x", "yy", "x"]))
    assert seen.seen == {"x": 1, "yy": 2}


def test_without_into_each_branch_updates_fields_in_item_order() -> None:
    # guarantee 601
    def fetch(url: str, state: Batch) -> dict[str, Any]:  # (item, state): the state too
        return {"pages": [url], "sizes": {url: len(url)}, "total": len(state.urls)}

    final = _fan(fetch, StoreCheckpointer(Store())).invoke(Batch(urls=["b", "aa", "b"]))
    assert final.pages == ["b", "aa", "b"] and final.sizes == {"b": 1, "aa": 2}
    assert final.total == 3
    with pytest.raises(NodeException, match="branch 0 returned str, not a dict"):
        _fan(lambda url: url).invoke(Batch(urls=["a"]))


def test_an_agent_branch_answers_each_item() -> None:
    # guarantee 601
    agent = Agent(engine=LLMEngine(FakeModel(["one", "two"])), name="summarise")
    final = _fan(agent, into="pages", concurrency=1).invoke(Batch(urls=["u1", "u2"]))
    assert final.pages == ["one", "two"]

    class Pages(BaseModel):
        pages: list[str]

    structured = Agent(engine=LLMEngine(FakeModel(['{"pages": ["p"]}'])), name="s", output=Pages)
    assert _fan(structured).invoke(Batch(urls=["u"])).pages == ["p"]


class Doc(State):
    url: str
    pages: Annotated[list[str], append] = Field(default_factory=list)


def test_a_subgraph_branch_runs_once_per_item() -> None:
    # guarantee 601
    sub = (
        GraphBuilder(Doc)
        .add_node("read", lambda d: {"pages": [d.url + ":1", d.url + ":2"]})
        .add_edge("read", END)
        .set_entry("read")
        .compile()
    )
    by_default = (  # no outputs=: what each branch added to the shared `pages` field
        GraphBuilder(Batch)
        .add_fan_out_node("read_all", sub, over="urls", inputs=lambda url, s: {"url": url})
        .add_edge("read_all", END)
        .set_entry("read_all")
        .with_checkpointer(InMemoryCheckpointer())
        .compile()
    )
    assert by_default.invoke(Batch(urls=["a", "b"])).pages == ["a:1", "a:2", "b:1", "b:2"]
    counted = (
        GraphBuilder(Batch)
        .add_fan_out_node(
            "count",
            sub,
            over="urls",
            into="seen",
            inputs=lambda url, s: Doc(url=url),
            outputs=lambda final: {final.url: len(final.pages)},
        )
        .add_edge("count", END)
        .set_entry("count")
        .compile()
    )
    assert counted.invoke(Batch(urls=["a", "b"])).seen == {"a": 2, "b": 2}


def test_a_failed_branch_stops_new_ones_and_names_its_item() -> None:
    # guarantee 602
    started: list[str] = []
    seen: list[GraphEvent] = []

    def fetch(url: str) -> str:
        started.append(url)
        if url == "bad":
            raise ConnectionError("refused")
        return url

    cp = InMemoryCheckpointer()
    graph = _fan(fetch, cp, into="pages", concurrency=1)
    with pytest.raises(NodeException, match=r"branch 1 \(item 'bad'\) raised ConnectionError"):
        graph.invoke(Batch(urls=["ok", "bad", "never"]), observers=[seen.append])
    assert started == ["ok", "bad"]
    branches = [(e.kind, e.branch) for e in seen if e.branch is not None]
    assert branches == [
        ("node_start", 0),
        ("node_end", 0),
        ("checkpoint_saved", 0),
        ("node_start", 1),
        ("node_end", 1),
    ]
    (rec,) = cp.list()
    assert rec.status == "failed"
    assert [(f.node_name, f.results) for f in rec.fan_outs] == [("fetch", ((0, "ok"),))]


def test_fan_out_inside_a_subgraph_resumes_inside_it(tmp_path: Path) -> None:
    # guarantee 602: the branch rows carry the subgraph's frame (its first save)
    calls: list[str] = []
    broken = {"c"}

    def fetch(url: str) -> str:
        calls.append(url)
        if url in broken:
            broken.discard(url)
            raise RuntimeError("flaky")
        return url.upper()

    sub = (
        GraphBuilder(Batch)
        .add_fan_out_node("fetch", fetch, over="urls", into="pages", concurrency=1)
        .add_node("count", lambda s: {"total": len(s.pages)})
        .add_edge("fetch", "count")
        .add_edge("count", END)
        .set_entry("fetch")
        .compile()
    )
    cp = SQLiteCheckpointer(tmp_path / "c.sqlite")
    outer = (
        GraphBuilder(Batch)
        .add_subgraph_node("crawl", sub)
        .add_edge("crawl", END)
        .set_entry("crawl")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(NodeException) as failed:
        outer.invoke(Batch(urls=["a", "b", "c", "d"]), correlation_id="nested")
    invocation = failed.value.invocation_id
    assert invocation is not None
    rec = cp.load(invocation)
    assert rec.fan_outs[0].namespace == ("crawl",) and len(rec.parent_states) == 1
    final = outer.invoke(resume_invocation=invocation)
    assert final.pages == ["A", "B", "C", "D"] and final.total == 4
    assert calls == ["a", "b", "c", "c", "d"]
    view = cp.store.read(cp.key(invocation))
    assert view["fan_outs"] == [{"at": [["crawl"], "fetch", 0], "finished": [0, 1]}]
    cp.close()


def test_fan_out_options_are_checked_when_the_graph_is_built() -> None:
    # guarantee 603
    b = GraphBuilder(Batch)
    with pytest.raises(GraphCompileError, match="over= names a field of Batch, got 'links'"):
        b.add_fan_out_node("f", str, over="links")
    with pytest.raises(GraphCompileError, match="into= names a field of Batch, got 'out'"):
        b.add_fan_out_node("f", str, over="urls", into="out")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(GraphCompileError, match="concurrency is a positive int"):
            b.add_fan_out_node("f", str, over="urls", concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(GraphCompileError, match="inputs= is for a branch that is a compiled"):
        b.add_fan_out_node("f", str, over="urls", inputs=lambda i, s: i)
    with pytest.raises(GraphCompileError, match="takes \\(item\\) or \\(item, state\\)"):
        b.add_fan_out_node("f", lambda a, b, c: a, over="urls")
    with pytest.raises(GraphCompileError, match="the branch is a function"):
        b.add_fan_out_node("f", 42, over="urls")


def test_a_field_that_is_not_a_list_fails_the_node() -> None:
    # guarantee 603
    class Loose(State):
        items: Any = "abc"
        out: Annotated[list[str], append] = Field(default_factory=list)

    graph = (
        GraphBuilder(Loose)
        .add_fan_out_node("f", str, over="items", into="out")
        .add_edge("f", END)
        .set_entry("f")
        .compile()
    )
    with pytest.raises(NodeException, match="field 'items', which holds str 'abc', not a list"):
        graph.invoke(Loose())


def test_an_empty_list_runs_no_branch() -> None:
    # guarantee 601
    assert _fan(lambda u: 1 / 0, into="pages").invoke(Batch()).pages == []


@pytest.mark.crash
def test_sigkill_mid_fan_out_then_resume_runs_only_the_unfinished_branches(
    tmp_path: Path,
) -> None:
    # guarantee 604: a real SIGKILL; the branches the record holds never run again
    db, log = tmp_path / "fan.sqlite", tmp_path / "branches.log"

    def ends() -> int:
        text = log.read_text() if log.exists() else ""
        return sum(line.startswith("end") for line in text.splitlines())

    proc = _spawn.Popen(
        [sys.executable, str(WORKER), str(db), str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"READY")
    deadline = time.monotonic() + 60
    while ends() < 4:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the branches never ran"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    cp = SQLiteCheckpointer(db)
    (rec,) = cp.list(CheckpointFilter(correlation_id="fan"))
    assert rec.status == "running"  # its process died: it resumes like a failed one
    (progress,) = rec.fan_outs
    saved = {i for i, _ in progress.results}
    assert 2 <= len(saved) < 10
    cp.close()
    before = Tally(line for line in log.read_text().splitlines() if line.startswith("start"))

    done = _spawn.run(
        [sys.executable, str(WORKER), str(db), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "DONE " + ",".join(f"S{i}" for i in range(10))
    starts = Tally(line for line in log.read_text().splitlines() if line.startswith("start"))
    for i in range(10):
        resumed = starts[f"start {i}"] - before[f"start {i}"]
        assert resumed == (0 if i in saved else 1), (i, saved, starts)


def test_agent_branches_of_a_durable_graph_journal_their_llm_loops_apart() -> None:
    # guarantee 601: each branch's LLM loop has a key of its own (the branch's index)
    store = Store()
    agent = Agent(engine=LLMEngine(FakeModel(["first", "second"])), name="summarise")
    graph = _fan(agent, StoreCheckpointer(store), into="pages", concurrency=1)
    assert graph.invoke(Batch(urls=["u1", "u2"])).pages == ["first", "second"]
    loops = [k for k in store.keys() if k.startswith("agent:") or "[" in k]
    assert any("fetch:0[0]" in k for k in loops) and any("fetch:0[1]" in k for k in loops)
