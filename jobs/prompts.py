"""The prompts: the issue prompt once, then short continuation prompts."""

from __future__ import annotations

from typing import Any

from bot.github import IssueInfo

TAIL_CHARS = 4000


def issue_prompt(repo: str, issue: IssueInfo, verify: str) -> str:
    return (
        f"Resolve issue #{issue.number} of {repo}: {issue.title}\n\n"
        f"{issue.body or '(no description)'}\n\n"
        f"When you are done, `{verify}` must pass."
    )


def continuation(
    turn: int, failure: str, feedback: list[dict[str, Any]], findings: list[dict[str, Any]]
) -> str:
    """Names the prior failure; never repeats the issue body (it is in the conversation)."""
    parts = [f"Turn {turn}. {failure[-TAIL_CHARS:]}"]
    if findings:
        lines = "\n".join(
            f"- [{f.get('severity')}] {f.get('path')}:{f.get('line')} "
            f"{f.get('title')}: {f.get('body')}"
            for f in findings
        )
        parts.append("The reviewer found problems that block the merge:\n" + lines)
    for fb in feedback:
        parts.append(f"@{fb.get('from')} asked on the pull request:\n{fb.get('body')}")
    parts.append("Fix this and stop calling tools when done.")
    return "\n\n".join(parts)
