"""Orchestration overhead per turn, with model and verify time excluded.

    .venv/bin/python bench/loop_overhead.py [--turns 20] [--smoke]
        [--backend builtin|claude-code|opencode|codex]

Runs one real loop job (real RQ worker, Redis, git, bubblewrap sandbox, the local GitHub
and model servers) for ``--turns`` turns. Each turn the scripted model edits one file
and finishes; verify (`exit 1`) always fails, so every turn goes through the whole
cycle: re-read the issue, agent turn, commit, push, check run, verify, events, status
comment. Overhead = time from one turn's start to the next, minus the model's answer
time and verify's run time. Prints median, p90 and max, and the early turns apart from
the late ones (a cost that grows with the loop's history shows there), and the time
from a turn's start to its first model request. ``--backend claude-code`` runs the same
loop with Claude Code in the sandbox behind the model gateway: its whole CLI run counts
as the agent's time, so the overhead is loopbot's alone, and the CLI's own cost (its
start, its session restored, the gateway) shows in the time to the first request.
``--smoke``: 3 turns (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rq import Worker

from bench import _env, _smoke
from bot.core import repo_config
from bot.core.ids import LoopId
from bot.io.logs import configure
from bot.io.queues import ALL_QUEUES, make_worker
from bot.standins import anthropic as m
from bot.standins import openai as o
from bot.standins.openai import OpenAIServer
from jobs import entry as _entry  # noqa: F401 - registers the job functions the worker runs
from jobs.dispatch import start_loop

REPO = "bench/overhead"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument(
        "--backend", choices=["builtin", "claude-code", "opencode", "codex"], default="builtin"
    )
    args = _smoke.parse(ap, turns=3)
    configure("json", level=logging.WARNING)
    claude = args.backend == "claude-code"
    cli = args.backend != "builtin"  # a CLI in the sandbox
    extra = {"LOOPBOT_AGENT_BACKENDS": f"builtin,{args.backend}"} if cli else {}
    if cli:  # a model Claude Code knows (see tests/e2e/agents/test_claude_code.py)
        extra["LOOPBOT_MODEL"] = "claude-sonnet-4-6"
    openai = OpenAIServer().start() if args.backend == "codex" else None
    if openai is not None:  # Codex talks to the local Responses API through the gateway
        extra |= {"OPENAI_API_KEY": "sk-openai-bench", "OPENAI_BASE_URL": openai.base_url}
    b = _env.start(extra)
    try:
        iid = b.github.add_installation("bench")
        yml = (
            f"verify: exit 1\nmax_turns: {args.turns}\ncritic:\n  enabled: false\n"
            "merge:\n  enabled: false\n"
        ) + (f"agent:\n  backend: {args.backend}\n" if cli else "")
        b.github.add_repo(REPO, {".github/loop.yml": yml, "app.py": "x = 0\n"}, installation_id=iid)
        with b.github.as_user("bench") as u:
            n = u.post(f"/repos/{REPO}/issues", json={"title": "t", "body": "b"}).json()["number"]
            u.post(f"/repos/{REPO}/issues/{n}/labels", json={"labels": ["loop:ready"]})
        counter = {"turn": 0}
        first_asks: list[float] = []  # when each turn's first model request arrived

        def respond(body: dict[str, Any]) -> m.Item:
            last = body["messages"][-1]["content"]
            if isinstance(last, list) and any(
                isinstance(block, dict) and block.get("type") == "tool_result" for block in last
            ):
                return m.text("edited")
            first_asks.append(time.time())
            counter["turn"] += 1
            if claude:
                return m.cc_write("app.py", f"x = {counter['turn']}\n")
            if cli:
                return m.oc_write("app.py", f"x = {counter['turn']}\n")
            return m.write_file("app.py", f"x = {counter['turn']}\n")

        def respond_openai(body: dict[str, Any]) -> o.Item:
            last = body["input"][-1] if isinstance(body["input"], list) else {}
            if last.get("type") == "custom_tool_call_output":
                return o.text("edited")
            first_asks.append(time.time())
            counter["turn"] += 1
            return o.cx_shell(f"printf 'x = {counter['turn']}\\n' > app.py")

        b.model.responder = respond
        if openai is not None:
            openai.responder = respond_openai
        start_loop(b.rt, REPO, n, iid, "bench", repo_config.parse(yml))
        # A forking worker: the job runs in its own process, apart from the local servers.
        make_worker(ALL_QUEUES, b.rt.redis, Worker).work(burst=True)
        events = b.rt.store.events(LoopId(REPO, n), count=100_000)
        starts = [e["at"] for e in events if e["kind"] == "turn_started"]
        if len(starts) != args.turns:  # the loop stopped early: the figures would be wrong
            r = b.rt.store.get(LoopId(REPO, n))
            why = f"{r.status.value}: {r.reason} ({r.detail})" if r else "no record"
            tail = [(e["kind"], str(e["data"])[:200]) for e in events[-8:]]
            raise SystemExit(
                f"the loop ran {len(starts)} of {args.turns} turns, and ended {why}; its "
                f"last events: {tail}; see {b.root}"
            )
        done = [e["data"] for e in events if e["kind"] == "turn_completed"]
        verify = [e["data"]["seconds"] for e in events if e["kind"] == "verify"]
        in_order = []
        for i in range(len(starts) - 1):
            cycle = starts[i + 1] - starts[i]
            in_order.append((cycle - done[i]["model_seconds"] - verify[i]) * 1000)
        overhead = sorted(in_order)
        model_ms = statistics.median(d["model_seconds"] for d in done) * 1000
        verify_ms = statistics.median(verify) * 1000
        print(
            f"orchestration overhead per turn over {len(overhead)} turns "
            f"(model and verify excluded):"
        )
        print(
            f"  median {statistics.median(overhead):.1f} ms   "
            f"p90 {overhead[int(len(overhead) * 0.9)]:.1f} ms   max {overhead[-1]:.1f} ms"
        )
        # A cost that grows with the loop's history shows as late turns slower than early.
        span = max(1, min(5, len(in_order) // 2))
        early, late = in_order[:span], in_order[-span:]
        print(
            f"  early turns (1-{span}) median {statistics.median(early):.1f} ms   "
            f"late turns ({len(in_order) - span + 1}-{len(in_order)}) median "
            f"{statistics.median(late):.1f} ms"
        )
        print(
            f"  (excluded per turn, median: {f'the {args.backend} run' if cli else 'model'} "
            f"{model_ms:.1f} ms over 2 model calls, verify {verify_ms:.1f} ms in the sandbox)"
        )
        to_first = sorted((a - s) * 1000 for s, a in zip(starts, first_asks, strict=False))
        print(
            f"  turn start to its first model request ({args.backend}): median "
            f"{statistics.median(to_first):.1f} ms   p90 "
            f"{to_first[int(len(to_first) * 0.9)]:.1f} ms   max {to_first[-1]:.1f} ms"
        )
    finally:
        b.close()
        if openai is not None:
            openai.stop()


if __name__ == "__main__":
    main()
