"""A CLI's HOME seen from the harness (``jobs.sandbox.home``): the seed it stages under
the data directory never stays on the disk."""

from __future__ import annotations

import os
from pathlib import Path

from jobs.sandbox.home import SEED_PARENT, HomeLink


def test_a_seed_left_by_a_killed_worker_is_swept_and_a_live_one_kept(tmp_path: Path) -> None:
    parent = tmp_path / SEED_PARENT
    gone = parent / "seed-999999999-abc"  # past any pid_max: that process is gone
    live = parent / f"seed-{os.getpid()}-def"
    for seed in (gone, live):
        (seed / ".loopbot").mkdir(parents=True)
        (seed / ".loopbot" / "prompt.txt").write_text("a turn's prompt\n")
    with HomeLink(tmp_path, None) as home:
        assert home.seed.parent == parent and home.seed.is_dir()
        assert not gone.exists() and live.is_dir()
    assert not home.seed.exists()  # closed without a sandbox: its own seed goes too
