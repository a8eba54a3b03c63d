"""The session log and the status comment's timeline, from a stored conversation and
events shaped as jobs.agents.agent and jobs.loop.job write them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.core.record import LoopRecord, Status
from bot.core.text import messages, sessionlog
from bot.core.text.defuse import JOINER
from bot.core.text.events import failing_test
from bot.core.text.redact import MARK, Redactor
from bot.core.text.timeline import TIMELINE_WINDOW, Timeline, timeline

TOKEN = "ghs_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2"
WEBHOOK_SECRET = "webhook-secret-for-tests"
FAILED = (
    "..F\n"
    "E   assert add(1, 2) == 3\n"
    "FAILED tests/test_calc.py::test_add - assert -1 == 3\n"
    "1 failed, 2 passed in 0.03s\n"
)


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def call(id_: str, name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": args}


def result(id_: str, content: Any, error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": content, "is_error": error}


EDIT = "str_replace_based_edit_tool"

# Turn 1: the agent runs the tests, edits, ends; verify fails. Turn 2: it fixes the test.
CONVERSATION = [
    user(text("Fix issue 7: add() subtracts.")),
    assistant(text("Let me run the tests."), call("t1", "bash", command="pytest -q")),
    user(result("t1", FAILED + "[exit code 1]", error=True)),
    assistant(
        call(
            "t2",
            EDIT,
            command="str_replace",
            path="calc.py",
            old_str="def add(a, b):\n    return a - b\n",
            new_str="def add(a, b):\n    return a + b\n",
        )
    ),
    user(result("t2", "edited calc.py")),
    assistant(text("Fixed add().")),
    user(text("Turn 2. verify failed:\n" + FAILED)),  # jobs.loop.job's turn-2 prompt
    assistant(call("t3", EDIT, command="create", path="tests/test_more.py", file_text="x = 1\n")),
    user(result("t3", [{"type": "text", "text": "created tests/test_more.py"}])),
    assistant(text("Added a test.")),
]


def ev(n: int, kind: str, **data: Any) -> dict[str, Any]:
    return {
        "id": f"{1700000000000 + n}-0",
        "loop": "o/r#7",
        "kind": kind,
        "at": 1e9 + n,
        "data": data,
    }


def verify(n: int, turn: int, passed: bool, tail: str = "") -> dict[str, Any]:
    return ev(
        n,
        "verify",
        turn=turn,
        passed=passed,
        exit_code=0 if passed else 1,
        seconds=0.5,
        timed_out=False,
        sha="c0ffee1234",
        tail=tail,
    )


EVENTS = [
    ev(0, "loop_created", actor="alice"),
    ev(1, "loop_started", worker="w1"),
    ev(2, "turn_started", turn=1, messages=0),
    ev(3, "step", step=1, tool="bash"),
    ev(4, "step", step=2, tool=EDIT),
    ev(5, "pushed", turn=1, sha="aaaaaaa111"),
    verify(6, 1, False, FAILED),
    ev(7, "turn_completed", turn=1, end="finished", steps=3, tool_calls=2, cost_usd=0.01),
    ev(8, "turn_started", turn=2, messages=6),
    ev(9, "pushed", turn=2, sha="bbbbbbb222"),
    verify(10, 2, True),
    ev(11, "pr_opened", pr=8, sha="bbbbbbb222"),
    ev(12, "review_started", sha="bbbbbbb222", round=1),
    ev(13, "reviewed", sha="bbbbbbb222", verdict="request_changes", sev1=1, sev2=2, sev3=0),
    ev(14, "back_to_coding", reason="findings"),
    ev(15, "loop_finished", status="failed", reason="max_turns", detail="", turn=2),
]


def build(
    conversation: list[dict[str, Any]] = CONVERSATION,
    events: list[dict[str, Any]] = EVENTS,
    **kw: Any,
) -> list[dict[str, Any]]:
    return sessionlog.build(conversation, events, Redactor([WEBHOOK_SECRET]), **kw)


def shape(entries: list[dict[str, Any]]) -> list[tuple[str, int | None, int | None, str]]:
    return [(e["kind"], e["turn"], e["step"], e["title"]) for e in entries]


def test_two_turns_in_order() -> None:
    assert shape(build()) == [
        ("event", None, None, "loop created: actor=alice"),
        ("event", None, None, "loop started: worker=w1"),
        ("turn", 1, None, "turn 1"),
        ("prompt", 1, None, "Fix issue 7: add() subtracts."),
        ("text", 1, 1, "Let me run the tests."),
        ("tool_call", 1, 1, "$ pytest -q"),
        ("tool_result", 1, 1, "exit 1"),
        ("tool_call", 1, 2, "edit calc.py"),
        ("tool_result", 1, 2, "edited calc.py"),
        ("text", 1, 3, "Fixed add()."),
        # the step events are not repeated: the conversation shows those calls
        ("pushed", 1, None, "pushed aaaaaaa"),
        ("verify", 1, None, "verify failed (test_add)"),
        (
            "event",
            1,
            None,
            "turn completed: turn=1, end=finished, steps=3, tool_calls=2, cost_usd=0.01",
        ),
        ("turn", 2, None, "turn 2"),
        ("prompt", 2, None, "Turn 2. verify failed:"),
        ("tool_call", 2, 1, "create tests/test_more.py"),
        ("tool_result", 2, 1, "created tests/test_more.py"),
        ("text", 2, 2, "Added a test."),
        ("pushed", 2, None, "pushed bbbbbbb"),
        ("verify", 2, None, "verify passed"),
        ("pr_opened", 2, None, "pull request #8 opened"),
        ("review", 2, None, "review round 1 started"),
        ("review", 2, None, "review round 1: request_changes, 1 sev1, 2 sev2"),
        ("event", 2, None, "back to coding: reason=findings"),
        ("finished", 2, None, "failed (max_turns)"),
    ]


def test_entries_are_plain_json_with_every_field() -> None:
    entries = build()
    keys = {"kind", "turn", "step", "at", "title", "body", "truncated", "full_chars", "diff", "ok"}
    assert all(set(e) == keys for e in entries)
    assert json.loads(json.dumps(entries)) == entries
    by_title = {e["title"]: e for e in entries}
    assert by_title["exit 1"]["ok"] is False and by_title["edited calc.py"]["ok"] is True
    assert by_title["verify failed (test_add)"]["body"] == FAILED  # the output tail
    assert by_title["verify failed (test_add)"]["at"] == 1e9 + 6
    assert by_title["$ pytest -q"]["at"] is None  # messages carry no time


def test_edits_are_diffs() -> None:
    entries = {e["title"]: e for e in build()}
    assert entries["edit calc.py"]["diff"] == (
        "--- a/calc.py\n"
        "+++ b/calc.py\n"
        "@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n"
        "-    return a - b\n"
        "+    return a + b\n"
    )
    assert entries["create tests/test_more.py"]["diff"] == (
        "--- /dev/null\n+++ b/tests/test_more.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    assert entries["$ pytest -q"]["diff"] is None


@pytest.mark.parametrize(
    ("name", "args", "title", "has_diff"),
    [
        ("bash", {"command": "pytest -q\n"}, "$ pytest -q", False),
        ("bash", {"command": "cd src &&\n  make"}, "$ cd src &&", False),
        ("bash", {"restart": True}, "bash: restart", False),
        (EDIT, {"command": "view", "path": "a.py"}, "view a.py", False),
        (
            EDIT,
            {"command": "view", "path": "a.py", "view_range": [3, 9]},
            "view a.py lines 3-9",
            False,
        ),
        (
            EDIT,
            {"command": "insert", "path": "a.py", "insert_line": 4, "insert_text": "y\n"},
            "insert into a.py after line 4",
            True,
        ),
        ("mystery", {"x": 1}, "mystery", False),
    ],
)
def test_tool_call_titles(name: str, args: dict[str, Any], title: str, has_diff: bool) -> None:
    got, body, diff = sessionlog.describe_call(name, args)
    assert got == title and (diff is not None) == has_diff
    if name == "bash" and "\n" in args.get("command", "").strip():
        assert body == args["command"]  # a long command is shown whole under its first line


def test_long_bodies_keep_head_and_tail() -> None:
    output = "HEAD\n" + "x" * 10_000 + "\nTAIL [exit code 2]"
    conversation = [
        user(text("go")),
        assistant(call("t1", "bash", command="make")),
        user(result("t1", output, error=True)),
    ]
    entries = build(conversation, [ev(1, "turn_started", turn=1, messages=0)], max_chars=300)
    got = next(e for e in entries if e["kind"] == "tool_result")
    assert got["truncated"] is True and got["full_chars"] == len(output)
    assert got["body"].startswith("HEAD\n") and got["body"].endswith("TAIL [exit code 2]")
    assert len(got["body"]) < 400 and "characters cut" in got["body"]
    assert got["title"] == "exit 2"
    short = next(e for e in entries if e["kind"] == "prompt")
    assert short["truncated"] is False and short["full_chars"] == 2


def test_secrets_are_redacted_in_every_field() -> None:
    leak = f"GH_TOKEN={TOKEN}\nWEBHOOK={WEBHOOK_SECRET}\nAuthorization: Bearer {TOKEN}"
    conversation = [
        user(text(f"Prompt with {WEBHOOK_SECRET}")),
        assistant(
            text(f"I found {TOKEN}"),
            call("t1", "bash", command=f"curl -H 'Authorization: token {TOKEN}' {WEBHOOK_SECRET}"),
            call("t2", EDIT, command="create", path=f"{WEBHOOK_SECRET}.txt", file_text=leak),
            call(
                "t3", EDIT, command="str_replace", path="a", old_str=TOKEN, new_str=WEBHOOK_SECRET
            ),
        ),
        user(result("t1", leak, error=True), result("t2", leak), result("t3", [text(leak)])),
    ]
    events = [
        ev(1, "turn_started", turn=1, messages=0),
        verify(2, 1, False, leak),
        ev(3, "error", error=f"GitHubError: 401 for {TOKEN}", error_id="e1", count=1),
        ev(4, "loop_finished", status="failed", reason="errors", detail=WEBHOOK_SECRET, turn=1),
    ]
    for max_chars in (4000, 20):  # cut or whole, no piece of a secret survives
        entries = sessionlog.build(
            conversation, events, Redactor([WEBHOOK_SECRET]), max_chars=max_chars
        )
        dumped = json.dumps(entries)
        assert TOKEN not in dumped and WEBHOOK_SECRET not in dumped
        assert TOKEN[:12] not in dumped and WEBHOOK_SECRET[:12] not in dumped
        assert MARK in dumped
    shown = sessionlog.render_text(entries, full=True)
    assert TOKEN not in shown and WEBHOOK_SECRET not in shown


def test_installation_token_known_only_to_the_caller() -> None:
    token = "v1.0123456789abcdef0123456789abcdef"  # an old-style token: no shape to find
    conversation = [
        user(text("go")),
        assistant(call("t1", "bash", command="env")),
        user(result("t1", f"TOKEN={token}")),
    ]
    events = [ev(1, "turn_started", turn=1, messages=0)]
    assert token in json.dumps(sessionlog.build(conversation, events, Redactor()))
    redact = Redactor().with_secrets(token)
    assert token not in json.dumps(sessionlog.build(conversation, events, redact))


def test_old_events_without_messages_put_the_conversation_first() -> None:
    old = [{**e, "data": {k: v for k, v in e["data"].items() if k != "messages"}} for e in EVENTS]
    entries = build(events=old)
    kinds = [e["kind"] for e in entries]
    # the whole conversation, as one block of unknown turn, before the first event
    assert kinds[:12] == [
        "prompt",
        "text",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "text",
        "prompt",
        "tool_call",
        "tool_result",
        "text",
        "event",
    ]
    assert all(e["turn"] is None for e in entries[:11])
    assert [e["step"] for e in entries[:11]] == [None, 1, 1, 1, 2, 2, 3, None, 4, 4, 5]
    # then the events, each under its turn
    assert [(e["kind"], e["turn"]) for e in entries if e["kind"] == "verify"] == [
        ("verify", 1),
        ("verify", 2),
    ]
    # with the step events, the only trace of those turns' calls
    assert [e["title"] for e in entries if e["step"] is not None and e["kind"] == "event"] == [
        "step 1: bash",
        f"step 2: {EDIT}",
    ]


def test_a_prompt_merged_into_tool_results_opens_the_next_turn() -> None:
    # Turn 1 ended on its step cap right after tool results; jobs.agents.agent.add_user_text
    # merged turn 2's prompt into that message.
    conversation = [
        user(text("Fix it.")),
        assistant(call("t1", "bash", command="ls")),
        user(result("t1", "a.py"), text("Turn 2. You hit the step cap.")),
        assistant(text("Carrying on.")),
    ]
    events = [
        ev(1, "turn_started", turn=1, messages=0),
        ev(2, "turn_capped", turn=1, reason="step_cap", detail=""),
        ev(3, "turn_started", turn=2, messages=3),
    ]
    assert [(k, t, s, title) for k, t, s, title in shape(build(conversation, events))] == [
        ("turn", 1, None, "turn 1"),
        ("prompt", 1, None, "Fix it."),
        ("tool_call", 1, 1, "$ ls"),
        ("tool_result", 1, 1, "exit 0"),
        ("event", 1, None, "turn capped: turn=1, reason=step_cap"),
        ("turn", 2, None, "turn 2"),
        ("prompt", 2, None, "Turn 2. You hit the step cap."),
        ("text", 2, 1, "Carrying on."),
    ]


def test_a_turn_under_way_shows_its_steps() -> None:
    # The conversation is saved at the end of a turn: while turn 2 runs, only its step
    # events say what it does.
    events = [
        *EVENTS[:11],
        ev(20, "turn_started", turn=3, messages=len(CONVERSATION)),
        ev(21, "step", step=1, tool="bash"),
        ev(22, "step", step=1, tool="stall 1: APITimeoutError"),
    ]
    tail = shape(build(events=events))[-3:]
    assert tail == [
        ("turn", 3, None, "turn 3"),
        ("event", 3, 1, "step 1: bash"),
        ("event", 3, 1, "step 1: stall 1: APITimeoutError"),
    ]


def test_a_conversation_saved_short_is_not_overrun() -> None:
    # A worker lost mid-turn: turn 2's start points past what was saved.
    events = [ev(1, "turn_started", turn=1, messages=0), ev(2, "turn_started", turn=2, messages=99)]
    entries = build(CONVERSATION[:3], events)
    assert [e["kind"] for e in entries] == [
        "turn",
        "prompt",
        "text",
        "tool_call",
        "tool_result",
        "turn",
    ]


@pytest.mark.parametrize(
    ("output", "name"),
    [
        (FAILED, "test_add"),
        (
            "FAILED a.py::T::test_x[1] - x\nFAILED a.py::test_y\nFAILED a.py::test_y",
            "test_x[1] +1 more",
        ),
        ("ERROR tests/test_db.py::test_conn - OSError", "test_conn"),
        ("FAIL: test_sub (tests.test_calc.CalcTest)\n", "test_sub"),
        ("--- FAIL: TestAdd (0.00s)\n", "TestAdd"),
        ("test calc::adds ... FAILED\n", "calc::adds"),
        (
            "Traceback...\nZeroDivisionError: division by zero\n",
            "ZeroDivisionError: division by zero",
        ),
        ("    assert total == 3\n", "assert total == 3"),
        ("make: *** [all] 2\n", ""),
        ("", ""),
    ],
)
def test_failing_test_named(output: str, name: str) -> None:
    assert failing_test(output) == name


def test_render_text_for_the_cli() -> None:
    out = sessionlog.render_text(build())
    assert "── turn 2 " in out and "$ pytest -q" in out and "verify failed (test_add) ✗" in out
    assert "+    return a + b" in out  # the diff, indented under its call
    long = build(
        [
            user(text("go")),
            assistant(call("t", "bash", command="seq 50")),
            user(result("t", "\n".join(map(str, range(50))))),
        ],
        [ev(1, "turn_started", turn=1, messages=0)],
    )
    assert "… 38 lines (--full shows them)" in sessionlog.render_text(long)
    assert "    49" in sessionlog.render_text(
        long, full=True
    ) and "    25" in sessionlog.render_text(long, full=True)


# -- the timeline ----------------------------------------------------------------------------


def test_timeline_of_a_two_turn_loop_with_a_sev1_round() -> None:
    events = [
        *EVENTS[:15],
        ev(20, "turn_started", turn=3, messages=len(CONVERSATION)),
        verify(21, 3, True),
        ev(22, "review_started", round=2, sha="d"),
        ev(23, "reviewed", sha="d", verdict="approve", sev1=0, sev2=0, sev3=1),
        ev(24, "merged", sha="abc1234def", pr=8),
        ev(25, "loop_finished", status="completed", reason="merged", detail="", turn=3),
    ]
    assert timeline(events) == [
        "turn 1 — verify failed (test_add)",
        "turn 2 — verify passed",
        "PR #8 opened",
        "review round 1 — 1 sev1, 2 sev2",
        "back to coding (findings)",
        "turn 3 — verify passed",
        "review round 2 — 1 sev3",
        "merged as abc1234",
    ]


def test_timeline_steps_under_way_end_with_an_ellipsis() -> None:
    assert timeline(EVENTS[:4]) == ["turn 1 — coding…"]
    assert timeline(EVENTS[:13])[-1] == "review round 1 — reviewing…"


@pytest.mark.parametrize(
    ("events", "lines"),
    [
        (
            [ev(1, "turn_started", turn=1), ev(2, "turn_capped", turn=1, reason="step_cap")],
            ["turn 1 — stopped (step_cap)"],
        ),
        (
            [ev(1, "turn_started", turn=1), verify(2, 1, True), ev(3, "no_change", turn=1)],
            ["turn 1 — verify passed, no change"],
        ),
        (
            [
                ev(1, "turn_started", turn=1),
                ev(2, "handoff", worker="w1"),
                ev(3, "loop_resumed", reason="handoff"),
                ev(4, "turn_started", turn=2),
            ],
            [
                "turn 1 — coding…",
                "handed over (worker shutting down)",
                "resumed (handoff)",
                "turn 2 — coding…",
            ],
        ),
        # a restart counts turns from 1 again: each turn line is its own
        (
            [
                ev(1, "turn_started", turn=1),
                verify(2, 1, False),
                ev(3, "loop_restarted", actor="bob"),
                ev(4, "turn_started", turn=1),
                verify(5, 1, True),
            ],
            ["turn 1 — verify failed", "restarted by bob", "turn 1 — verify passed"],
        ),
        (
            [
                ev(1, "loop_cancelled", reason="cancelled", actor="@carol"),
                ev(2, "loop_finished", status="cancelled", reason="cancelled"),
            ],
            ["cancelled by carol"],
        ),
        ([ev(1, "merge_refused", reason="needs_human", why="x")], ["merge refused (needs_human)"]),
        (
            [ev(1, "loop_finished", status="failed", reason="budget_exhausted")],
            ["failed (budget_exhausted)"],
        ),
        # noise stays out
        (
            [
                ev(1, "gate", decision="Wait"),
                ev(2, "step", step=1, tool="bash"),
                ev(3, "pushed", turn=1, sha="a"),
            ],
            [],
        ),
    ],
)
def test_timeline_lines(events: list[dict[str, Any]], lines: list[str]) -> None:
    assert timeline(events) == lines


def test_timeline_folds_older_lines() -> None:
    events = []
    for turn in range(1, 21):
        events += [ev(2 * turn, "turn_started", turn=turn), verify(2 * turn + 1, turn, False)]
    lines = timeline(events, limit=5)
    assert lines == [
        "… 16 earlier steps",
        "turn 17 — verify failed",
        "turn 18 — verify failed",
        "turn 19 — verify failed",
        "turn 20 — verify failed",
    ]
    assert len(timeline(events)) == 12


def test_timeline_is_ordered_by_stream_id_not_by_list_order() -> None:
    assert timeline(list(reversed(EVENTS[:11]))) == timeline(EVENTS[:11])


def test_timeline_lines_are_short_and_defused() -> None:
    nasty = "FAILED tests/t.py::test_" + "x" * 200 + " - boom\n"
    mention = "FAILED t.py::test_ping_@alice_fixes_#12 - x\n"
    lines = timeline(
        [
            ev(1, "turn_started", turn=1),
            verify(2, 1, False, nasty),
            ev(3, "turn_started", turn=2),
            verify(4, 2, False, mention),
            ev(5, "loop_restarted", actor="@team/admins"),
        ]
    )
    assert all(len(line) < 100 for line in lines)
    assert "@alice" not in lines[1] and f"@{JOINER}alice" in lines[1] and f"#{JOINER}12" in lines[1]
    assert lines[2] == "restarted by team/admins"


# -- the status comment ----------------------------------------------------------------------


def record(status: Status) -> LoopRecord:
    return LoopRecord(
        repo="o/r",
        issue=7,
        installation_id=1,
        branch="loop/issue-7",
        status=status,
        turn=2,
        max_turns=5,
    )


def test_status_comment_state_on_top_then_the_checklist() -> None:
    lines = timeline(EVENTS[:13])
    body = messages.status_comment(record(Status.REVIEWING), "", lines)
    state, checklist = body.split("\n\n")[1:3]
    assert state == messages.status_line(record(Status.REVIEWING))
    assert checklist.splitlines() == [
        "- [x] turn 1 — verify failed (test_add)",
        "- [x] turn 2 — verify passed",
        f"- [x] PR #{JOINER}8 opened",
        "- [ ] review round 1 — reviewing…",
    ]
    # an ended loop leaves nothing under way
    ended = messages.status_comment(record(Status.CANCELLED), "", lines)
    assert "- [x] review round 1 — reviewing…" in ended


def test_status_comment_without_a_timeline_is_as_before() -> None:
    r = record(Status.RUNNING)
    assert messages.status_comment(r) == messages.status_comment(r, "", ())
    assert "- [" not in messages.status_comment(r)


def test_status_comment_bounds_a_long_checklist() -> None:
    body = messages.status_comment(record(Status.RUNNING), "", [f"step {i}" for i in range(40)])
    items = [line for line in body.splitlines() if line.startswith("- [")]
    assert len(items) == messages.TIMELINE_LIMIT
    assert items[0] == "- [x] … 29 earlier steps" and items[-1] == "- [x] step 39"


def test_a_shrink_moves_earlier_turn_starts_with_the_brief() -> None:
    # Turn 2 began at message 6; in it, the first 5 messages were folded into a brief, so
    # turn 2 now begins at message 2 of the stored conversation.
    brief = user(text("[loopbot: conversation brief]{} BRIEF-TEXT"))
    shrunk = [brief, *CONVERSATION[5:]]
    events = [
        *EVENTS[:8],
        ev(8, "turn_started", turn=2, messages=6),
        ev(
            9,
            "context_shrunk",
            level="brief",
            summarised=5,
            tokens_before=50_000,
            tokens_after=20_000,
            window=60_000,
            messages_before=9,
            messages_after=5,
        ),
    ]
    entries = build(shrunk, events)
    titles = {e["title"]: e for e in entries}
    assert any("context shrunk (older turns folded into a brief)" in t for t in titles)
    assert "about 50,000 → 20,000 tokens of a 60,000 window" in json.dumps(
        entries, ensure_ascii=False
    )
    # Without the move, turn 2 would begin past the end and own nothing.
    assert titles["Added a test."]["turn"] == 2, shape(entries)
    assert titles["Fixed add()."]["turn"] == 1, shape(entries)
    assert titles["[loopbot: conversation brief]{} BRIEF-TEXT"]["turn"] == 1


def test_timeline_names_triage_and_metric_iterations() -> None:
    events = [
        ev(0, "triage", verdict="ready", cost_usd=0.001),  # the usual way: no line
        ev(1, "triage", verdict="needs_spec", cost_usd=0.001),
        ev(2, "spec_accepted", actor="@maint", criteria=2, whole=False),
        ev(3, "triage_failed", error="x"),
        ev(4, "metric_iteration", iteration=1, status="keep", reason=""),
        ev(5, "metric_iteration", iteration=2, status="discard", reason="worse"),
        ev(6, "split", actor="maint", issues=[4, 5]),
    ]
    assert timeline(events) == [
        "triage — needs_spec",
        "spec accepted by maint",
        "triage failed — coding anyway",
        "iteration 1 — keep",
        "iteration 2 — discard (worse)",
        "split into sub-issues by maint",
    ]


# -- the timeline built event by event (status updates) --------------------------------------


def _long_loop() -> list[dict[str, Any]]:
    """A loop of 40 turns, a review round in the middle, steps the timeline skips."""
    events: list[dict[str, Any]] = []
    i = 0
    for turn in range(1, 41):
        for kind, data in (
            ("turn_started", {"turn": turn}),
            ("step", {"tool": "bash", "command": "ls"}),
            ("verify", {"turn": turn, "passed": turn % 7 == 0, "tail": f"FAILED t::test_{turn}"}),
        ):
            i += 1
            events.append(ev(i, kind, **data))
        if turn == 20:
            i += 1
            events.append(ev(i, "review_started", round=1))
            i += 1
            events.append(ev(i, "reviewed", round=1, verdict="request_changes", sev1=1))
    return events


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_a_timeline_built_in_steps_reads_as_one_built_at_once(chunk: int) -> None:
    events = _long_loop()
    whole = timeline(events)
    built: Timeline | None = Timeline()
    for start in range(0, len(events), chunk):
        assert built is not None
        # Carried from one status update to the next as it is saved in Redis.
        built = Timeline.from_json(json.loads(json.dumps(built.to_json())))
        assert built is not None
        built.add(events[start : start + chunk])
    assert built is not None and built.render(12) == whole
    assert whole[0] == "… 30 earlier steps"  # 40 turns and a review round, 11 shown
    # Past its window a longer listing still counts what it no longer holds.
    assert timeline(events, limit=100)[0] == "… 17 earlier steps"
    assert len(built.lines) <= TIMELINE_WINDOW  # its size does not grow


def test_a_timeline_redacts_only_the_events_it_shows() -> None:
    seen: list[str] = []

    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("s3cr3t-value", "[redacted]")

    events = _long_loop()
    events.append(ev(999, "merge_refused", reason="token s3cr3t-value leaked"))
    built = Timeline()
    built.add(events, redact)
    assert built.render(12)[-1] == "merge refused (token [redacted] leaked)"
    assert "ls" not in seen and "bash" not in seen  # the skipped steps were never redacted
    assert built.last_id == events[-1]["id"]


@pytest.mark.parametrize(
    "saved",
    [None, {}, {"format": 2, "lines": [], "dropped": 0, "last_id": "1-0"}, "x", {"format": 1}],
)
def test_a_saved_timeline_in_another_shape_is_built_again(saved: Any) -> None:
    assert Timeline.from_json(saved) is None


def test_a_claude_code_turn_shows_its_text_commands_edits_and_results() -> None:
    """Claude Code's stream (``jobs/agents/claude_code.py``'s events): the conversation holds
    only loopbot's prompts and the closing words; the events show the work, redacted."""
    conversation = [user(text("Fix issue 7.")), assistant(text("Fixed add()."))]
    events = [
        ev(1, "turn_started", turn=1, messages=0),
        ev(
            2,
            "agent_tool",
            backend="claude-code",
            step=1,
            tool="Bash",
            title="pytest -q",
            input={"command": "pytest -q", "description": "Run"},
        ),
        ev(
            3,
            "agent_result",
            backend="claude-code",
            tool="Bash",
            error=True,
            output=f"FAILED test_add\nGH_TOKEN={TOKEN}",
        ),
        ev(
            4,
            "agent_tool",
            backend="claude-code",
            step=2,
            tool="Edit",
            title="Edit calc.py",
            input={"file_path": "/wt/calc.py", "old_string": "a - b", "new_string": "a + b"},
        ),
        ev(
            5,
            "agent_tool",
            backend="claude-code",
            step=3,
            tool="Write",
            title="Write n.md",
            input={"file_path": "/wt/n.md", "content": "hi\n"},
        ),
        ev(6, "agent_text", backend="claude-code", text="Fixed add().\nDetails."),
        ev(7, "agent_turn", backend="claude-code", end="finished", steps=3, calls=4, cost_usd=0.02),
    ]
    entries = sessionlog.build(conversation, events, Redactor([TOKEN]))
    shown = [(e["kind"], e["step"], e["title"]) for e in entries]
    assert ("tool_call", 1, "$ pytest -q") in shown
    assert ("tool_call", 2, "edit /wt/calc.py") in shown
    assert ("tool_call", 3, "write /wt/n.md") in shown
    assert ("text", None, "Fixed add().") in shown
    by_title = {e["title"]: e for e in entries}
    failed = by_title["error: FAILED test_add"]
    assert failed["ok"] is False and TOKEN not in failed["body"] and MARK in failed["body"]
    assert "-a - b\n+a + b" in by_title["edit /wt/calc.py"]["diff"]
    assert by_title["write /wt/n.md"]["diff"].startswith("--- /dev/null")
    assert any("agent turn" in t and "cost_usd=0.02" in t for _, _, t in shown)
