"""The recall tools through the real MCP Python SDK (`mcp`), as an agent framework calls
them: connect to `url` over streamable HTTP (with `headers` on every request), list the
tools, make each call of `calls` in order, and print what came back as JSON.

Input on stdin: {"url": ..., "headers": {...}, "calls": [{"name": ..., "arguments": {...}}]}.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def field(obj, name, older):
    """A field under the SDK's current name, or the one older releases used."""
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, older)


async def main(spec):
    async with create_mcp_http_client(headers=spec.get("headers") or {}) as http:
        async with streamable_http_client(spec["url"], http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                out = {
                    "tools": sorted(tool.name for tool in listed.tools),
                    "schemas": {tool.name: field(tool, "input_schema", "inputSchema") for tool in listed.tools},
                    "calls": [],
                }
                for call in spec["calls"]:
                    result = await session.call_tool(call["name"], call["arguments"])
                    out["calls"].append(
                        {
                            "is_error": bool(field(result, "is_error", "isError")),
                            "structured": field(result, "structured_content", "structuredContent"),
                            "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
                        }
                    )
                print(json.dumps(out))


asyncio.run(main(json.load(sys.stdin)))
