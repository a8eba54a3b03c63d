"""The session log (dashboard page, API, CLI) and the loop page's tables agreeing with the
record, against a real Redis, the real web app and, for the pages, a real Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from redis import Redis
from werkzeug.serving import make_server

from bot.core.record import LoopRecord, Status
from bot.core.settings import Settings, load_settings
from bot.io.github.client import GitHubApp
from bot.io.store import Store
from bot.standins.github import GitHubServer
from bot.standins.serving import run_in_thread
from bot.web.app import create_app
from bot.web.dashboard import turn_rows
from jobs.status_comment import post_status
from tests.helpers import CHROMIUM_ARGS, chromium_or_skip
from tests.io.test_operator import LOOPBOT, cli, seed_loops

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEY = "acme/widgets#7"
# An installation token's shape, as a tool might print it from the environment.
GH_TOKEN = "ghs_" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z0Q"
WEBHOOK_SECRET = "local-webhook-secret"  # the local GitHub's, in the test settings
# Long enough to be cut on the page: the rest comes with "show all".
LONG_OUTPUT = (
    "".join(f"E   diagnostic line {i:04d} of the failing run\n" for i in range(300))
    + "MIDDLE-OF-THE-OUTPUT\n"
    + "".join(f"E   more detail {i:04d}\n" for i in range(100))
    + "FAILED tests/test_calc.py::test_add - assert 4 == 5\n1 failed, 1 passed in 0.02s\n"
    + "[exit code 1]"
)


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _bash(call: str, command: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call, "name": "bash", "input": {"command": command}}


def _edit(call: str, path: str, old: str, new: str) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call,
        "name": "str_replace_based_edit_tool",
        "input": {"command": "str_replace", "path": path, "old_str": old, "new_str": new},
    }


def _result(call: str, content: str, *, error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call, "content": content, "is_error": error}


TURN_1 = [
    _user(_text("Issue #7: add() subtracts\n\nMake `add` add. Verify: `python -m pytest -q`.")),
    _assistant(_text("Let me read calc.py first."), _bash("toolu_01", "cat calc.py")),
    _user(_result("toolu_01", "def add(a, b):\n    return a - b\n")),
    _assistant(_bash("toolu_02", "env | grep -i -e token -e secret")),
    _user(_result("toolu_02", f"GH_TOKEN={GH_TOKEN}\nHOOK_SECRET={WEBHOOK_SECRET}\n")),
    _assistant(_edit("toolu_03", "calc.py", "    return a - b\n", "    return a * b\n")),
    _user(_result("toolu_03", "edited calc.py")),
    _assistant(_bash("toolu_04", "python -m pytest -q")),
    _user(_result("toolu_04", LONG_OUTPUT, error=True)),
    _assistant(_text("add() multiplies now; 2 * 2 is 4.")),
]
TURN_2 = [
    _user(_text("verify failed on turn 1:\nFAILED tests/test_calc.py::test_add\nFix it.")),
    _assistant(_edit("toolu_05", "calc.py", "    return a * b\n", "    return a + b\n")),
    _user(_result("toolu_05", "edited calc.py")),
    _assistant(_bash("toolu_06", "python -m pytest -q tests/test_calc.py")),
    _user(_result("toolu_06", "..\n2 passed in 0.01s")),
    _assistant(_text("add() adds now; both tests pass.")),
]
SHA_1, SHA_2, MERGE_SHA = "a1" * 20, "b2" * 20, "c0ffee" + "0" * 34


def plant_finished_loop(redis: Redis) -> None:
    """A two-turn loop as the worker leaves it: turn 1's verify fails, turn 2's passes,
    the pull request is reviewed and merged."""
    store = Store(redis)
    verified = {"turn": 2, "passed": True, "exit_code": 0, "seconds": 0.4, "timed_out": False}
    store.put(
        LoopRecord(
            repo="acme/widgets",
            issue=7,
            installation_id=1,
            status=Status.COMPLETED,
            phase="completed",
            reason="merged",
            turn=2,
            total_turns=2,
            max_turns=5,
            branch="loop/issue-7",
            pr_number=2,
            pr_url="http://github.local/acme/widgets/pull/2",
            cost_usd=0.0421,
            verify_command="python -m pytest -q",
            last_verify=verified | {"sha": SHA_2},
            merge_sha=MERGE_SHA,
        )
    )
    store.save_conversation(KEY, TURN_1 + TURN_2)
    ev = lambda kind, **data: store.event(KEY, kind, **data)  # noqa: E731
    ev("loop_created", actor="alice")
    ev("loop_started", worker="worker-1")
    ev("turn_started", turn=1, messages=0)
    for step, tool in [(1, "bash"), (2, "bash"), (3, "str_replace_based_edit_tool"), (4, "bash")]:
        ev("step", step=step, tool=tool)
    tail = (
        "FAILED tests/test_calc.py::test_add - assert 4 == 5\n"
        f"captured env: HOOK_SECRET={WEBHOOK_SECRET}\n1 failed, 1 passed in 0.02s\n"
    )
    ev(
        "verify",
        turn=1,
        passed=False,
        exit_code=1,
        seconds=0.31,
        timed_out=False,
        sha=SHA_1,
        tail=tail,
    )
    ev("turn_completed", turn=1, end="finished", steps=5, tool_calls=4, cost_usd=0.021)
    ev("pushed", turn=1, sha=SHA_1)
    ev("turn_started", turn=2, messages=len(TURN_1))
    ev("step", step=1, tool="str_replace_based_edit_tool")
    ev("step", step=2, tool="bash")
    ev("verify", **verified, sha=SHA_2, tail="..\n2 passed in 0.01s\n")
    ev("turn_completed", turn=2, end="finished", steps=3, tool_calls=2, cost_usd=0.0211)
    ev("pushed", turn=2, sha=SHA_2)
    ev("pr_opened", pr=2, sha=SHA_2)
    ev("review_started", sha=SHA_2, round=1)
    ev("reviewed", round=1, sha=SHA_2, pr=2, verdict="approve", sev1=0, sev2=0, sev3=1)
    ev("merged", sha=MERGE_SHA, pr=2)
    ev("loop_finished", status="completed", reason="merged", detail="", turn=2)


@pytest.fixture
def dash(env: dict[str, str], redis: Redis) -> Any:
    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": TOKEN}, role="web")
    return create_app(s, redis).test_client()


# -- the API ---------------------------------------------------------------------------------


def test_log_api_gives_the_entries_and_only_what_is_new(dash: Any, redis: Redis) -> None:
    plant_finished_loop(redis)
    assert dash.get("/api/loops/acme/widgets/7/log").status_code == 401
    assert dash.get("/api/loops/acme/widgets/8/log", headers=AUTH).status_code == 404
    assert dash.get("/api/loops/acme/widgets/7/log?have=x", headers=AUTH).status_code == 400
    first = dash.get("/api/loops/acme/widgets/7/log", headers=AUTH).json
    assert first["status"] == "completed" and first["active"] is False
    assert first["from"] == 0 and first["count"] == len(first["entries"])
    entries = first["entries"]
    titles = [e["title"] for e in entries]
    assert "$ cat calc.py" in titles and "$ python -m pytest -q" in titles
    assert "verify failed (test_add)" in titles and "verify passed" in titles
    assert [e["turn"] for e in entries if e["kind"] == "turn"] == [1, 2]
    edit = next(e for e in entries if e["title"] == "edit calc.py")
    assert "-    return a - b" in edit["diff"] and "+    return a * b" in edit["diff"]
    run = next(e for e in entries if e["kind"] == "tool_result" and e["ok"] is False)
    assert run["truncated"] and run["full_chars"] > len(run["body"])
    assert "MIDDLE-OF-THE-OUTPUT" not in run["body"]
    index = entries.index(run)
    full = dash.get(f"/api/loops/acme/widgets/7/log?full=1&entry={index}", headers=AUTH).json
    assert "MIDDLE-OF-THE-OUTPUT" in full["entry"]["body"] and not full["entry"]["truncated"]
    # What the page holds, unchanged: nothing comes back again.
    held = {"have": first["count"], "digest": first["digest"]}
    again = dash.get("/api/loops/acme/widgets/7/log", query_string=held, headers=AUTH).json
    assert again["from"] == first["count"] and again["entries"] == []
    # A new event: only it.
    Store(redis).event(KEY, "loop_restarted", actor="bob")
    more = dash.get("/api/loops/acme/widgets/7/log", query_string=held, headers=AUTH).json
    assert more["from"] == first["count"] and [e["kind"] for e in more["entries"]] == ["restart"]
    # The conversation changed under what the page holds: all of it again.
    Store(redis).save_conversation(KEY, TURN_1)
    changed = dash.get("/api/loops/acme/widgets/7/log", query_string=held, headers=AUTH).json
    assert changed["from"] == 0 and "$ python -m pytest -q tests/test_calc.py" not in {
        e["title"] for e in changed["entries"]
    }


def test_secrets_in_tool_results_are_redacted_in_the_api_and_the_cli(
    dash: Any, redis: Redis, env: dict[str, str]
) -> None:
    plant_finished_loop(redis)
    for url in ["/api/loops/acme/widgets/7/log", "/api/loops/acme/widgets/7/log?full=1"]:
        text = dash.get(url, headers=AUTH).get_data(as_text=True)
        assert "GH_TOKEN=[redacted]" in text and "HOOK_SECRET=[redacted]" in text
        assert GH_TOKEN not in text and WEBHOOK_SECRET not in text
        assert "ghs_" not in text
    # The loop page's API shows event data (verify output) too: the same redaction.
    loop = dash.get("/api/loops/acme/widgets/7", headers=AUTH).get_data(as_text=True)
    assert "HOOK_SECRET=[redacted]" in loop and WEBHOOK_SECRET not in loop
    for args in [(), ("--full",)]:
        out = cli("log", KEY, *args, env=env)
        assert out.returncode == 0, out.stderr
        assert "$ cat calc.py" in out.stdout and "verify failed (test_add)" in out.stdout
        assert "GH_TOKEN=[redacted]" in out.stdout and "HOOK_SECRET=[redacted]" in out.stdout
        assert GH_TOKEN not in out.stdout and WEBHOOK_SECRET not in out.stdout
    assert "MIDDLE-OF-THE-OUTPUT" in cli("log", KEY, "--full", env=env).stdout
    missing = cli("log", "acme/widgets#99", env=env)
    assert missing.returncode == 1 and "no such loop" in missing.stderr


def test_cli_follows_a_running_loop_until_it_ends(redis: Redis, env: dict[str, str]) -> None:
    store = Store(redis)
    store.put(LoopRecord(repo="acme/widgets", issue=7, installation_id=1, status=Status.RUNNING))
    store.event(KEY, "turn_started", turn=1, messages=0)
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    proc = subprocess.Popen(
        [LOOPBOT, "log", KEY, "-f"],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2)  # it printed what there is and follows
        assert proc.poll() is None
        store.event(KEY, "step", step=1, tool="bash")
        time.sleep(2)  # printed while the turn runs
        store.save_conversation(KEY, TURN_1)  # the turn ends: its messages are saved
        store.event(KEY, "verify", turn=1, passed=False, exit_code=1, seconds=0.3, tail="")
        time.sleep(2)
        store.set_fields(KEY, status=Status.FAILED, reason="max_turns_reached")
        store.event(KEY, "loop_finished", status="failed", reason="max_turns_reached", turn=1)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    for seen in ["turn 1", "step 1: bash", "$ cat calc.py", "verify failed", "failed (max_turns"]:
        assert seen in out, (seen, out)
    assert out.count("$ cat calc.py") == 1 and out.rstrip().endswith(f"{KEY}: failed")
    assert GH_TOKEN not in out and WEBHOOK_SECRET not in out


# -- the loop page's tables ------------------------------------------------------------------


def _rec(**fields: Any) -> LoopRecord:
    return LoopRecord(repo="acme/widgets", issue=1, installation_id=1, **fields)


def _events(*items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": f"{i}-0", "kind": k, "at": float(i), "data": d} for i, (k, d) in enumerate(items)
    ]


def test_turn_rows_agree_with_the_record() -> None:
    # A running turn 2 beside the verify of turn 1 (whose start the stream lost).
    rows = turn_rows(
        _events(("turn_started", {"turn": 2}), ("verify", {"turn": 1, "passed": False})),
        _rec(status=Status.RUNNING, turn=2),
    )
    assert [(r["turn"], r["state"], bool(r["verify"])) for r in rows] == [
        (1, "earlier events not kept", True),
        (2, "running", False),
    ]
    # Turn numbers start again after a review round: rows follow the stream, seq counts all.
    rows = turn_rows(
        _events(
            ("turn_started", {"turn": 1}),
            ("step", {"step": 1, "tool": "bash"}),
            ("verify", {"turn": 1, "passed": True, "sha": "s1"}),
            ("turn_completed", {"turn": 1, "end": "finished", "steps": 2, "tool_calls": 1}),
            ("back_to_coding", {"reason": "findings"}),
            ("turn_started", {"turn": 1}),
            ("step", {"step": 1, "tool": "bash"}),
            ("step", {"step": 1, "tool": "stall 1: APITimeoutError"}),
            ("step", {"step": 2, "tool": "bash"}),
            ("turn_capped", {"turn": 1, "reason": "step_cap"}),
            ("turn_started", {"turn": 2}),
            ("handoff", {"worker": "w"}),
        ),
        _rec(status=Status.QUEUED, turn=2, total_turns=4),
    )
    assert [(r["seq"], r["turn"], r["state"]) for r in rows] == [
        (2, 1, "completed"),
        (3, 1, "cut short"),
        (4, 2, "handed over"),
    ]
    assert rows[1]["tool_calls"] == 2 and rows[1]["steps"] == 2 and rows[1]["end"] == "step_cap"
    # The record's verify, written just before its event: shown beside its turn already.
    rows = turn_rows(
        _events(("turn_started", {"turn": 1})),
        _rec(status=Status.RUNNING, turn=1, last_verify={"turn": 1, "passed": True, "sha": "x"}),
    )
    assert len(rows) == 1 and rows[0]["verify"]["passed"] is True
    # A record at turn 3 whose stream holds nothing: still a row for it.
    rows = turn_rows([], _rec(status=Status.FAILED, turn=3, total_turns=3))
    assert [(r["seq"], r["turn"]) for r in rows] == [(3, 3)]
    assert turn_rows([], _rec()) == []


def test_loop_api_turns_and_verify_come_from_the_same_rows(dash: Any, redis: Redis) -> None:
    plant_finished_loop(redis)
    d = dash.get("/api/loops/acme/widgets/7", headers=AUTH).json
    assert [(t["turn"], t["state"], t["verify"]["passed"]) for t in d["turns"]] == [
        (1, "completed", False),
        (2, "completed", True),
    ]
    assert [(v["seq"], v["turn"], v["passed"]) for v in d["verify"]] == [
        (1, 1, False),
        (2, 2, True),
    ]
    # More than one page of events: the newest are shown, not the first 2,000.
    store = Store(redis)
    for n in range(2100):
        store.event(KEY, "step", step=n, tool="bash")
    store.event(KEY, "loop_restarted", actor="bob")
    d = dash.get("/api/loops/acme/widgets/7", headers=AUTH).json
    assert d["events"][-1]["kind"] == "loop_restarted" and len(d["turns"]) == 2


# -- in a real browser -----------------------------------------------------------------------


@contextmanager
def browser_on(env: dict[str, str], redis: Redis, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A signed-in Chromium page and the dashboard's base URL (set up as in
    tests/io/test_operator.py::test_dashboard_in_a_real_browser)."""
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": TOKEN}, role="web")
    server = make_server("127.0.0.1", 0, create_app(s, redis), threaded=True)
    run_in_thread(server)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=CHROMIUM_ARGS,
            )
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"{base}/dashboard")
            page.fill("input[name=token]", TOKEN)
            page.click("button")
            page.wait_for_selector("#rows")
            yield page, base
            browser.close()
    finally:
        server.shutdown()
        server.server_close()


# The frame GitHub draws around a comment, roughly, so the picture reads as one; the
# comment's own text is cmark-gfm's rendering of what the local GitHub stored.
COMMENT_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 16px; font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
  color: #1f2328; background: #fff; }}
.comment {{ width: 760px; border: 1px solid #d0d7de; border-radius: 6px; }}
.comment header {{ padding: 8px 16px; background: #f6f8fa; border-bottom: 1px solid #d0d7de;
  border-radius: 6px 6px 0 0; color: #59636e; }}
.comment header b {{ color: #1f2328; }}
.comment .body {{ padding: 8px 16px; }}
h3 {{ margin: 8px 0; font-size: 16px; }}
ul {{ padding-left: 2em; }} li {{ list-style: none; }}
input[type=checkbox] {{ margin: 0 0.4em 0 -1.4em; vertical-align: middle; }}
code {{ padding: 0.2em 0.4em; font-size: 85%; background: #eff1f3; border-radius: 6px; }}
a {{ color: #0969da; text-decoration: none; }} sub {{ color: #59636e; }}
</style></head><body><div class="comment"><header><b>loopbot</b> <span>bot</span> commented
</header><div class="body">{body}</div></div></body></html>"""


def test_status_comment_of_a_finished_loop_in_a_browser(
    github: GitHubServer, settings: Settings, redis: Redis, tmp_path: Path
) -> None:
    """The status comment as the local GitHub stores it, for the loop whose session log
    is pictured below, rendered by cmark-gfm (GitHub's renderer) in Chromium."""
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    plant_finished_loop(redis)
    iid = github.add_installation("acme")
    github.add_repo("acme/widgets", {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("alice") as alice:
        for n in range(1, 8):  # the loop's issue is #7
            alice.post("/repos/acme/widgets/issues", json={"title": f"issue {n}", "body": "."})
    store = Store(redis)
    record = store.set_fields(KEY, installation_id=iid)
    post_status(store, GitHubApp(settings, redis=redis).installation(iid), record, now=True)
    (comment,) = github.repo("acme/widgets").comments.values()
    html = cmarkgfm.github_flavored_markdown_to_html(
        comment["body"], options=Options.CMARK_OPT_UNSAFE
    )
    # LOOPBOT_SCREENSHOT_DIR=docs/screenshots refreshes the picture in the README.
    shots = Path(os.environ.get("LOOPBOT_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 600})
        page.set_content(COMMENT_PAGE.format(body=html))
        assert page.inner_text("h3") == "loopbot"
        # The timeline is a task list GitHub draws as ticked boxes, one per step.
        steps = page.locator("li:has(input[type=checkbox])")
        lines = [
            steps.nth(i).inner_text().replace("\u2060", "").strip() for i in range(steps.count())
        ]
        assert lines == [
            "turn 1 — verify failed (test_add)",
            "turn 2 — verify passed",
            "PR #2 opened",
            "review round 1 — 1 sev3",
            "merged as c0ffee0",
        ]
        assert page.locator("input[type=checkbox]:checked").count() == len(lines)
        text = page.inner_text("body")
        assert WEBHOOK_SECRET not in text and "/loop-restart" in text
        page.locator(".comment").screenshot(path=str(shots / "status-comment.png"))
        browser.close()


def test_log_page_of_a_finished_loop(env: dict[str, str], redis: Redis, tmp_path: Path) -> None:
    plant_finished_loop(redis)
    # LOOPBOT_SCREENSHOT_DIR=docs/screenshots refreshes the picture (README, docs/operating.md).
    shots = Path(os.environ.get("LOOPBOT_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with browser_on(env, redis, tmp_path) as (page, base):
        page.goto(f"{base}/dashboard/loops/acme/widgets/7")
        page.wait_for_selector("text=session log →")
        page.click("text=session log →")
        page.wait_for_selector("text=$ python -m pytest -q tests/test_calc.py")
        assert page.url.endswith("/dashboard/loops/acme/widgets/7/log")
        sections = page.locator("section.turn")
        assert [sections.nth(i).locator("h2").inner_text() for i in range(3)] == [
            "before the first turn",
            "turn 1",
            "turn 2",
        ]
        turn_1, turn_2 = sections.nth(1).inner_text(), sections.nth(2).inner_text()
        # Turn 1: the commands, their output, the edit as a diff, the verify failure.
        for seen in [
            "$ cat calc.py",
            "return a - b",
            "edit calc.py",
            "+    return a * b",
            "$ python -m pytest -q",
            "diagnostic line 0000",
            "verify failed (test_add)",
            "FAILED tests/test_calc.py::test_add - assert 4 == 5",
        ]:
            assert seen in turn_1, seen
        assert "verify passed" in turn_2 and "2 passed in 0.01s" in turn_2
        verify_2 = sections.nth(2).locator(".entry.verify").inner_text()
        assert "verify passed" in verify_2 and "failed" not in verify_2
        assert "review round 1: approve" in page.inner_text("#log")
        assert page.inner_text("#follow") == "completed"
        # Secrets planted in a tool result and in verify's output never reach the page.
        text = page.inner_text("body")
        assert "GH_TOKEN=[redacted]" in text and "HOOK_SECRET=[redacted]" in text
        assert GH_TOKEN not in text and WEBHOOK_SECRET not in text
        assert GH_TOKEN not in page.content() and WEBHOOK_SECRET not in page.content()
        page.screenshot(path=str(shots / "log.png"), full_page=True)
        # The long output is cut; "show all" brings the rest.
        failing = page.locator(".entry.tool_result.bad")
        assert "MIDDLE-OF-THE-OUTPUT" not in failing.inner_text()
        failing.locator("button.more").click()
        page.wait_for_function(
            "document.querySelector('.entry.tool_result.bad pre').textContent"
            ".includes('MIDDLE-OF-THE-OUTPUT')"
        )
        assert failing.locator("button.more").count() == 0
        assert WEBHOOK_SECRET not in page.content()
        page.click("text=← loop")
        page.wait_for_selector("text=loop_finished")
    assert (shots / "log.png").stat().st_size > 5000


def test_log_page_follows_a_running_loop(env: dict[str, str], redis: Redis, tmp_path: Path) -> None:
    store = Store(redis)
    store.put(LoopRecord(repo="acme/widgets", issue=7, installation_id=1, status=Status.RUNNING))
    store.event(KEY, "turn_started", turn=1, messages=0)
    with browser_on(env, redis, tmp_path) as (page, base):
        page.goto(f"{base}/dashboard/loops/acme/widgets/7/log")
        page.wait_for_selector("#follow.on")
        assert "following" in page.inner_text("#follow")
        started = time.monotonic()
        store.event(KEY, "step", step=1, tool="bash")
        page.wait_for_selector("text=step 1: bash", timeout=2500)
        store.save_conversation(KEY, TURN_1)  # the turn ends: its messages are saved
        page.wait_for_selector("text=$ cat calc.py", timeout=2500)
        assert time.monotonic() - started < 5
        assert page.locator("text=$ cat calc.py").count() == 1
        store.set_fields(KEY, status=Status.FAILED, reason="max_turns_reached")
        store.event(KEY, "loop_finished", status="failed", reason="max_turns_reached", turn=1)
        page.wait_for_selector("text=failed (max_turns_reached)", timeout=2500)
        page.wait_for_function("!document.querySelector('#follow').classList.contains('on')")
        assert page.inner_text("#follow") == "failed"


def test_loop_page_shows_the_turn_beside_its_verify(
    env: dict[str, str], redis: Redis, tmp_path: Path
) -> None:
    seed_loops(redis)  # turn 2 running, the verify of turn 1 in the stream
    with browser_on(env, redis, tmp_path) as (page, _base):
        page.click("text=acme/widgets#1")
        page.wait_for_selector("text=turn_started")
        turns = page.inner_text("tbody#turns")
        assert "no turn yet" not in turns
        assert "running" in turns and "failed" in turns
        rows = page.locator("tbody#turns tr")
        assert rows.count() == 2
        cells = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(2)]
        assert cells == ["1", "2"]
        assert "failed" in page.inner_text("tbody#verify")


def test_log_page_needs_the_token(dash: Any, redis: Redis) -> None:
    plant_finished_loop(redis)
    assert dash.get("/dashboard/loops/acme/widgets/7/log").status_code == 401
    page = dash.get("/dashboard/loops/acme/widgets/7/log", headers=AUTH)
    assert page.status_code == 200 and b"session log" in page.data
    # The page puts every value in with textContent: no innerHTML anywhere in it.
    assert b"innerHTML" not in page.data
    assert json.loads(dash.get("/api/loops/acme/widgets/7/log", headers=AUTH).data)["count"] > 0
