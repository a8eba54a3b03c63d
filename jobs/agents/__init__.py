"""The agents that edit a worktree in a turn: the built-in one (``agent``, its
``tools``) on the Messages API, and the CLI backends (``cli`` and ``claude_code``,
``opencode``, ``codex``) inside the sandbox behind the model gateway, with their saved
sessions (``session``) and MCP servers (``mcp``); ``backends`` lists them."""
