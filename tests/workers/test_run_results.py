"""What a finished Plan run gives back, inline and through the queue: each result carries the
other's value (guarantee 401).

Inline, ``resume=True`` on a done run gives the cached ``kv`` as its payload and the last
step's output in ``metadata["last_output"]``; a queued run gives the last step's output as
its payload and the ``kv`` in ``metadata["kv"]``, whether it ran or was already done."""

from __future__ import annotations

from pathlib import Path

from stepstone import Agent, Plan, Step, Store, Worker, submit


def fetch(task: str) -> dict[str, str]:
    return {"order": task}


def score(order: dict[str, str]) -> str:
    return f"{order['order']}: low risk"


def shout(text: str) -> str:
    return text.upper()


DOWN = {"on": False}


def fragile(text: str) -> str:
    if DOWN["on"]:
        raise ConnectionError("the scoring service is down")
    return text + "!"


written = Plan(Step(fetch, writes="order"), Step(score, writes="verdict"))
unwritten = Plan(Step(shout), Step(shout, name="again"))
breaks = Plan(Step(shout, writes="loud"), Step(fragile, writes="done"))


def _durable(plan: Plan, store: Store, key: str) -> Agent:
    return Agent(engine=Plan(*plan.steps, store=store, checkpoint_key=key, resume=True))


def test_a_cached_inline_result_carries_the_last_output(tmp_path: Path) -> None:
    # guarantee 23, 401
    with Store(db=tmp_path / "s.sqlite") as store:
        first = _durable(written, store, "k")("o-1")
        assert first.payload == "o-1: low risk" and "kv" not in first.metadata
        again = _durable(written, store, "k")("o-1")
        assert again.metadata["cached"] is True
        assert again.payload == {"order": {"order": "o-1"}, "verdict": "o-1: low risk"}
        assert again.metadata["last_output"] == "o-1: low risk"  # before: absent
        # with no writes= the payload is {}: the last output is still there
        _durable(unwritten, store, "u")("hi")
        bare = _durable(unwritten, store, "u")("hi")
        assert bare.payload == {} and bare.metadata["last_output"] == "HI"


def test_a_queued_result_carries_the_kv_ran_or_cached(tmp_path: Path) -> None:
    # guarantee 304, 401
    with Store(db=tmp_path / "q.sqlite") as store:
        ran = submit(store, written, "o-2", key="order-2")
        Worker(store, poll_interval=0.05).run(until_idle=True)
        env = ran.result(timeout=5)
        assert env.payload == "o-2: low risk"
        assert env.metadata["kv"] == store.read("order-2")["kv"]  # before: absent
        assert env.metadata["kv"] == {"order": {"order": "o-2"}, "verdict": "o-2: low risk"}
        cached = submit(store, written, "o-2", key="order-2")  # the same finished key
        Worker(store, poll_interval=0.05).run(until_idle=True)
        env = cached.result(timeout=5)
        assert env.metadata["cached"] is True and env.payload == "o-2: low risk"
        assert env.metadata["kv"] == store.read("order-2")["kv"]


def test_a_queued_run_that_resumes_carries_the_kv_of_both_attempts(tmp_path: Path) -> None:
    # guarantee 401: the kv written before the resume is in the result too
    with Store(db=tmp_path / "q.sqlite") as store:
        DOWN["on"] = True
        try:
            failed = _durable(breaks, store, "b")("go")
        finally:
            DOWN["on"] = False
        assert not failed.ok and store.read("b")["kv"] == {"loud": "GO"}
        handle = submit(store, breaks, "go", key="b")  # the worker resumes at fragile
        Worker(store, poll_interval=0.05).run(until_idle=True)
        env = handle.result(timeout=5)
        assert env.ok and env.payload == "GO!" and "cached" not in env.metadata
        assert env.metadata["kv"] == {"loud": "GO", "done": "GO!"}
        assert env.metadata["kv"] == store.read("b")["kv"]
