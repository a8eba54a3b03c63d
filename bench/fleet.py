"""A fleet: many loops at once on one machine, one installation, GitHub's limits enforced.

    .venv/bin/python bench/fleet.py [--loops 50] [--repos 3] [--latency 3] [--jitter 0.5]
        [--slots N] [--gap 1.0] [--smoke]

Starts a private redis-server, the local GitHub (enforcing GitHub's documented secondary
limits per installation: 80 content-creating requests a minute, 100 concurrent
requests; past them a 403 with the secondary-limit message), the local model answering
every call after ``--latency`` seconds on average (each call ``--jitter`` of it shorter
or longer, drawn evenly: a real model's calls vary, and calls that all take the same
time keep every loop in lockstep, so all their commits, pushes and verifies land in the
same second and measure the collision on this machine's two cores, not loopbot), the
web app, and ONE ``loopbot worker --loops SLOTS`` process (a supervisor and its
slots). Then ``--loops`` issues across ``--repos`` repositories of one installation are
labelled at once, through real webhooks. Each loop
runs two turns (the first leaves a draft that verify refuses, the second finishes it; the
note is under tests/, so no third turn asks for a test),
opens its pull request, is reviewed by the critic and merged. Triage is off: every model
call is the agent's or the critic's, each taking ``--latency`` seconds.

Prints: loops finished and merged; p50/p90 time per loop (label to merge); loopbot's
overhead per turn (from turn 1's start to turn 2's, minus the model's and verify's time,
and minus the turn's waits for GitHub's pace; then again with those waits); how long the
pace held each loop (every job of it); peak memory (PSS) per loop slot and of the whole worker; CPU
seconds per loop; GitHub requests and writes per loop; 403/429 answers received, and how
many of them came after the first Retry-After was waited out.
``--smoke``: 3 loops, 2 repositories, 0.2 s latency, a 0.1 s write gap.
Before them, where a turn's time goes: the time between each two events that follow
each other from a turn's start on (p50, p90, over every loop).
``FLEET_EVENTS=OWNER/REPO#N`` also prints that loop's events, timed from the labelling;
``FLEET_WRITES=1`` every write GitHub counted.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from werkzeug.serving import make_server

from bench import _env, _smoke
from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
from bot.io.github import tally
from bot.io.logs import configure
from bot.io.metrics import paced_seconds
from bot.standins import anthropic as m
from bot.web.app import create_app

VERIFY = "! grep -rqs draft tests/"


def yml(loops: int) -> str:
    return f'verify: "{VERIFY}"\nmax_turns: 4\nmax_parallel: {loops}\ntriage:\n  enabled: false\n'


def respond_after(latency: float, jitter: float = 0.0, seed: int = 1) -> Any:
    """The model: turn 1 writes the issue's note as a draft, turn 2 finishes it; the
    critic approves. An answer takes ``latency`` seconds, times a factor drawn evenly
    from 1 - ``jitter`` to 1 + ``jitter`` (seeded: the same run draws the same)."""
    draw = random.Random(seed)
    lock = threading.Lock()

    def note(said: str) -> tuple[str, bool]:
        name = re.search(r"fleet-(\d+)", said)
        return f"tests/fleet-{name.group(1) if name else 'x'}.txt", True

    def respond(body: dict[str, Any]) -> m.Item:
        with lock:
            factor = draw.uniform(1 - jitter, 1 + jitter)
        time.sleep(latency * factor)
        return _env.scripted_answer(body, note)

    return respond


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # own and reaped
        except (OSError, ValueError, IndexError):
            continue
    return total / tick


class Sampler(threading.Thread):
    """Every half second: the PSS of each slot's tree (slot, its work horse, what the
    horse runs) and of the whole worker; the peaks are kept."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak_slot_kb = 0
        self.slot_peaks: dict[int, int] = {}
        self.peak_total_kb = 0
        self.cpu = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            kids = _env.children_of()
            total = 0
            for slot in kids.get(self.root, []):
                kb = sum(pss_kb(p) for p in _env.tree(slot, kids))
                self.slot_peaks[slot] = max(self.slot_peaks.get(slot, 0), kb)
                total += kb
            total += pss_kb(self.root)
            self.peak_total_kb = max(self.peak_total_kb, total)
            self.cpu = max(self.cpu, cpu_seconds(_env.tree(self.root, kids)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=50)
    ap.add_argument("--repos", type=int, default=3)
    ap.add_argument("--latency", type=float, default=3.0, help="seconds per model call")
    ap.add_argument(
        "--jitter",
        type=float,
        default=0.5,
        help="a model call takes latency x (1 +- up to this); 0: every call the same",
    )
    ap.add_argument("--slots", type=int, default=0, help="loop slots (default: --loops)")
    ap.add_argument("--gap", type=float, default=1.0, help="LOOPBOT_GITHUB_WRITE_GAP")
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = _smoke.parse(ap, loops=3, repos=2, latency=0.2, gap=0.1, timeout=300.0)
    slots = args.slots or args.loops
    configure("json", level=logging.WARNING)
    b = _env.start(
        {
            "LOOPBOT_GITHUB_WRITE_GAP": str(args.gap),
            "LOOPBOT_MAX_PARALLEL": str(args.loops),
            "LOOPBOT_LOG_FORMAT": "json",
            "LOOPBOT_MODEL": "claude-test",
            "LOOPBOT_CRITIC_MODEL": "claude-test",
        }
    )
    worker: subprocess.Popen[bytes] | None = None
    server = None
    try:
        gh = b.github
        gh.write_limit, gh.write_window = 80, 60.0  # GitHub: 80 content-creating a minute
        gh.concurrent_limit = 100  # GitHub: 100 concurrent requests
        b.model.responder = respond_after(args.latency, args.jitter)
        server = make_server("127.0.0.1", 0, create_app(b.rt.settings, b.rt.redis), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        gh.webhook_url = f"http://127.0.0.1:{server.server_port}/webhook"
        iid = gh.add_installation("fleet")
        repos = [f"fleet/r{i}" for i in range(args.repos)]
        for repo in repos:
            files = {".github/loop.yml": yml(args.loops), "README.md": "# fleet\n"}
            gh.add_repo(repo, files, installation_id=iid, collaborators={"writer": "write"})
        keys = []
        with gh.as_user("writer") as u:
            for i in range(args.loops):
                repo = repos[i % len(repos)]
                body = f"Add tests/fleet-{i}.txt saying done (fleet-{i})."
                n = u.post(f"/repos/{repo}/issues", json={"title": f"note {i}", "body": body})
                keys.append(LoopId(repo, int(n.json()["number"])).key)
        log = b.root / "worker.log"
        worker = _env.spawn(["worker", "--loops", str(slots)], {**os.environ, **b.env}, log)
        sampler = Sampler(worker.pid)
        sampler.start()
        time.sleep(2)  # the slots start (each connects, the scheduler takes its lock)
        before, not_modified_before = len(gh.requests), len(gh.not_modified)
        tally_before = tallies(b.rt.redis)
        labelled = time.time()
        with gh.as_user("writer") as u:
            for key in keys:
                loop = LoopId.parse(key)
                u.post(
                    f"/repos/{loop.repo}/issues/{loop.issue}/labels",
                    json={"labels": ["loop:ready"]},
                ).raise_for_status()
        store = b.rt.store
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            records = [store.get(k) for k in keys]
            if all(r is not None and r.status in TERMINAL for r in records):
                break
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode}); see {log}")
            time.sleep(1)
        settle(b.rt.redis, deadline)  # the gate's last writes come after the loop's end
        sampler.stop.set()
        sampler.join()
        report(args, slots, keys, b, sampler, labelled, (before, not_modified_before), tally_before)
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        if server is not None:
            server.shutdown()
        b.close()


def tallies(redis: Any) -> dict[tuple[str, str, str, str], int]:
    """loopbot's own count of its GitHub requests: (job, phase, kind, route) -> requests.
    A loopbot from before phases were counted (a run interleaved with an older commit)
    gives no phase."""
    by_phase = getattr(tally, "by_phase", None)
    if by_phase is not None:
        return {tuple(c): v for c, v in by_phase(redis).items()}  # type: ignore[misc]
    return {(j, "", k, w): v for (j, k, w), v in tally.counts(redis).items()}


def settle(redis: Any, deadline: float) -> None:
    """Wait until no job waits or runs: a loop's end is recorded before its gate's last
    writes (the receipt, the branch's deletion, the status comment), which count too."""
    from rq import Queue
    from rq.registry import StartedJobRegistry

    from bot.io.queues import ALL_QUEUES

    queues = [Queue(q, connection=redis) for q in ALL_QUEUES]
    while time.monotonic() < deadline:
        busy = sum(len(q) + len(StartedJobRegistry(queue=q)) for q in queues)
        if not busy:
            return
        time.sleep(0.5)


# Events that mean a new job (another process) ran between two turns: such a pair is not
# one turn's cycle, and the pace's count of waits starts again in the new job.
NEW_JOB = {"loop_started", "loop_resumed", "handoff", "pr_opened", "review_started"}


def _gaps(events: list[dict[str, Any]], out: dict[str, list[float]]) -> None:
    """Milliseconds between each two events that follow each other, from a turn's start
    to the end of its job, by the pair of kinds."""
    inside = False
    prev = None
    for e in events:
        if e["kind"] == "turn_started":
            inside = True
        if inside and prev is not None:
            out[f"{prev['kind']} -> {e['kind']}"].append((e["at"] - prev["at"]) * 1000)
        prev = e
        if e["kind"] in NEW_JOB:
            inside = False


def turn_cycles(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Each turn followed by another in the same job: its cycle (turn start to the next
    turn's start) minus the model's and verify's time, in ms; and its waits for GitHub's
    pace, in seconds."""
    out: list[tuple[float, float]] = []
    current: dict[str, Any] | None = None
    model = verify = 0.0
    for e in events:
        kind, data = e["kind"], e["data"]
        if kind in NEW_JOB:
            current = None
        elif kind == "turn_completed":
            model += float(data.get("model_seconds", 0.0))
        elif kind == "verify":
            verify += float(data.get("seconds", 0.0))
        elif kind == "turn_started":
            if current is not None:
                cycle = e["at"] - current["at"]
                waited = float(data["github_wait"]) - float(current["data"]["github_wait"])
                out.append(((cycle - model - verify) * 1000, waited))
            current, model, verify = e, 0.0, 0.0
    return out


def report(
    args: argparse.Namespace,
    slots: int,
    keys: list[str],
    b: _env.Bench,
    sampler: Sampler,
    labelled: float,
    befores: tuple[int, int],
    tally_before: dict[tuple[str, str, str, str], int],
) -> None:
    store, gh = b.rt.store, b.github
    before, not_modified_before = befores  # the local GitHub's logs' lengths at the labelling
    records = [store.get(k) for k in keys]
    finished = [r for r in records if r is not None and r.status in TERMINAL]
    merged = [r for r in finished if (r.status, r.reason) == (Status.COMPLETED, "merged")]
    per_loop, overhead, own, model_s, paced = [], [], [], [], []
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    for k in keys:
        events = store.events(LoopId.parse(k), count=100_000)
        if os.environ.get("FLEET_EVENTS") == k:  # one loop's events, to see where time goes
            for e in events:
                print(f"{e['at'] - labelled:8.3f} {e['kind']:<16} {str(e['data'])[:150]}")
        end = [e["at"] for e in events if e["kind"] == "loop_finished"]
        if end:
            per_loop.append(end[-1] - labelled)
        model_s += [e["data"]["model_seconds"] for e in events if e["kind"] == "turn_completed"]
        _gaps(events, gaps)
        for ms, waited in turn_cycles(events):
            overhead.append(ms)
            own.append(ms - waited * 1000)
        paced.append(paced_seconds(b.rt.redis, k))
    if os.environ.get("FLEET_WRITES"):  # every write GitHub counted, timed from the labelling
        for at, method, path, _ in gh.write_log:
            if at >= labelled:
                print(f"{at - labelled:8.3f} {method:<6} {path}")
    for xs in (per_loop, overhead, own, paced):
        xs.sort()
    requests = [r for r in gh.requests[before:] if r[2] == "installation"]
    # Writes as GitHub counts them (content-creating: a GraphQL query is a read), from
    # loopbot's own tally by the job that sent each (bot/io/github/tally.py).
    tallied = {
        k: n - tally_before.get(k, 0)
        for k, n in tallies(b.rt.redis).items()
        if n > tally_before.get(k, 0)
    }
    # The headline counts are GitHub's (the local GitHub's log of content-creating
    # requests), so a run of an older loopbot, without the tally, counts the same way.
    writes = sum(1 for at, _, _, who in gh.write_log if at >= labelled)
    reads = len(requests) - writes
    # Reads GitHub answered 304 Not Modified (bot/io/github/conditional.py), among the reads.
    not_modified = [r for r in gh.not_modified[not_modified_before:] if r[2] == "installation"]
    after_first = []
    if gh.limited:
        first, wait = gh.limited[0][3], gh.limited[0][4]
        after_first = [x for x in gh.limited if x[3] > first + max(wait, 1)]

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")

    print("where a turn's time goes: ms between two events that follow each other")
    for name, xs in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
        xs.sort()
        print(f"  gap {name:<40} n={len(xs):3d} p50 {pct(xs, 0.5):8.1f} p90 {pct(xs, 0.9):8.1f}")
    n = len(keys)
    slot_peaks = sorted(sampler.slot_peaks.values())
    print(
        f"fleet: {n} loops, {args.repos} repositories, one installation, {slots} slots in one "
        f"worker, model latency {args.latency:.1f} s (+-{args.jitter:.0%}), "
        f"write gap {args.gap:.1f} s"
    )
    print(f"  loops finished {len(finished)}/{n}   merged {len(merged)}/{n}")
    print(
        f"  time per loop (label to finish): p50 {pct(per_loop, 0.5):.1f} s   "
        f"p90 {pct(per_loop, 0.9):.1f} s   max {per_loop[-1] if per_loop else 0:.1f} s"
    )
    print(
        f"  loopbot overhead per turn ({len(own)} turns; model, verify and waits for "
        f"GitHub's pace excluded): p50 {pct(own, 0.5):.0f} ms   p90 {pct(own, 0.9):.0f} ms"
    )
    print(
        f"  the same with the pace's waits: p50 {pct(overhead, 0.5):.0f} ms   "
        f"p90 {pct(overhead, 0.9):.0f} ms"
    )
    print(
        f"  waits for GitHub's pace per loop (all its jobs): p50 {pct(paced, 0.5):.1f} s   "
        f"p90 {pct(paced, 0.9):.1f} s"
    )
    print(f"  model seconds per turn (two calls): median {statistics.median(model_s or [0]):.2f} s")
    print(
        f"  memory per loop slot (peak PSS of a slot, its horse and what it runs): "
        f"median {statistics.median(slot_peaks or [0]) / 1024:.0f} MB   "
        f"max {(slot_peaks[-1] if slot_peaks else 0) / 1024:.0f} MB; whole worker peak "
        f"{sampler.peak_total_kb / 1024:.0f} MB"
    )
    print(f"  CPU per loop: {sampler.cpu / max(n, 1):.2f} s (the worker's processes)")
    print(
        f"  GitHub requests per loop: {len(requests) / n:.1f} ({writes / n:.1f} writes, "
        f"{reads / n:.1f} reads); peak in flight {gh.peak_inflight}"
    )
    print(
        f"  reads answered 304 (not counted against the rate limit): "
        f"{len(not_modified) / n:.1f} per loop"
    )
    # git's pushes are not REST writes and take no place in the pace: the loop's turns,
    # its catch-ups, and the merged branch's deletion (jobs/tree/remote_branch.py).
    pushes = sum(1 for at, _ in getattr(gh, "git_pushes", []) if at >= labelled)
    print(f"  git pushes per loop (not REST writes): {pushes / n:.1f}")
    # What the shared conditional-read bodies hold in Redis at the end (15 min TTL).
    held = list(b.rt.redis.scan_iter("loopbot:etag:*"))
    fields = sum(int(b.rt.redis.hlen(k)) for k in held)
    nbytes = sum(int(b.rt.redis.memory_usage(k) or 0) for k in held)
    print(
        f"  conditional-read bodies in Redis: {fields} in {len(held)} keys, "
        f"{nbytes / 1024:.0f} KiB ({nbytes / 1024 / n:.0f} KiB per loop)"
    )
    for kind, what in (
        ("write", "writes"),
        ("read", "reads answered in full"),
        ("read304", "reads answered 304"),
    ):
        # Writes by the job and its phase that made each (issue 43: each one justified
        # or cut); reads by the job.
        by = "job and phase" if kind == "write" else "job"
        print(f"  {what} per loop, by the {by} that sent them:")
        groups: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for (job, phase, k, route), count in tallied.items():
            if k == kind:
                group = f"{job}/{phase}" if kind == "write" and phase else job
                groups[group][route] += count
        for group, routes in sorted(groups.items(), key=lambda g: -g[1].total()):
            shown = ", ".join(f"{route} {c / n:.1f}" for route, c in routes.most_common())
            print(f"    {group:<22} {routes.total() / n:5.1f}: {shown}")
    print(
        f"  403/429 secondary-limit answers: {len(gh.limited)} "
        f"({len(after_first)} after the first Retry-After)"
    )
    if len(merged) != n:
        for r in records:
            if r is not None and r not in merged:  # how it ended, to see why
                print(f"  not merged: {r.key} {r.status.value} {r.reason}: {r.detail[:200]}")
        raise SystemExit(f"{n - len(merged)} loops did not merge; see {b.root}")


if __name__ == "__main__":
    main()
