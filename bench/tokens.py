"""Tokens over a long loop: peak request, stored conversation, and the prompt-cache share.

    .venv/bin/python bench/tokens.py [--turns 20] [--reads 8] [--window 200000] [--smoke]

Runs one real loop job (real RQ worker, Redis, git, bubblewrap sandbox, the local GitHub
and model servers) for ``--turns`` turns on one conversation. Each turn the scripted model
reads a 20 KB file ``--reads`` times (about 5,000 tokens each), edits one file and
finishes; verify (``exit 1``) always fails, so the loop goes on to the next turn. The local
model enforces ``--window`` (``prompt is too long`` past it) and simulates prompt caching
as the API does (a prefix seen before, up to a ``cache_control`` mark, is read from the
cache); every figure comes from the usage it reported.

Prints: the peak request (input tokens) against the window, the largest conversation
sent and the one stored at the end, the shrinks, and the cache share: cache-read input
tokens over all input tokens on steps 2+ of a turn (the steps that can hit the cache;
the first call of a turn follows verify and a new prompt). Target: at least 80%.
``--smoke``: 3 turns of 2 reads (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
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
from jobs import entry as _entry  # noqa: F401 - registers the job functions the worker runs
from jobs.dispatch import start_loop

REPO = "bench/tokens"
TARGET = 0.80
BIG = "".join(f"def helper_{i:04d}(x):\n    return x * {i} + {i % 7}  # pad\n" for i in range(410))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--reads", type=int, default=8, help="20 KB reads per turn")
    ap.add_argument("--window", type=int, default=200_000, help="the model's context window")
    args = _smoke.parse(ap, turns=3, reads=2)
    configure("json", level=logging.WARNING)
    b = _env.start()
    try:
        b.model.window_override = args.window
        iid = b.github.add_installation("bench")
        yml = (
            f"verify: exit 1\nmax_turns: {args.turns}\nmax_cost_usd: 1000\n"
            "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
        )
        files = {".github/loop.yml": yml, "app.py": "x = 0\n", "big.txt": BIG}
        b.github.add_repo(REPO, files, installation_id=iid)
        with b.github.as_user("bench") as u:
            n = u.post(f"/repos/{REPO}/issues", json={"title": "t", "body": "b"}).json()["number"]
            u.post(f"/repos/{REPO}/issues/{n}/labels", json={"labels": ["loop:ready"]})
        answered: list[dict[str, Any]] = []  # the requests the model answered, in order
        state = {"turn": 0, "step": 0}

        def respond(body: dict[str, Any]) -> m.Item:
            answered.append(body)
            last = body["messages"][-1]["content"]
            results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
            if not results or not str(results[0].get("tool_use_id", "")).startswith("toolu_"):
                state["turn"], state["step"] = state["turn"] + 1, 0
            state["step"] += 1
            step = state["step"]
            if step <= args.reads:
                return m.bash(f"cat big.txt  # turn {state['turn']} read {step}")
            if step == args.reads + 1:
                return m.write_file("app.py", f"x = {state['turn']}\n")
            return m.text(f"Turn {state['turn']}: set x.")

        b.model.responder = respond
        start_loop(b.rt, REPO, n, iid, "bench", repo_config.parse(yml))
        make_worker(ALL_QUEUES, b.rt.redis, Worker).work(burst=True)
        loop = LoopId(REPO, n)
        events = b.rt.store.events(loop, count=100_000)
        turns = sum(1 for e in events if e["kind"] == "turn_started")
        if turns != args.turns:  # the loop stopped early: the figures would be wrong
            raise SystemExit(f"the loop ran {turns} of {args.turns} turns; see {b.root}")
        report(args, answered, b.model.responses, b.model.input_tokens, events, b, loop)
    finally:
        b.close()


def report(
    args: argparse.Namespace,
    answered: list[dict[str, Any]],
    responses: list[dict[str, Any]],
    counted: list[int],
    events: list[dict[str, Any]],
    b: _env.Bench,
    loop: LoopId,
) -> None:
    if len(answered) != len(responses):
        raise SystemExit(f"{len(answered)} requests answered, {len(responses)} responses")
    later_read = later_all = read = total = 0
    for body, resp in zip(answered, responses, strict=True):
        u = resp["usage"]
        inp = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        total += inp
        read += u["cache_read_input_tokens"]
        last = body["messages"][-1]["content"]
        if any(isinstance(x, dict) and x.get("type") == "tool_result" for x in last) and not any(
            isinstance(x, dict) and x.get("type") == "text" for x in last
        ):  # a step 2+: the turn's prompt is not in the last message
            later_all += inp
            later_read += u["cache_read_input_tokens"]
    share = later_read / later_all if later_all else 0.0
    sent = max(len(json.dumps(body["messages"])) for body in answered)
    stored = len(json.dumps(b.rt.store.conversation(loop)))
    shrinks = [e["data"] for e in events if e["kind"] == "context_shrunk"]
    too_long = sum(1 for e in events if e["kind"] == "context_full")
    peak = max(counted)
    print(
        f"{args.turns} turns x ({args.reads} reads of 20 KB + 1 edit), "
        f"{len(answered)} model calls, window {args.window:,} tokens"
    )
    print(f"  peak request        {peak:,} input tokens ({peak / args.window:.0%} of the window)")
    print(f"  largest sent        {sent / 1024:.0f} KB of messages")
    print(f"  stored at the end   {stored / 1024:.0f} KB")
    levels = ", ".join(sorted({str(s["level"]) for s in shrinks})) or "none"
    print(f"  shrinks             {len(shrinks)} ({levels}); turns ended full: {too_long}")
    print(f"  cache share         {share:.1%} on steps 2+ (all calls: {read / total:.1%})")
    verdict = "meets" if share >= TARGET else "MISSES"
    print(f"  target              cache share >= {TARGET:.0%}: {verdict}")
    if not args.smoke and share < TARGET:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
