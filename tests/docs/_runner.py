"""Run the python blocks of one Markdown file offline: ``python -m tests.docs._runner FILE``.

Exit status 0 when every block ran; otherwise the failing block's ``file:line`` and its
traceback (with line numbers of the Markdown file) on stderr, exit status 1. See
``tests/docs/_blocks.py`` for the conventions.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tests.docs._blocks import Block, blocks, fake_instance

# -- placeholders: what the docs' blocks use as "your own" functions and models -------------


class ValidationReport(BaseModel):
    rejected_rows: list[int]
    accepted_rows: int


class Draft(BaseModel):
    title: str
    body: str


class Order(BaseModel):
    total: float


class Receipt(BaseModel):
    id: str


class _Payments:
    def __init__(self) -> None:
        self.seen: dict[str, Receipt] = {}

    def charge(self, amount: float, *, idempotency_key: str) -> Receipt:
        return self.seen.setdefault(idempotency_key, Receipt(id=f"r-{len(self.seen) + 1}"))


def search_web(query: str) -> str:
    """Search the web.

    Args:
        query: What to look for.
    """
    return f"three results for {query}"


def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: City name.
    """
    return "sunny, 21C"


def a(x: int) -> int:
    """Tool a."""
    return x


def b(y: int) -> int:
    """Tool b."""
    return y


def extract(task: str) -> str:
    return "id,amount\n1,10\n2,-5\n3,7"


def transform(raw: str) -> str:
    return raw.replace(",", ";")


def validate(clean: str) -> ValidationReport:
    rows = clean.splitlines()[1:]
    rejected = [i for i, row in enumerate(rows, 1) if "-" in row]
    return ValidationReport(rejected_rows=rejected, accepted_rows=len(rows) - len(rejected))


def load(report: Any) -> str:
    return "loaded"


def load_data(ticker: str) -> dict[str, Any]:
    return {"ticker": ticker, "entry": 100, "exit": 110}


def run_strategy(prices: dict[str, Any]) -> dict[str, Any]:
    return {**prices, "trades": 3}


def refund(order_id: int) -> str:
    """Refund an order.

    Args:
        order_id: The order to refund.
    """
    return f"refunded order {order_id}"


PLACEHOLDERS: dict[str, Any] = {
    "refund": refund,
    "ValidationReport": ValidationReport,
    "Draft": Draft,
    "Order": Order,
    "Receipt": Receipt,
    "payments": _Payments(),
    "search_web": search_web,
    "get_weather": get_weather,
    "a": a,
    "b": b,
    "extract": extract,
    "transform": transform,
    "validate": validate,
    "load": load,
    "load_data": load_data,
    "run_strategy": run_strategy,
}


# -- the offline world ----------------------------------------------------------------------


def _answer(request: Any) -> Any:
    if request.output_schema:
        return fake_instance(request.output_schema)
    return "ok"


def _install_scripted_providers() -> None:
    from stepstone.providers import register_provider
    from stepstone.testing import FunctionModel

    for name in ("anthropic", "openai", "google", "ollama"):
        register_provider(name, lambda **kw: FunctionModel(_answer, model_name="docs-scripted"))


_PG_LITERAL = re.compile(r"([\"'])postgresql://[^\"']*\1")


def _substitute(code: str, local_url: str) -> str:
    if _PG_LITERAL.search(code):
        pg_url = os.environ.get("STEPSTONE_DOCS_PG_URL")
        if not pg_url:
            raise SystemExit("this block needs STEPSTONE_DOCS_PG_URL (a test PostgreSQL URL)")
        code = _PG_LITERAL.sub(lambda m: f"{m[1]}{pg_url}{m[1]}", code)
    return code.replace("http://localhost:8000/v1", local_url)


def _run(block: Block, namespace: dict[str, Any], local_url: str) -> None:
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    padded = "\n" * (block.line - 1) + block.code
    if not block.runs:
        compile(padded, str(block.path), "exec", flags=flags)
        return
    code = compile(_substitute(padded, local_url), str(block.path), "exec", flags=flags)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


_AGENTS_SDK = ("agents", "stepstone.integrations.openai_agents")


def _imports_agents_sdk(block: Block) -> bool:
    """Whether ``block`` imports the OpenAI Agents SDK, directly or through stepstone's
    integration of it."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        tree = compile(block.code, block.where, "exec", flags=flags)
    except SyntaxError:  # the block fails when it runs, with its own message
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        if any(n == m or n.startswith(m + ".") for n in names for m in _AGENTS_SDK):
            return True
    return False


def _point_models_at(base_url: str) -> None:
    """pydantic-ai's and the OpenAI Agents SDK's OpenAI models, built from a model name
    (``"openai:gpt-5.2"``, ``model="gpt-5.2"``), talk to the loopback server: both read
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``."""
    os.environ["OPENAI_BASE_URL"] = base_url
    os.environ["OPENAI_API_KEY"] = "docs-loopback"


def _point_agents_sdk_at_loopback() -> None:
    """The Agents SDK is told to speak Chat Completions (what the loopback server speaks) and
    to keep its traces to itself. Only for a page that imports it: importing it and
    ``openai`` costs about 2 s of CPU, more than most pages' blocks together."""
    from agents import set_default_openai_api, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    set_default_openai_api("chat_completions")
    set_tracing_disabled(True)
    # The SDK keeps one client for the process; the blocks run on several event loops (a
    # top-level await, a run_sync), so no connection may outlive the loop that opened it.
    import httpx2  # the HTTP client the openai SDK is built on

    http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    set_default_openai_client(AsyncOpenAI(http_client=http), use_for_tracing=False)


def main(path: Path) -> int:
    os.environ["STEPSTONE_BLOCK_MODEL_REQUESTS"] = "1"
    _install_scripted_providers()
    from stepstone.testing import LoopbackServer, OpenAIDialect

    # A real module, so pydantic and typing resolve the blocks' names like a user's script.
    module = types.ModuleType("docs_blocks")
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    namespace.update(PLACEHOLDERS)
    ran = 0
    page = [block for block in blocks(path) if block.is_python]
    uses_agents_sdk = any(_imports_agents_sdk(block) for block in page)
    with LoopbackServer(OpenAIDialect(), default="ok from the local server") as server:
        _point_models_at(server.base_url)
        if uses_agents_sdk:
            _point_agents_sdk_at_loopback()
        for block in page:
            try:
                _run(block, namespace, server.base_url)
            except BaseException:  # noqa: BLE001 - report which block failed, then fail
                print(f"{block.where}: this block failed", file=sys.stderr)
                traceback.print_exc()
                return 1
            ran += block.runs
    if "agents" in sys.modules and not uses_agents_sdk:
        print(
            f"{path}: a block imported the OpenAI Agents SDK in a way this runner did not see "
            "(it looks for `import agents` or `stepstone.integrations.openai_agents`), so the "
            "SDK was not pointed at the loopback server: import it by name",
            file=sys.stderr,
        )
        return 1
    print(f"{path.name}: {ran} block(s) ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
