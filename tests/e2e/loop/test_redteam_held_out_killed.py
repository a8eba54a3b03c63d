"""Red team for issue 44: a worker killed while held-out verify runs. Held-out verify
rewrites the loop's own worktree (the base's tests checked out, the change's new tests
``git rm``-ed) and puts it back only on the way out; a SIGKILL (the OOM killer, a lost
host) never gets there. The resumed loop keeps uncommitted changes as the agent's work,
so its next commit carries the held-out state: an honest agent's new test is deleted and
the fix merges without it. Real worker processes, as ``tests/e2e/test_worker_loops.py``."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from redis import Redis

from bot.core.record import TERMINAL, Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, _descendants, wait_for
from tests.e2e.test_worker_loops import FAST, _busy_slot, label_all, slots, where
from tests.helpers import CALC, REPO, TEST_CALC, reply_between_turns

KEY = f"{REPO}#1"
# verify: the repository's own script. It holds still (a slow suite) only in held-out
# verify: the fix in calc.py, the change's new test file not there; once.
CHECK = """\
if grep -q 'a + b' calc.py && [ ! -f test_more.py ] && [ ! -f .held ]; then
  touch .held
  sleep 120
fi
exec python3 -m unittest -v
"""
TEST_MORE = """\
import unittest

from calc import add


class MoreTest(unittest.TestCase):
    def test_negative(self):
        self.assertEqual(add(-2, -3), -5)
"""
YML = "verify: sh check.sh\nmax_turns: 4\ntriage:\n  enabled: false\n"
# An honest first turn: the fix and a new test for it.
HONEST = m.bash(
    "sed -i 's/a - b/a + b/' calc.py && cat > test_more.py <<'PY'\n" + TEST_MORE + "PY\n"
)


def test_redteam_worker_killed_in_held_out_verify_loses_the_agents_new_test(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    iid = github.add_installation("acme")
    files = {
        "calc.py": CALC,
        "test_calc.py": TEST_CALC,
        "check.sh": CHECK,
        ".gitignore": ".held\n",
        ".github/loop.yml": YML,
    }
    github.add_repo(REPO, files, installation_id=iid, collaborators={"writer": "write"})
    with github.as_user("writer") as u:
        u.post(f"/repos/{REPO}/issues", json={"title": "add", "body": "Fix calc.add."})
    first = [True]

    def respond(body: dict[str, Any]) -> m.Item:
        if (answer := reply_between_turns(body)) is not None:
            return answer
        if first[0]:
            first[0] = False
            return HONEST
        return m.text("Carrying on: the fix and its test are in.")

    model.responder = respond
    w = workers("a", LOOPBOT_WORKER_LOOPS="2", **FAST)
    wait_for(lambda: len(slots(w)) == 3, 30, "two slots and the control lane")
    store = Store(redis)
    label_all(github, [KEY])
    wait_for(
        lambda: (r := store.get(KEY)) is not None and r.phase == "verifying_held_out",
        90,
        "held-out verify",
    )
    tree = next(Path(e["data"]["path"]) for e in store.events(KEY) if e["kind"] == "worktree_ready")
    wait_for(lambda: (tree / ".held").exists(), 30, "held-out verify under way")
    busy = wait_for(lambda: _busy_slot(redis), 10, "the busy slot")
    for pid in [*_descendants(busy), busy]:
        with contextlib.suppress(ProcessLookupError):  # a short-lived child gone meanwhile
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(slots(w)) == 3 and busy not in slots(w), 30, "the slot started again")
    try:
        wait_for(lambda: (r := store.get(KEY)) is not None and r.status in TERMINAL, 120, "end")
    except AssertionError:
        raise AssertionError((where(store, [KEY]), w.output()[-3000:])) from None
    r = store.get(KEY)
    assert r is not None and r.auto_resumes == 1, r
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert "return a + b" in (github.file_at(REPO, "main", "calc.py") or "")
    # The agent's test, committed and pushed in its turn, must reach main with the fix.
    assert github.file_at(REPO, "main", "test_more.py") == TEST_MORE
