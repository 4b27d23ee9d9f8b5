"""The example that opens docs/serve.md runs as it is written: a real `stepstone serve`
with workers, then the page's curl and jq lines in bash, in order, against it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests._missing import missing
from tests.docs._blocks import ROOT, blocks

#: The agent the example names: a refund tool that needs a person's approval, and a
#: model (scripted, offline) that asks for it, then answers; its text goes to "tokens".
BILLING = '''
from stepstone import Agent, tool
from stepstone.testing import FakeModel, Reply, call


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


model = FakeModel(
    [
        Reply(text="Refunding o-42 now.", tool_calls=[call("refund", order="o-42")]),
        Reply(text="Refund issued for o-42."),
    ]
)
refunder = Agent(model=model, tools=[refund], stream_to="tokens")
'''


def test_the_serve_page_example_runs(tmp_path: Path) -> None:
    # guarantee 584
    for tool in ("bash", "curl", "jq"):
        if shutil.which(tool) is None:
            missing("the docs/serve.md example", f"it needs {tool}")
    (block,) = [b for b in blocks(ROOT / "docs" / "serve.md") if b.info == "sh"][:1]
    lines = block.code.splitlines()
    (serve,) = [line for line in lines if line.startswith("stepstone serve ")]
    argv = serve.removesuffix("&").split()
    assert "--port" not in argv  # the example uses the default port; the test, a free one
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "billing.py").write_text(BILLING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepstone.cli", *argv[1:], "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert " on http://127.0.0.1:" in first, first + proc.stderr.read()
        port = first.split("http://127.0.0.1:", 1)[1].split("/", 1)[0]
        script = "\n".join(
            line.replace("localhost:8000", f"localhost:{port}")
            for line in lines
            if not line.startswith(("pip install", "stepstone serve"))
        )
        assert script.count("curl ") == 6
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert out.startswith('{"key":"o-42","id":"')
        started, rest = out.split("}", 1)
        assert started.endswith('"queue":"default","status":"queued"')
        # the first stream: the model's text, then the end saying the run paused
        assert 'data: {"text": "Refunding o-42 now."}' in rest
        assert 'event: end\ndata: {"status": "paused"' in rest
        assert "approved refund call call_0_0; the run is queued again" in rest
        # the rest of the stream: the answer's text only (nothing repeated), then done
        tail = rest.split("the run is queued again", 1)[1]
        assert "Refunding" not in tail and 'data: {"text": "Refund issued for o-42."}' in tail
        assert 'event: end\ndata: {"status": "done", "error": null}' in tail
        assert out.endswith("done\nRefund issued for o-42.\n")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        assert proc.stderr is not None
        proc.stderr.close()
    assert code == 0
