"""A chaos soak: many loops on a whole deployment while a seeded injector breaks it.

    .venv/bin/python bench/chaos.py [--seed S] [--loops 24] [--repos 4] [--slots 4]
        [--latency 1.0] [--gap 20] [--smoke]

The deployment: Redis under Sentinel (a master, a replica, three sentinels), two ``loopbot
web`` processes behind a small front (GitHub's webhooks go to whichever answers), two
``loopbot worker --loops SLOTS`` processes with their own data directories (two machines),
the local GitHub (its secondary limit of 80 writes a minute on) and the local model. The
built-in agent only: the CLI backends are not run here.

Two phases on the same deployment, the same seed, the same plan of loops (``--loops``
issues over ``--repos`` repositories of two installations; by the seed, each needs one or
two turns): first a calm one, no fault injected; then the chaos one, on fresh
repositories, while the injector, every ``--gap`` seconds on average (seeded), does one of
``KINDS``: SIGKILL or SIGTERM a worker (and start it again), a Sentinel failover (the
master SIGKILLed, the old one restarted as a replica), restart a web process, the local
GitHub answering a burst of 5xx, of secondary-limit 403s, of requests that time out,
or slowly for a while; the local model answering 529s, 500s, an answer cut mid-way, a
stall past the stall timeout. The injections' times depend on the machine (what happens
at each depends on what runs then); the seed fixes the plan, the kinds and the gaps.

At the end it checks (a violation makes the exit status non-zero):
  every loop merged, or ended with a stated reason; none left active without a lease;
  at most one pull request per issue; no commit seen on a loop's branch was dropped from
  it later (every head seen, polled every 0.5 s, is an ancestor of the branch's last
  head); no loop's billed spend (the model server's own records, priced at
  bot.core.pricing with 1-hour cache writes at 2x input) over its ``max_cost_usd``; no
  sandbox, CLI or git process left behind (once the workers are stopped, none whose
  command line, environment or working directory is under this run's directory; while
  they idle, none but python below them); Redis's memory back near its start.
And prints, per fault kind: how many were injected, how many loops were running then,
and the median extra time to merge of those loops against the calm phase's same loop.
``--smoke``: 2 loops, 2 repositories, every kind once, 0.1 s latency (well under a
minute); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from flask import Flask, Response, request
from redis import Redis
from redis.exceptions import RedisError

from bench import _env, _smoke
from bot.core import pricing
from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
from bot.core.settings import load_settings
from bot.io.redis import connect
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import serving
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import SentinelSet, free_port

VERIFY = "! grep -rqs draft tests/"
BUDGET = 0.5  # max_cost_usd of every repository
TAG = re.compile(r"chaos-([a-z]+)-(\d+)")
KINDS = (
    "worker_sigkill",
    "worker_sigterm",
    "sentinel_failover",
    "web_restart",
    "github_5xx",
    "github_secondary",
    "github_timeout",
    "github_slow",
    "model_529",
    "model_500",
    "model_cut",
    "model_stall",
)
# How long a SIGTERMed worker may take to hand its loops over before the soak kills it and
# counts a violation (the deploy's own limit, systemd's TimeoutStopSec, is 65 minutes).
DRAIN_LIMIT = 600.0
PROCESS_KINDS = {"worker_sigkill", "worker_sigterm", "sentinel_failover", "web_restart"}
STALL_TIMEOUT = 4.0  # LOOPBOT_STALL_TIMEOUT: a stall fault answers after longer
GITHUB_TIMEOUT = 4.0  # LOOPBOT_GITHUB_TIMEOUT: a timeout fault answers after longer


def yml(loops: int) -> str:
    return (
        f'verify: "{VERIFY}"\nmax_turns: 4\nmax_parallel: {loops}\nmax_cost_usd: {BUDGET}\n'
        "triage:\n  enabled: false\n"
    )


# -- the model ---------------------------------------------------------------------------


class Model:
    """The scripted model (as bench/fleet.py's): a loop's first turn writes its note, as a
    draft when the plan gives it two turns; the second finishes it; the critic approves.
    Faults queued in ``pending`` are used first, one a call."""

    def __init__(self, latency: float, two_turns: set[str]) -> None:
        self.latency = latency
        self.two_turns = two_turns  # tags (chaos-phase-i) whose first turn leaves a draft
        self.pending: collections.deque[str] = collections.deque()
        self.lock = threading.Lock()

    def respond(self, body: dict[str, Any]) -> m.Item:
        with self.lock:
            fault = self.pending.popleft() if self.pending else None
        if fault == "model_529":
            return m.Fail(529, "Overloaded", "overloaded_error")
        if fault == "model_500":
            return m.Fail(500, "Internal server error", "api_error")
        time.sleep(self.latency)
        reply = self.answer(body)
        if fault == "model_cut":
            reply.cut_after = 80
        elif fault == "model_stall":
            reply.delay = STALL_TIMEOUT + 2
        return reply

    def answer(self, body: dict[str, Any]) -> m.Reply:
        def note(said: str) -> tuple[str, bool]:
            found = TAG.search(said)
            tag = found.group(0) if found else "chaos-x-0"
            return f"tests/{tag}.txt", tag in self.two_turns

        return _env.scripted_answer(body, note)


def billed(model: AnthropicServer) -> dict[str, float]:
    """USD billed per loop tag, from the model server's own record of what it answered:
    each answer's usage at the model's prices, a 1-hour cache write at 2x input (what
    the API bills), a 5-minute one at the table's price."""
    out: dict[str, float] = collections.defaultdict(float)
    with model.lock:
        exchanges = list(model.exchanges)
    for body, message in exchanges:
        found = TAG.search(json.dumps(body.get("messages", [])))
        if not found:
            continue
        u = message["usage"]
        p = pricing.price(str(message.get("model")))
        split = u.get("cache_creation") or {}
        one_hour = int(split.get("ephemeral_1h_input_tokens", 0))
        five = int(u.get("cache_creation_input_tokens", 0)) - one_hour
        out[found.group(0)] += (
            u["input_tokens"] * p.input
            + u["output_tokens"] * p.output
            + five * p.cache_write
            + one_hour * 2 * p.input
            + u["cache_read_input_tokens"] * p.cache_read
        ) / 1_000_000
    return out


# -- processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    """One ``loopbot`` process the soak starts, stops and starts again."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    offset: int = 0  # the log's size when it was last started

    def start(self) -> None:
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        self.popen = _env.spawn(self.args, self.env, self.log)

    def wait_started(self, timeout: float = 120) -> None:
        """Until the supervisor has started its slots (its SIGTERM handler is in place
        then: a SIGTERM before it kills the process outright, which says nothing of a
        hand-over). Start-up takes seconds on a loaded machine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                if b"supervisor.started" in f.read():
                    return
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill_tree(self) -> None:
        """SIGKILL the process and everything below it, as when its machine goes away
        (RQ's work horse calls setsid(): the process group is not enough)."""
        if not self.running:
            return
        assert self.popen is not None
        for pid in reversed(_env.tree(self.popen.pid, _env.children_of())):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM, as a deploy does; the exit status, or None if it outlived ``timeout``
        (then it is killed)."""
        if not self.running:
            return None
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            return None


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 within {timeout}s")


class Front:
    """What GitHub's webhooks reach: a balancer over the web processes, round robin,
    trying the next one when one does not answer (a web being restarted)."""

    def __init__(self, webs: list[tuple[Proc, int]]) -> None:
        self.webs = webs
        self.turn = 0
        self.retried = 0
        app = Flask("chaos-front")
        app.add_url_rule("/webhook", "webhook", self.forward, methods=["POST"])
        self.server, self.url = serving.serve(app, "127.0.0.1", 0, "chaos-front")

    def forward(self) -> Response:
        body = request.get_data()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.turn += 1
            _, port = self.webs[self.turn % len(self.webs)]
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/webhook", content=body, headers=headers, timeout=10
                )
            except httpx.HTTPError:
                self.retried += 1
                time.sleep(0.1)
                continue
            return Response(r.content, status=r.status_code)
        return Response(b"no web process answered", status=502)

    def stop(self) -> None:
        serving.stop(self.server)


# -- the deployment ----------------------------------------------------------------------


class Deployment:
    def __init__(self, root: Path, slots: int, loops: int) -> None:
        self.root = root
        self.sentinels = SentinelSet(replicas=1, sentinels=3, down_after_ms=1000).start()
        self.github = GitHubServer(root / "github").start()
        self.github.write_limit, self.github.write_window = 80, 60.0  # GitHub's own
        self.model = AnthropicServer().start()
        self.env = {
            **os.environ,
            "REDIS_URL": "redis://not-used:6379/0",
            "REDIS_SENTINELS": self.sentinels.hosts,
            "REDIS_SENTINEL_MASTER": self.sentinels.master_name,
            **_env.standin_env(self.github, self.model),
            "LOOPBOT_MODEL": "claude-sonnet-4-6",
            "LOOPBOT_CRITIC_MODEL": "claude-sonnet-4-6",
            "LOOPBOT_LOG_FORMAT": "json",
            "LOOPBOT_MAX_PARALLEL": str(loops),
            "LOOPBOT_GITHUB_WRITE_GAP": "0.2",
            "LOOPBOT_GITHUB_TIMEOUT": str(GITHUB_TIMEOUT),
            "LOOPBOT_GITHUB_MAX_RETRY_WAIT": "10",
            "LOOPBOT_STALL_TIMEOUT": str(STALL_TIMEOUT),
            "LOOPBOT_LEASE_TTL": "8",
            "LOOPBOT_RECONCILE_INTERVAL": "2",
            # A webhook answered 503 while Redis fails over is not redelivered by GitHub:
            # the sweep starts its loop (every 10 minutes by default).
            "LOOPBOT_SWEEP_INTERVAL": "15",
            # Every kill is a resume: the soak's loops may be resumed more often than a
            # deployment's would, and ending on the cap would hide what it tests.
            "LOOPBOT_MAX_AUTO_RESUMES": "10",
        }
        self.settings = load_settings({**self.env, "LOOPBOT_DATA_DIR": str(root)}, role="worker")
        self.redis: Redis = connect(self.settings.redis_url)
        self.store = Store(self.redis)
        self.workers = [
            Proc(
                f"worker-{n}",
                ["worker", "--loops", str(slots)],
                {**self.env, "LOOPBOT_DATA_DIR": str(root / f"data-{n}")},
                root / f"worker-{n}.log",
            )
            for n in "ab"
        ]
        self.webs: list[tuple[Proc, int]] = []
        for n in "ab":
            port = free_port()
            args = ["web", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
            env = {**self.env, "LOOPBOT_DATA_DIR": str(root / "web")}
            self.webs.append((Proc(f"web-{n}", args, env, root / f"web-{n}.log"), port))
        for proc in self.workers:
            proc.start()
        for proc, _ in self.webs:
            proc.start()
        for proc in self.workers:
            proc.wait_started()
        for _, port in self.webs:
            wait_http(f"http://127.0.0.1:{port}/healthz")
        self.front = Front(self.webs)
        self.github.webhook_url = self.front.url + "/webhook"

    def master_memory(self) -> int:
        port = self.sentinels.master_port()
        assert port is not None
        with self.sentinels.client(port) as c:
            return int(c.info("memory")["used_memory"])

    def close(self) -> None:
        for proc in self.workers:
            proc.kill_tree()
        for proc, _ in self.webs:
            proc.kill_tree()
        self.front.stop()
        self.github.stop()
        self.model.stop()
        self.redis.close()
        self.sentinels.stop()


# -- the injector ------------------------------------------------------------------------


@dataclass
class Injection:
    kind: str
    at: float
    took: float = 0.0
    note: str = ""


class Injector(threading.Thread):
    """Every ``gap`` seconds on average (an exponential gap from the seed), one fault of
    the next kind from the seed's order (each kind as often as another), until stopped."""

    def __init__(self, d: Deployment, model: Model, seed: int, gap: float, once: bool) -> None:
        super().__init__(daemon=True, name="chaos-injector")
        self.d, self.model, self.gap, self.once = d, model, gap, once
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.injections: list[Injection] = []
        self.errors: list[str] = []
        self.helpers: list[threading.Thread] = []
        self.failover_lock = threading.Lock()
        self.longest_drain = 0.0  # seconds from a worker's SIGTERM to its exit

    def plan(self) -> list[str]:
        kinds = list(KINDS)
        self.rng.shuffle(kinds)
        if self.once:
            # The smoke's faults come together at the start, those that stop a process
            # first: its loops are coding then, and a critic or gate job killed with its
            # worker waits reconciler.STRANDED_GRACE_SECONDS (5 minutes) to be given again.
            kinds.sort(key=lambda k: k not in PROCESS_KINDS)
        return kinds

    def run(self) -> None:
        order: list[str] = []
        while not self.done.is_set():
            if not order:
                if self.once and self.injections:
                    return
                order = self.plan()
            wait = self.rng.expovariate(1 / self.gap)
            if self.done.wait(min(wait, self.gap * 3)):
                return
            kind = order.pop(0)
            inj = Injection(kind, time.time())
            self.injections.append(inj)
            # Each fault in its own thread: a worker's SIGTERM hand-over may take seconds,
            # and the other faults go on meanwhile.
            t = threading.Thread(target=self.inject, args=(inj,), daemon=True)
            t.start()
            self.helpers.append(t)

    def inject(self, inj: Injection) -> None:
        started = time.monotonic()
        try:
            getattr(self, inj.kind)(inj)
        except Exception as exc:  # noqa: BLE001 - the soak goes on; reported at the end
            self.errors.append(f"{inj.kind}: {type(exc).__name__}: {exc}")
        inj.took = time.monotonic() - started

    def finish(self) -> None:
        self.done.set()
        self.join()
        for t in self.helpers:
            t.join(180)
        self.d.github.request_delay = 0.0
        for proc in self.d.workers:  # a worker a fault left stopped runs again
            with proc.lock:
                if not proc.running:
                    proc.start()

    # -- the kinds -------------------------------------------------------------------

    def _worker(self, n: int) -> Proc:
        """The worker a fault stops: by the seed; in the smoke, where the two come at
        once, each its own (one would wait for the other's restart)."""
        return self.d.workers[n] if self.once else self.rng.choice(self.d.workers)

    def worker_sigkill(self, inj: Injection) -> None:
        proc = self._worker(0)
        with proc.lock:
            if not proc.running:
                inj.note = f"{proc.name} already down"
                return
            proc.kill_tree()
            time.sleep(2)  # the machine comes back
            proc.start()
            inj.note = proc.name
            proc.wait_started()

    def worker_sigterm(self, inj: Injection) -> None:
        proc = self._worker(1)
        with proc.lock:
            if not proc.running:
                inj.note = f"{proc.name} already down"
                return
            # A drain lets a critic or gate job finish its review or merge (GitHub's pauses
            # included), so it can outlast two minutes under these faults: the deploy's
            # contract is systemd's TimeoutStopSec (65 min). The soak allows 10 minutes and
            # reports the longest.
            started = time.monotonic()
            status = proc.terminate(DRAIN_LIMIT)
            took = time.monotonic() - started
            self.longest_drain = max(self.longest_drain, took)
            inj.note = f"{proc.name} exited {status} after {took:.0f} s"
            proc.start()
            proc.wait_started()
            if status != 0:
                self.errors.append(f"worker_sigterm: {proc.name} exited {status} (killed)")

    def sentinel_failover(self, inj: Injection) -> None:
        s = self.d.sentinels
        with self.failover_lock:
            old = s.master_port()
            assert old is not None, "no master"
            s.wait_in_sync(old)
            s.kill_master()
            new = s.wait_failover(old, timeout=60)
            s.restart_node(old)  # it comes back as a replica of the new master
            inj.note = f"{old} -> {new}"

    def web_restart(self, inj: Injection) -> None:
        proc, port = self.rng.choice(self.d.webs)
        with proc.lock:
            proc.terminate(30)
            proc.start()
            wait_http(f"http://127.0.0.1:{port}/healthz")
            inj.note = proc.name

    def github_5xx(self, inj: Injection) -> None:
        n = self.rng.randint(3, 8)
        self.d.github.inject("*", r"^/(repos|installation|app)", 502, times=n)
        inj.note = f"{n} x 502"

    def github_secondary(self, inj: Injection) -> None:
        n = self.rng.randint(2, 5)
        body = {
            "message": "You have exceeded a secondary rate limit. Please wait a few "
            "minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
        }
        self.d.github.inject(
            "*", r"^/repos/", 403, times=n, headers={"Retry-After": "2"}, body=body
        )
        inj.note = f"{n} x 403 Retry-After 2"

    def github_timeout(self, inj: Injection) -> None:
        n = self.rng.randint(1, 3)
        self.d.github.inject("*", r"^/repos/", 504, times=n, delay=GITHUB_TIMEOUT + 1.5)
        inj.note = f"{n} x no answer in {GITHUB_TIMEOUT + 1.5:.1f} s"

    def github_slow(self, inj: Injection) -> None:
        self.d.github.request_delay = 0.5
        time.sleep(10)
        self.d.github.request_delay = 0.0
        inj.note = "0.5 s a request for 10 s"

    def _model(self, inj: Injection, n: int) -> None:
        with self.model.lock:
            self.model.pending.extend([inj.kind] * n)
        inj.note = f"the next {n} calls"

    def model_529(self, inj: Injection) -> None:
        self._model(inj, self.rng.randint(1, 3))

    def model_500(self, inj: Injection) -> None:
        self._model(inj, self.rng.randint(1, 2))

    def model_cut(self, inj: Injection) -> None:
        self._model(inj, 1)

    def model_stall(self, inj: Injection) -> None:
        self._model(inj, 1)


# -- watching ----------------------------------------------------------------------------


class Watcher(threading.Thread):
    """Every half second: each loop branch's head in each repository (to check later
    that no head seen was dropped), and when each loop was first seen ended."""

    def __init__(self, d: Deployment, keys: list[str]) -> None:
        super().__init__(daemon=True, name="chaos-watcher")
        self.d, self.keys = d, keys
        self.heads: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.ended: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        for name in {LoopId.parse(k).repo for k in self.keys}:
            path = self.d.github.repo(name).path
            out = subprocess.run(
                ["git", "-C", str(path), "for-each-ref", "--format=%(refname) %(objectname)"],
                capture_output=True,
                text=True,
            ).stdout
            for line in out.splitlines():
                ref, sha = line.split()
                if ref.startswith("refs/heads/loop/"):
                    seen = self.heads[(name, ref)]
                    if not seen or seen[-1] != sha:
                        seen.append(sha)
        for k in self.keys:
            if k in self.ended:
                continue
            with contextlib.suppress(RedisError):
                r = self.d.store.get(k)
                if r is not None and r.status in TERMINAL:
                    self.ended[k] = time.time()


# -- a phase -----------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    keys: list[str]
    tags: dict[str, str]  # key -> tag
    labelled: dict[str, float]
    watcher: Watcher
    injector: Injector | None
    seconds: float


def run_phase(
    d: Deployment,
    model: Model,
    name: str,
    args: argparse.Namespace,
    two_turns: list[int],
    inject: bool,
) -> Phase:
    iids = [d.github.add_installation(f"{name}{n}") for n in range(2)]
    repos = [f"{name}{i % 2}/r{i}" for i in range(args.repos)]
    for i, repo in enumerate(repos):
        files = {".github/loop.yml": yml(args.loops), "README.md": f"# {repo}\n"}
        d.github.add_repo(repo, files, installation_id=iids[i % 2], collaborators={"w": "write"})
    keys, tags = [], {}
    with d.github.as_user("w") as u:
        for i in range(args.loops):
            repo = repos[i % len(repos)]
            tag = f"chaos-{name}-{i}"
            body = f"Add tests/{tag}.txt saying done ({tag})."
            r = u.post(f"/repos/{repo}/issues", json={"title": f"note {i}", "body": body})
            key = LoopId(repo, int(r.json()["number"])).key
            keys.append(key)
            tags[key] = tag
            if i in two_turns:
                model.two_turns.add(tag)
    watcher = Watcher(d, keys)
    watcher.start()
    injector = Injector(d, model, args.seed, args.gap, args.smoke) if inject else None
    started = time.time()
    labelled = {}
    with d.github.as_user("w") as u:
        for key in keys:
            loop = LoopId.parse(key)
            u.post(
                f"/repos/{loop.repo}/issues/{loop.issue}/labels", json={"labels": ["loop:ready"]}
            ).raise_for_status()
            labelled[key] = time.time()
    if injector is not None:
        injector.start()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and len(watcher.ended) < len(keys):
        time.sleep(1)
    if injector is not None:
        injector.finish()
    # Once the injector has let go, what it left running settles (a resumed loop ends).
    while time.monotonic() < deadline and len(watcher.ended) < len(keys):
        time.sleep(1)
    watcher.stop.set()
    watcher.join()
    watcher.poll()
    return Phase(name, keys, tags, labelled, watcher, injector, time.time() - started)


# -- the checks --------------------------------------------------------------------------


def leftovers(root: Path, below: list[int]) -> list[str]:
    """Processes of this run that should not be there: anything whose command line,
    environment or working directory names ``root``, except the pids in ``below`` and
    python processes among their descendants (the worker's own)."""
    mine = {os.getpid()}
    kids = _env.children_of()
    allowed = set()
    for pid in below:
        allowed |= set(_env.tree(pid, kids))
    out = []
    needle = str(root).encode()
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in mine:
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            exe = cmd.split(b"\0", 1)[0].decode(errors="replace")
            env = b""
            with contextlib.suppress(OSError):
                env = (proc / "environ").read_bytes()
            cwd = b""
            with contextlib.suppress(OSError):
                cwd = os.readlink(proc / "cwd").encode()
        except OSError:
            continue
        if needle not in cmd and needle not in env and needle not in cwd:
            continue
        if pid in allowed and ("python" in Path(exe).name or Path(exe).name == "loopbot"):
            continue
        if pid in allowed and "loopbot" in exe:
            continue
        shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:160]
        out.append(f"{pid} {shown}")
    return out


def check(d: Deployment, phase: Phase, violations: list[str]) -> dict[str, float]:
    """The invariants of one phase; the time to merge of each merged loop (by tag)."""
    spend = billed(d.model)
    ttm: dict[str, float] = {}
    for key in phase.keys:
        r = d.store.get(key)
        tag = phase.tags[key]
        if r is None:
            violations.append(f"{phase.name}: {key} has no record (its webhook lost?)")
            continue
        if r.status not in TERMINAL:
            holder = d.store.lease_holder(key)
            what = "without a lease" if holder is None else f"leased by {holder}"
            violations.append(f"{phase.name}: {key} still {r.status.value} {what}")
            print(f"  {phase.name}: {key} did not end; its events:")
            show_events(d, key, phase.labelled[key])
        elif os.environ.get("CHAOS_EVENTS") == tag:
            print(f"  {phase.name}: {key} ({tag}); its events:")
            show_events(d, key, phase.labelled[key])
        elif (r.status, r.reason) == (Status.COMPLETED, "merged"):
            ttm[tag] = phase.watcher.ended[key] - phase.labelled[key]
        elif not r.reason:
            violations.append(f"{phase.name}: {key} ended {r.status.value} with no reason")
        if spend.get(tag, 0.0) > BUDGET:
            violations.append(
                f"{phase.name}: {key} billed ${spend[tag]:.4f} > its budget ${BUDGET}"
            )
    for repo in {LoopId.parse(k).repo for k in phase.keys}:
        per_issue = collections.Counter(
            int(m_.group(1))
            for p in d.github.repo(repo).pulls.values()
            if (m_ := re.search(r"loop/issue-(\d+)", str(p.head)))
        )
        for issue, n in per_issue.items():
            if n > 1:
                violations.append(f"{phase.name}: {repo}#{issue} has {n} pull requests")
    for (repo, ref), shas in phase.watcher.heads.items():
        path = d.github.repo(repo).path
        for sha in shas[:-1]:
            if not gitrepo_is_ancestor(path, sha, shas[-1]):
                violations.append(
                    f"{phase.name}: {repo} {ref}: pushed {sha[:10]} is not in its last head "
                    f"{shas[-1][:10]} (heads seen: {' '.join(s[:10] for s in shas)})"
                )
    return ttm


def show_events(d: Deployment, key: str, since: float) -> None:
    for e in d.store.events(LoopId.parse(key), count=100_000):
        print(f"      {e['at'] - since:8.1f} {e['kind']:<18} {str(e['data'])[:140]}")


def gitrepo_is_ancestor(path: Path, sha: str, head: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(path), "merge-base", "--is-ancestor", sha, head],
            capture_output=True,
        ).returncode
        == 0
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def cost_table(calm: dict[str, float], chaos: Phase, chaos_ttm: dict[str, float]) -> list[str]:
    """Per fault kind: injected, loops running then, their median extra time to merge."""
    assert chaos.injector is not None
    rows = []
    by_kind: dict[str, list[Injection]] = collections.defaultdict(list)
    for inj in chaos.injector.injections:
        by_kind[inj.kind].append(inj)
    for kind in KINDS:
        injs = by_kind.get(kind, [])
        touched: set[str] = set()
        for inj in injs:
            for key in chaos.keys:
                end = chaos.watcher.ended.get(key, float("inf"))
                if chaos.labelled[key] <= inj.at < end:
                    touched.add(key)
        extra = []
        for key in touched:
            tag = chaos.tags[key]
            twin = tag.replace("chaos-chaos-", "chaos-calm-")
            if tag in chaos_ttm and twin in calm:
                extra.append(chaos_ttm[tag] - calm[twin])
        med = f"{statistics.median(extra):+8.1f} s" if extra else "       -  "
        rows.append(f"  {kind:<18} {len(injs):>8} {len(touched):>13}   {med}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--loops", type=int, default=24)
    ap.add_argument("--repos", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4, help="loop slots of each of the 2 workers")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per model call")
    ap.add_argument("--gap", type=float, default=20.0, help="mean seconds between faults")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per phase at most")
    ap.add_argument(
        "--calm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first the same loops without faults, to measure what each kind costs",
    )
    args = _smoke.parse(
        ap, loops=2, repos=2, slots=2, latency=0.1, gap=0.2, timeout=420.0, calm=False
    )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    args.seed = seed
    print(
        f"chaos: seed {seed} (reproduce: bench/chaos.py --seed {seed}"
        f"{' --smoke' if args.smoke else ''})",
        flush=True,
    )
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # the cut answers' tracebacks
    # A SIGTERM (a CI timeout) unwinds through ``finally``: the deployment's processes run
    # in sessions of their own and would outlive the soak.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = random.Random(seed)
    two_turns = [i for i in range(args.loops) if rng.random() < 0.5]
    root = Path(tempfile.mkdtemp(prefix="loopbot-chaos-"))
    violations: list[str] = []
    d = Deployment(root, args.slots, args.loops)
    try:
        model = Model(args.latency, set())
        d.model.responder = model.respond
        memory_start = d.master_memory()
        calm = run_phase(d, model, "calm", args, two_turns, inject=False) if args.calm else None
        calm_ttm = check(d, calm, violations) if calm is not None else {}
        chaos = run_phase(d, model, "chaos", args, two_turns, inject=True)
        chaos_ttm = check(d, chaos, violations)
        assert chaos.injector is not None
        violations += [f"injector: {e}" for e in chaos.injector.errors]
        # Idle now: nothing below a worker but its own python processes.
        running = [p.popen.pid for p in [*d.workers, *(w for w, _ in d.webs)] if p.popen]
        for left in leftovers(root, running):
            violations.append(f"left running while idle: {left}")
        memory_end = d.master_memory()
        for proc in d.workers:
            if proc.terminate(60) != 0:
                violations.append(f"{proc.name} did not stop cleanly on SIGTERM")
        for proc, _ in d.webs:
            proc.terminate(30)
        time.sleep(1)
        for left in leftovers(root, []):
            violations.append(f"left behind: {left}")
        n = args.loops
        allowed = 8 * 2**20 + 2 * 128 * 1024 * n  # records and event streams are kept
        if memory_end - memory_start > allowed:
            violations.append(
                f"Redis memory {memory_start / 2**20:.1f} MiB -> {memory_end / 2**20:.1f} MiB "
                f"(more than {allowed / 2**20:.1f} MiB for {2 * n} loops' records)"
            )
        spend = billed(d.model)
        print(
            f"chaos: {n} loops a phase over {args.repos} repositories (2 installations), "
            f"2 workers x {args.slots} slots, 2 web processes, Redis under Sentinel "
            f"(1 replica, 3 sentinels), model latency {args.latency:.1f} s, the built-in agent"
        )
        for ph, ttm in ((calm, calm_ttm), (chaos, chaos_ttm)):
            if ph is None:
                print("  calm  (not run: --no-calm; no cost per fault kind)")
                continue
            ended = [
                (r.status.value, r.reason)
                for r in (d.store.get(k) for k in ph.keys)
                if r is not None and r.status in TERMINAL
            ]
            xs = list(ttm.values())
            print(
                f"  {ph.name:<5} merged {len(ttm)}/{n}  ended {len(ended)}/{n}  "
                f"time to merge p50 {pct(xs, 0.5):.1f} s  p90 {pct(xs, 0.9):.1f} s  "
                f"max {max(xs, default=0):.1f} s  phase {ph.seconds:.0f} s"
            )
            for what, count in collections.Counter(ended).items():
                if what != ("completed", "merged"):
                    print(f"        ended {what[0]} ({what[1]}): {count}")
        worst = max(spend.values(), default=0.0)
        print(
            f"  billed by the model server: ${sum(spend.values()):.4f}, most by one loop "
            f"${worst:.4f} (budget ${BUDGET} each)"
        )
        print(
            f"  Redis used_memory {memory_start / 2**20:.1f} MiB at the start, "
            f"{memory_end / 2**20:.1f} MiB at the end"
        )
        print(f"  webhooks retried by the front (a web down): {d.front.retried}")
        print(f"  longest drain after a SIGTERM: {chaos.injector.longest_drain:.0f} s")
        print("  fault kind         injected  loops running   median extra time to merge")
        for row in cost_table(calm_ttm, chaos, chaos_ttm):
            print(row)
        for inj in chaos.injector.injections:
            t = inj.at - min(chaos.labelled.values())
            print(f"    {t:7.1f} s  {inj.kind:<18} {inj.note} ({inj.took:.1f} s)")
    finally:
        d.close()
    print(f"invariants: {'all held' if not violations else f'{len(violations)} violated'}")
    for v in violations:
        print(f"  VIOLATION {v}")
    print(f"seed {seed}; logs in {root}")
    if violations:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
