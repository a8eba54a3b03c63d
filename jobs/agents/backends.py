"""The agent backends that run a CLI inside the sandbox, by their ``agent.backend`` name
(``builtin``, loopbot's own agent, is ``jobs/agents/agent.py``)."""

from __future__ import annotations

from typing import Any

from bot.core.models import ModelSpec
from jobs.agents.claude_code import ClaudeCodeAgent
from jobs.agents.claude_code import trial as claude_code_trial
from jobs.agents.cli import CliAgent, Trial, trial
from jobs.agents.codex import CodexAgent
from jobs.agents.opencode import OpenCodeAgent

CLI_BACKENDS: dict[str, type[CliAgent]] = {
    "claude-code": ClaudeCodeAgent,
    "opencode": OpenCodeAgent,
    "codex": CodexAgent,
}


def run_trial(backend: str, client: Any, settings: Any, model: str, spec: ModelSpec) -> Trial:
    """``loopbot doctor``'s trial turn of ``backend``."""
    if backend == "claude-code":
        return claude_code_trial(client, settings, model, spec)
    if backend == "codex":  # the budget guard counts with OpenAI's token count
        return trial(CodexAgent, client, settings, model, spec, count=client.count)
    return trial(CLI_BACKENDS[backend], client, settings, model, spec)
