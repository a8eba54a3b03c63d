"""A small MCP server over stdio (newline-delimited JSON-RPC 2.0), for the tests: one
tool, ``lookup``, that answers a word the test can find in the next model request, and
writes each call to ``$MCP_LOG`` if set. No dependencies: it runs in the sandbox."""

import json
import os
import sys

WORD = os.environ.get("MCP_WORD", "PAPAYA-42")


def reply(msg_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, msg_id = msg.get("method"), msg.get("id")
    if method == "initialize":
        version = (msg.get("params") or {}).get("protocolVersion", "2025-06-18")
        reply(
            msg_id,
            {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "notes", "version": "1.0"},
            },
        )
    elif method == "tools/list":
        reply(
            msg_id,
            {
                "tools": [
                    {
                        "name": "lookup",
                        "description": "Look up the project's magic word.",
                        "inputSchema": {
                            "type": "object",
                            "properties": {"topic": {"type": "string"}},
                        },
                    }
                ]
            },
        )
    elif method == "tools/call":
        topic = ((msg.get("params") or {}).get("arguments") or {}).get("topic", "")
        if os.environ.get("MCP_LOG"):
            with open(os.environ["MCP_LOG"], "a") as log:
                log.write(f"called {topic}\n")
        reply(msg_id, {"content": [{"type": "text", "text": f"the word for {topic} is {WORD}"}]})
    elif msg_id is not None:
        if method == "ping":
            reply(msg_id, {})
        else:
            sys.stdout.write(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": msg_id,
                        "error": {"code": -32601, "message": f"no method {method}"},
                    }
                )
                + "\n"
            )
            sys.stdout.flush()
