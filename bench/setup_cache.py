"""`setup` with and without the repository's dependency cache (jobs/loop/setup_phase.py).

    sudo .venv/bin/python bench/setup_cache.py [--packages 40] [--size-kb 300] [--delay 0.25]
                                              [--rounds 3] [--smoke]

A local package index (bot/standins/pkgindex.py) on 127.0.0.50:80 serves ``--packages``
wheels of ``--size-kb`` each, waiting ``--delay`` seconds before each file (a registry's
latency and transfer time); the operator's setting allows that address
(LOOPBOT_EGRESS_ALLOWED_NETWORKS), the loop's ``setup_network`` names it. Each round is
two loops of one repository on one worker: a fresh worktree and the real setup sandbox
(bubblewrap, the egress proxy), ``pip install`` of every package into the worktree; the
first loop with an empty cache, the second with what the first left. Prints the median
setup time of each and the wheel downloads each made. Needs root (port 80: the egress
proxy allows only ports 80 and 443). ``--smoke``: 3 packages, no delay, one round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _smoke
from bot.standins.pkgindex import PackageIndex
from jobs.loop import setup_phase
from tests.helpers import worker_settings

HOST = "127.0.0.50"


def one_setup(base: Path, settings: object, cache: Path, command: str) -> float:
    work = Path(tempfile.mkdtemp(dir=base))
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    phase = setup_phase.SetupPhase(
        work,
        settings=settings,  # type: ignore[arg-type]
        network=(HOST,),
        timeout=600,
        readonly=(),
        cache=cache,
    )
    try:
        started = time.monotonic()
        result = phase.run(command)
        seconds = time.monotonic() - started
    finally:
        phase.close()
    if not result.passed:
        sys.exit(f"setup failed ({result.exit_code}): {result.output[-800:]}")
    shutil.rmtree(work, ignore_errors=True)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", type=int, default=40)
    ap.add_argument("--size-kb", type=int, default=300)
    ap.add_argument("--delay", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=3)
    args = _smoke.parse(ap, packages=3, size_kb=10, delay=0.0, rounds=1)
    if os.geteuid() != 0:
        sys.exit("setup_cache.py needs root: the index listens on port 80")
    names = [f"benchdep{i}" for i in range(args.packages)]
    index = PackageIndex(names, host=HOST, port=80, delay=args.delay, payload=args.size_kb << 10)
    index.start()
    command = (
        f"python3 -m pip install -q --no-deps --target .deps --retries 0 --timeout 30 "
        f"--trusted-host {HOST} --index-url {index.url} {' '.join(names)}"
    )
    first, second, downloads = [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="loopbot-bench-setup-") as tmp:
            base = Path(tmp)
            settings = worker_settings(base).model_copy(
                update={"egress_allowed_networks": f"{HOST}/32"}
            )
            for n in range(args.rounds):
                cache = setup_phase.cache_dir(settings.data_dir, 1, 100 + n, "bench/setup")
                before = sum(index.files.values())
                first.append(one_setup(base, settings, cache, command))
                middle = sum(index.files.values())
                second.append(one_setup(base, settings, cache, command))
                downloads.append((middle - before, sum(index.files.values()) - middle))
    finally:
        index.stop()
    print(
        f"setup: pip install of {args.packages} wheels of {args.size_kb} KiB, "
        f"{args.delay:.2f} s per download, {args.rounds} round(s)"
    )
    print(
        f"first loop (empty cache)      {statistics.median(first):8.2f} s  "
        f"({downloads[0][0]} downloads)"
    )
    print(
        f"second loop (the first's cache) {statistics.median(second):6.2f} s  "
        f"({downloads[0][1]} downloads)"
    )


if __name__ == "__main__":
    main()
