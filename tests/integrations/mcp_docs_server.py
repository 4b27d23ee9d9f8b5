"""A small MCP server over stdio for the integration tests: one tool, ``search_docs``.

Usage: python mcp_docs_server.py LOG. Each process (one per MCP session over stdio)
appends ``session <pid>`` to LOG when it starts, and each tool call ``call <query>``.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

LOG = sys.argv[1]
server = MCPServer("docs")


def _log(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@server.tool()
def search_docs(query: str) -> str:
    """Search the documentation."""
    _log(f"call {query}")
    return f"found: {query}"


if __name__ == "__main__":
    _log(f"session {os.getpid()}")
    server.run()
