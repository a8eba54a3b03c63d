"""Pure parts of ingress: the signature check and the routing table."""

from __future__ import annotations

from typing import Any

from bot.core import signature
from bot.core.commands import (
    ChecksCompleted,
    ControlCommand,
    IssueInactive,
    LabelAdded,
    MergeGroupChanged,
    PullFeedback,
    QueueChanged,
    ReviewChanged,
)
from bot.core.rules.routing import Enqueue, Ignore, Malformed, route

APP_ID = 77


def test_githubs_published_signature_vector() -> None:
    # https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert signature.sign("It's a Secret to Everybody", b"Hello, World!") == expected
    assert signature.verify("It's a Secret to Everybody", b"Hello, World!", expected)


def test_signature_rejects_wrong_missing_and_odd_headers() -> None:
    good = signature.sign("s", b"body")
    assert not signature.verify("s", b"body!", good)
    assert not signature.verify("other", b"body", good)
    assert not signature.verify("s", b"body", None)
    assert not signature.verify("s", b"body", "")
    assert not signature.verify("s", b"body", good.replace("sha256=", "sha1="))
    assert not signature.verify("s", b"body", "sha256=ünïcödé")


def envelope(**extra: Any) -> dict[str, Any]:
    return {
        "sender": {"login": "alice", "type": "User"},
        "installation": {"id": 5},
        "repository": {"full_name": "acme/widgets"},
        **extra,
    }


def test_label_added_by_user_is_a_command() -> None:
    payload = envelope(action="labeled", issue={"number": 3}, label={"name": "loop:ready"})
    decision = route("issues", payload, app_id=APP_ID, delivery="d1")
    assert decision == Enqueue(
        LabelAdded(
            installation_id=5,
            repo="acme/widgets",
            issue=3,
            actor="alice",
            delivery="d1",
            label="loop:ready",
        )
    )


def test_label_added_by_a_bot_or_the_app_is_ignored() -> None:
    payload = envelope(action="labeled", issue={"number": 3}, label={"name": "loop:ready"})
    payload["sender"] = {"login": "loopbot[bot]", "type": "Bot"}
    assert isinstance(route("issues", payload, app_id=APP_ID), Ignore)


def test_label_on_pull_request_is_ignored() -> None:
    payload = envelope(
        action="labeled", issue={"number": 3, "pull_request": {}}, label={"name": "loop:ready"}
    )
    assert isinstance(route("issues", payload, app_id=APP_ID), Ignore)


def test_closed_and_unlabeled_stop_loops() -> None:
    closed = route("issues", envelope(action="closed", issue={"number": 3}), app_id=APP_ID)
    assert isinstance(closed, Enqueue) and isinstance(closed.command, IssueInactive)
    assert closed.command.reason == "closed"
    unl = route(
        "issues",
        envelope(action="unlabeled", issue={"number": 3}, label={"name": "loop:ready"}),
        app_id=APP_ID,
    )
    assert isinstance(unl, Enqueue) and isinstance(unl.command, IssueInactive)
    assert unl.command.label == "loop:ready"


def test_control_comments() -> None:
    for word, action in [
        ("/loop-cancel", "cancel"),
        ("/loop-restart", "restart"),
        ("/loop-status", "status"),
    ]:
        payload = envelope(
            action="created", issue={"number": 9}, comment={"id": 11, "body": f"  {word} please"}
        )
        decision = route("issue_comment", payload, app_id=APP_ID)
        assert isinstance(decision, Enqueue)
        assert decision.command == ControlCommand(
            installation_id=5,
            repo="acme/widgets",
            issue=9,
            actor="alice",
            action=action,
            comment_id=11,
        )


def test_comments_that_are_not_commands_are_ignored() -> None:
    for body in ["hello", "please /loop-cancel", "/loop-cancelled", "", None]:
        payload = envelope(action="created", issue={"number": 9}, comment={"id": 1, "body": body})
        assert isinstance(route("issue_comment", payload, app_id=APP_ID), Ignore), body


def test_loop_comment_on_pull_request_is_feedback() -> None:
    payload = envelope(
        action="created",
        issue={"number": 12, "pull_request": {}},
        comment={"id": 4, "body": "/loop rename the helper"},
    )
    decision = route("issue_comment", payload, app_id=APP_ID)
    assert isinstance(decision, Enqueue) and isinstance(decision.command, PullFeedback)
    assert decision.command.pull == 12 and decision.command.issue == 0


def test_changes_requested_review_on_loop_branch() -> None:
    payload = envelope(
        action="submitted",
        pull_request={"number": 12, "head": {"ref": "loop/issue-3", "sha": "abc"}},
        review={"id": 8, "state": "changes_requested", "body": "no"},
    )
    decision = route("pull_request_review", payload, app_id=APP_ID)
    assert isinstance(decision, Enqueue) and isinstance(decision.command, PullFeedback)
    assert decision.command.issue == 3


def test_an_approval_or_a_dismissal_wakes_a_gate_waiting_for_people() -> None:
    payload = envelope(
        action="submitted",
        pull_request={"number": 12, "head": {"ref": "loop/issue-3", "sha": "abc"}},
        review={"id": 8, "state": "approved", "body": ""},
    )
    decision = route("pull_request_review", payload, app_id=APP_ID)
    assert isinstance(decision, Enqueue) and isinstance(decision.command, ReviewChanged)
    assert (decision.command.issue, decision.command.pull) == (3, 12)
    payload["action"] = "dismissed"
    payload["review"]["state"] = "dismissed"
    decision = route("pull_request_review", payload, app_id=APP_ID)
    assert isinstance(decision, Enqueue) and isinstance(decision.command, ReviewChanged)
    payload["action"] = "edited"
    assert isinstance(route("pull_request_review", payload, app_id=APP_ID), Ignore)
    payload["action"] = "submitted"
    payload["sender"] = {"login": "other[bot]", "type": "Bot"}
    assert isinstance(route("pull_request_review", payload, app_id=APP_ID), Ignore)
    payload["sender"] = {"login": "alice", "type": "User"}
    payload["pull_request"]["head"]["ref"] = "feature"
    assert isinstance(route("pull_request_review", payload, app_id=APP_ID), Ignore)


def test_check_suite_on_loop_branch_wakes_gate_but_own_app_does_not() -> None:
    suite = {
        "head_branch": "loop/issue-3",
        "head_sha": "abc",
        "conclusion": "success",
        "app": {"id": 1},
    }
    decision = route("check_suite", envelope(action="completed", check_suite=suite), app_id=APP_ID)
    assert isinstance(decision, Enqueue) and isinstance(decision.command, ChecksCompleted)
    suite["app"] = {"id": APP_ID}
    assert isinstance(
        route("check_suite", envelope(action="completed", check_suite=suite), app_id=APP_ID), Ignore
    )


def test_malformed_payloads_are_reported_not_raised() -> None:
    assert isinstance(route("issues", [], app_id=APP_ID), Malformed)
    assert isinstance(route("issues", {"action": "labeled"}, app_id=APP_ID), Malformed)
    bad = envelope(action="labeled", issue={"number": "x"}, label={"name": "a"})
    assert isinstance(route("issues", bad, app_id=APP_ID), Malformed)


def test_unused_events_are_ignored() -> None:
    assert isinstance(route("fork", {}, app_id=APP_ID), Ignore)
    assert isinstance(route("issues", envelope(action="opened"), app_id=APP_ID), Ignore)


def test_a_loop_pull_requests_queue_events_wake_the_gate() -> None:
    pull = {"number": 12, "head": {"ref": "loop/issue-3", "sha": "abc"}, "merged": False}
    for action in ("enqueued", "dequeued", "closed"):
        payload = envelope(action=action, pull_request=dict(pull), reason="CI_FAILURE")
        decision = route("pull_request", payload, app_id=APP_ID)
        assert isinstance(decision, Enqueue) and isinstance(decision.command, QueueChanged)
        assert (decision.command.issue, decision.command.pull) == (3, 12)
        assert decision.command.action == action
    assert isinstance(
        route("pull_request", envelope(action="opened", pull_request=pull), app_id=APP_ID), Ignore
    )
    other = envelope(
        action="dequeued", pull_request={**pull, "head": {"ref": "feature", "sha": "a"}}
    )
    assert isinstance(route("pull_request", other, app_id=APP_ID), Ignore)


def test_a_merge_group_names_its_pull_request_by_its_temporary_branch() -> None:
    group = {
        "head_sha": "b" * 40,
        "head_ref": f"refs/heads/gh-readonly-queue/main/pr-12-{'c' * 40}",
        "base_sha": "c" * 40,
        "base_ref": "refs/heads/main",
    }
    decision = route(
        "merge_group", envelope(action="checks_requested", merge_group=group), app_id=APP_ID
    )
    assert isinstance(decision, Enqueue) and isinstance(decision.command, MergeGroupChanged)
    assert (decision.command.pull, decision.command.group_sha) == (12, "b" * 40)
    destroyed = route(
        "merge_group",
        envelope(action="destroyed", reason="dequeued", merge_group=group),
        app_id=APP_ID,
    )
    assert isinstance(destroyed, Enqueue) and destroyed.command.reason == "dequeued"  # type: ignore[union-attr]
    odd = envelope(action="checks_requested", merge_group={**group, "head_ref": "refs/heads/x"})
    assert isinstance(route("merge_group", odd, app_id=APP_ID), Malformed)
