"""The pure parts of issue 43 (half the GitHub writes): which reviewed change a head's
change is (its approval carries), the route a request is counted under, and the receipt
of a merge GitHub refused."""

from __future__ import annotations

from typing import Any

from bot.core.rules.pull.same_change import carried_from, patch_digest
from bot.core.text import receipt
from bot.io.github.tally import route

DIFF = """diff --git a/lines.txt b/lines.txt
index 1111111..2222222 100644
--- a/lines.txt
+++ b/lines.txt
@@ -3,5 +3,5 @@ def f():
 c
 d
-e
+E
 f
 g
"""


def test_the_same_change_moved_by_the_base_has_one_digest_another_change_not() -> None:
    moved = DIFF.replace("index 1111111..2222222", "index 3333333..4444444").replace(
        "@@ -3,5 +3,5 @@", "@@ -9,5 +10,5 @@"
    )
    assert patch_digest(moved) == patch_digest(DIFF)
    assert patch_digest(DIFF.replace("+E", "+EE")) != patch_digest(DIFF)  # another change
    assert patch_digest(DIFF.replace(" c\n", " C\n")) != patch_digest(DIFF)  # its context
    assert patch_digest(DIFF + "diff --git a/x b/x\n") != patch_digest(DIFF)  # more files


def carried(**over: Any) -> str | None:
    given: dict[str, Any] = {
        "sha": "b" * 40,
        "catch_up": {"from": "a" * 40, "to": "b" * 40},
        "digest": "d1",
        "patches": {"a" * 40: "d1"},
        "verdicts": {"a" * 40: "approve"},
        "finding_log": [],
        "own_sev1": False,
        "kind": "issue",
    } | over
    return carried_from(**given)


def test_only_an_approval_of_the_same_change_with_nothing_blocking_carries() -> None:
    assert carried() == "a" * 40
    assert carried(digest="d2") is None  # another change
    assert carried(verdicts={"a" * 40: "request_changes"}) is None
    assert carried(verdicts={"a" * 40: "error"}) is None
    sev1 = {"id": "F1", "severity": "sev1", "status": "open", "fingerprint": "x"}
    assert carried(finding_log=[sev1]) is None  # a sev1 stands
    assert carried(finding_log=[sev1 | {"status": "dismissed"}]) == "a" * 40
    assert carried(own_sev1=True) is None  # the tests changed to pass on this head
    assert carried(kind="metric") is None  # its results table is what is judged
    # Only the harness's own clean catch-up: any other head (a push, a turn) is reviewed,
    # whatever its diff's text says (a binary file's new bytes show as the same line).
    assert carried(sha="c" * 40) is None
    assert carried(catch_up={"from": "a" * 40}) is None  # not verified without a turn
    assert carried(catch_up={}) is None
    other = {"from": "e" * 40, "to": "b" * 40}  # merged into a head never approved
    assert carried(patches={"a" * 40: "d1", "e" * 40: "d1"}, catch_up=other) is None


def test_requests_are_counted_by_route_not_by_repository_number_or_branch() -> None:
    assert route("/repos/acme/w/issues/12/comments") == "/issues/N/comments"
    assert route("/repos/acme/w/issues/comments/987") == "/issues/comments/N"
    assert route("/repos/acme/w/check-runs/5") == "/check-runs/N"
    assert route("/repos/acme/w/commits/" + "f" * 40 + "/check-runs") == "/commits/N/check-runs"
    assert route("/repos/acme/w/git/refs/heads/loop/issue-2") == "/git/refs/heads/{branch}"
    assert route("/repos/acme/w/rules/branches/loop/issue-2") == "/rules/branches/{branch}"
    assert route("/repos/acme/w/compare/main...abc") == "/compare/{range}"
    assert route("/repos/acme/w/contents/.github/loop.yml") == "/contents/{path}"
    assert route("/api/v3/repos/acme/w/pulls?state=open") == "/pulls"
    assert route("/repos/acme/w") == "/"
    assert route("/graphql") == "/graphql"


def test_a_refused_merge_s_receipt_keeps_the_table_and_says_why() -> None:
    row = receipt.Row("critic verdict", "a" * 40, "pass", "approve")
    held = receipt.render([row], head="a" * 40, outcome="Merging now.")
    text = receipt.refused(
        held + "\n\n<!-- loopbot:receipt -->", "405 Pull Request is not mergeable"
    )
    assert "| critic verdict" in text and "Merging now." not in text
    assert text.endswith("Not merged: GitHub refused the merge: 405 Pull Request is not mergeable")
