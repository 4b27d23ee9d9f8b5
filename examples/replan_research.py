"""An adaptive research pipeline: a planner agent dispatches a researcher and a coder.

    Agent(engine=ReplanEngine(store=store, checkpoint_key="replan-research", resume=True),
          tools=[planner, researcher, coder])

Each round, the planner (an LLM agent with ``output=PlanRound``) sees the task, the
workers' schemas and every earlier result, and decides the next tasks. Round 1 asks the
researcher two questions in parallel; round 2 runs a third question and the coder in
parallel; round 3 answers. Every planner answer and every task result is committed as it
happens.

The first run happens in a child process that is killed with SIGKILL in the middle of
round 2: the researcher's answer is committed, the coder is still working. The second
run resumes round 2 in this process: only the coder runs again, and the planner is not
asked for round 2 again. Every model is scripted, so the example runs offline; each
model call is written to a log so the output can show what ran where.

    python examples/replan_research.py [DB_PATH]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepstone import Agent, LLMEngine, PlanRound, ReplanEngine, Store, Task
from stepstone.providers import ModelRequest
from stepstone.testing import FunctionModel, Reply

TOPIC = "Should our job runner retry failed steps, and how would the code look?"
KEY = "replan-research"

FACTS = {
    "retries": "Retries fix transient failures (rate limits, timeouts) but repeat side "
    "effects unless each step is idempotent or committed before the next one starts.",
    "idempotency": "An idempotency key per step execution lets an external API drop a "
    "duplicate request.",
    "backoff": "Exponential backoff with jitter keeps retries from stampeding a provider.",
}


def log_call(log: Path, who: str, what: str) -> None:
    """Record one model call (the side effect a crash must not repeat needlessly)."""
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"{who} pid={os.getpid()} {what}\n")
        fh.flush()
        os.fsync(fh.fileno())


def planner_model(log: Path) -> FunctionModel:
    """The planner's script: its answer depends on the round named in its input."""

    def answer(request: ModelRequest) -> PlanRound:
        prompt = request.messages[-1].text
        found = re.search(r"This is round (\d+)", prompt)
        number = int(found.group(1)) if found else 0
        log_call(log, "planner", f"round {number}")
        if number == 1:
            return PlanRound(
                reasoning="Two independent questions first.",
                tasks=[
                    Task(tool="researcher", kwargs={"task": "retries"}),
                    Task(tool="researcher", kwargs={"task": "idempotency"}),
                ],
            )
        if number == 2:
            return PlanRound(
                reasoning="Retries need idempotency: ask about backoff and sketch the code.",
                tasks=[
                    Task(tool="researcher", kwargs={"task": "backoff"}),
                    Task(tool="coder", kwargs={"task": "retry loop with an idempotency key"}),
                ],
            )
        return PlanRound(
            reasoning="Enough to answer.",
            done=True,
            final_answer="Yes: retry with backoff, pass an idempotency key per step, and "
            "commit each step before the next (see the coder's sketch).",
        )

    return FunctionModel(answer, model_name="scripted-planner")


def worker_model(log: Path, who: str, slow: bool) -> FunctionModel:
    """A researcher or coder model; ``slow`` makes the coder take long (to crash inside)."""

    def answer(request: ModelRequest) -> Reply:
        task = request.messages[-1].text
        log_call(log, who, task)
        if who == "researcher":
            return Reply(text=FACTS.get(task, "no notes on that"))
        sketch = "for attempt in range(5): call(step, idempotency_key=key); break on success"
        return Reply(text=sketch, delay=60.0 if slow else 0.0)

    return FunctionModel(answer, model_name=f"scripted-{who}")


def build_agent(store: Store, log: Path, *, slow_coder: bool = False) -> Agent:
    """The ReplanEngine agent with its planner and two workers."""
    planner = Agent(engine=LLMEngine(planner_model(log)), name="planner", output=PlanRound)
    researcher = Agent(
        engine=LLMEngine(worker_model(log, "researcher", False)),
        name="researcher",
        description="Answers one research question from the team's notes.",
    )
    coder = Agent(
        engine=LLMEngine(worker_model(log, "coder", slow_coder)),
        name="coder",
        description="Writes a short code sketch.",
    )
    engine = ReplanEngine(store=store, checkpoint_key=KEY, resume=True, max_rounds=5)
    return Agent(engine=engine, tools=[planner, researcher, coder])


def child(db: str, log: str) -> None:
    """The first run, in its own process, with a coder slow enough to be killed."""
    with Store(db=db) as store:
        build_agent(store, Path(log), slow_coder=True)(TOPIC)


def crash_in_round_2(db: Path, log: Path) -> int:
    """Start the child, wait until round 2's researcher result is committed while the
    coder is still working, then SIGKILL it. Returns the child's pid."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(db), str(log)])
    deadline = time.monotonic() + 120
    with Store(db=db) as store:
        while time.monotonic() < deadline and proc.poll() is None:
            record = store.read(KEY)
            if record and record["round"] == 2 and "result" in record["rounds"][1]["tasks"][0]:
                break
            time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2])
        return 0
    if argv:
        return run(Path(argv[0]))
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        return run(Path(tmp) / "replan.sqlite")


def run(db: Path) -> int:
    log = db.with_suffix(".calls.log")
    log.unlink(missing_ok=True)

    pid = crash_in_round_2(db, log)
    with Store(db=db) as store:
        record = store.read(KEY)
        outcomes = ["done" if "result" in t else "pending" for t in record["rounds"][-1]["tasks"]]
        print(f"run 1 (pid {pid}) killed with SIGKILL in round {record['round']}")
        print(f"  record: status {record['status']}, round 2 tasks {outcomes}")

        env = build_agent(store, log)(TOPIC)
        record = store.read(KEY)
    if not env.ok:
        assert env.error is not None
        print(f"failed: {env.error.type}: {env.error.message}")
        return 1
    print(f"run 2 (resume=True): status {record['status']} after {record['round']} rounds")
    for rnd in record["rounds"]:
        tools = ", ".join(t["tool"] for t in rnd["tasks"]) or "-"
        print(f"  round {rnd['round']}: {rnd['reasoning']} [{tools}]")
    print(f"final answer: {env.payload}")
    calls = log.read_text(encoding="utf-8").splitlines()
    mine = [c for c in calls if f"pid={os.getpid()} " in c]
    print("model calls in run 2: " + ", ".join(c.split(" pid=")[0] for c in mine))
    counts = {who: sum(c.startswith(who) for c in calls) for who in ("planner", "researcher")}
    print(f"model calls in total: planner {counts['planner']}, researcher {counts['researcher']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
