"""A call waiting for approval is recorded with its arguments as plain JSON, whatever
types the tool's parameters have."""

from __future__ import annotations

from pathlib import Path

from stepstone import Agent, LLMEngine, Runner, Store, checkpoint_latest_key, tool
from stepstone.durable import pending_approvals, read_run
from stepstone.providers import OpenAIProvider
from stepstone.testing import LoopbackServer, OpenAIDialect, call


def test_a_call_with_a_set_argument_pauses_for_approval_and_resumes(tmp_path: Path) -> None:
    """guarantee 389: a tool that requires approval and takes a set pauses its run (the
    pending call's arguments recorded as plain JSON, the set as a sorted list); approved,
    the tool gets its set."""
    seen: list[set[str]] = []

    @tool(requires_approval=True)
    def label(tags: set[str]) -> str:
        """Label the ticket."""
        seen.append(tags)
        return "labelled"

    db = tmp_path / "runs.sqlite"
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server, Store(db=str(db)) as store:
        server.push(call("label", tags=["b", "a", "c"]), "done")
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        agent = Agent(engine=LLMEngine("gpt-4o", provider=provider), name="t", tools=[label])
        runner = Runner(store=store)
        paused = runner.run_sync(agent, user_message="go", run_id="r", thread_id="r")
        assert paused.state == "paused", paused.error
        [pending] = paused.pending_approvals
        assert pending["arguments"] == {"tags": ["a", "b", "c"]}
        record = read_run(store, checkpoint_latest_key("r"))
        assert record is not None
        stored = pending_approvals(*record)
        assert [p["arguments"] for p in stored] == [pending["arguments"]]
        done = runner.resume_sync(
            agent, run_id="r", thread_id="r", approvals={pending["call_id"]: True}
        )
        assert done.state == "completed", done.error
        assert seen == [{"a", "b", "c"}]
