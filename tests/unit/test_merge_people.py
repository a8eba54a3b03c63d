"""The gate's decisions when the base branch asks people for something: approvals, code
owners, resolved threads, a waiting limit; and a merge method the repository refuses."""

from __future__ import annotations

from dataclasses import replace

from bot.core.record import Reason
from bot.core.rules.pull import codeowners
from bot.core.rules.pull.merge import AwaitPeople, Merge, Refuse, Wait, decide, head_approvers
from tests.helpers import merge_facts


def test_a_required_review_waits_and_says_for_whom() -> None:
    f = replace(
        merge_facts(),
        review_decision="REVIEW_REQUIRED",
        approvals_required=1,
        code_owners_waiting=("@x",),
    )
    assert decide(f) == AwaitPeople("waiting for 1 approving review by a writer; code owners: @x")
    # Classic protection asks (the App cannot read how many): at least one.
    f = replace(merge_facts(), review_decision="REVIEW_REQUIRED")
    assert decide(f) == AwaitPeople("waiting for 1 approving review by a writer")
    f = replace(merge_facts(), review_decision="REVIEW_REQUIRED", approvals_required=2)
    assert decide(f) == AwaitPeople("waiting for 2 approving reviews by a writer")


def test_an_approved_decision_or_none_required_merges() -> None:
    for decision in ("APPROVED", None):
        f = replace(merge_facts(), review_decision=decision, approvals_required=1)
        assert isinstance(decide(f), Merge)


def test_changes_requested_waits() -> None:
    f = replace(merge_facts(), review_decision="CHANGES_REQUESTED")
    got = decide(f)
    assert isinstance(got, AwaitPeople) and "requested changes" in got.why


def test_a_persons_unresolved_thread_is_a_wait_for_that_person() -> None:
    f = replace(merge_facts(), people_threads=("alice",))
    assert decide(f) == AwaitPeople("waiting for @alice to resolve their review thread(s)")


def test_people_are_asked_only_once_checks_are_green() -> None:
    f = replace(
        merge_facts(), checks="pending", failing_checks=(), review_decision="REVIEW_REQUIRED"
    )
    assert isinstance(decide(f), Wait)


def test_the_waiting_limit_hands_it_to_a_person() -> None:
    f = replace(
        merge_facts(),
        review_decision="REVIEW_REQUIRED",
        review_waited_seconds=7 * 86400.0,
        max_review_wait_seconds=7 * 86400.0,
    )
    got = decide(f)
    assert isinstance(got, Refuse) and got.reason is Reason.NEEDS_HUMAN
    assert "168 hours" in got.why and "approving review" in got.why


def test_a_merge_method_the_repository_refuses_is_refused_before_any_merge_call() -> None:
    f = replace(merge_facts(), method_allowed=False)
    got = decide(f)
    assert isinstance(got, Refuse) and got.reason is Reason.NOT_MERGEABLE
    assert "squash merges are not allowed" in got.why


def test_codeowners_last_matching_line_wins() -> None:
    text = "# owners\n*       @all\n/docs/  @docs\n*.py    @py @lead\ncalc.py\n"
    rules = codeowners.parse(text)
    assert codeowners.owners_of(rules, "README.md") == ("@all",)
    assert codeowners.owners_of(rules, "docs/a/b.md") == ("@docs",)
    assert codeowners.owners_of(rules, "pkg/x.py") == ("@py", "@lead")
    assert codeowners.owners_of(rules, "calc.py") == ()  # no owners: nobody owns it
    assert codeowners.required_owners(text, ["README.md", "x.py", "y.py"]) == [
        ("@all",),
        ("@py", "@lead"),
    ]


def test_an_approval_of_an_earlier_head_does_not_satisfy_last_push_approval() -> None:
    # GitHub's decision says APPROVED (the approval stands), the rule wants one on the head.
    f = replace(merge_facts(), review_decision="APPROVED", last_push_approved=False)
    assert decide(f) == AwaitPeople("waiting for a writer's approval of the latest push")
    own = frozenset({"loopbot", "loopbot[bot]"})
    reviews = [
        ("ann", "APPROVED", "old"),
        ("bob", "APPROVED", "head"),
        ("bob", "COMMENTED", "head"),  # a comment changes nothing: bob still approves
        ("cy", "APPROVED", "head"),
        ("cy", "DISMISSED", "head"),  # dismissed: cy no longer approves
        ("dee", "APPROVED", "head"),
        ("dee", "CHANGES_REQUESTED", "head"),
        ("loopbot[bot]", "APPROVED", "head"),  # never its own
    ]
    assert head_approvers(reviews, "head", own) == {"bob"}
    assert head_approvers(reviews[:1], "head", own) == set()


def test_codeowners_dir_star_owns_the_directorys_files_but_not_nested_ones() -> None:
    # GitHub's own example: "docs/*" matches docs/getting-started.md but not
    # docs/build-app/troubleshooting.md; "/docs/" and "apps/" own everything beneath.
    rules = codeowners.parse("docs/* @flat\napps/ @apps\n/build/logs/ @logs\n")
    assert codeowners.owners_of(rules, "docs/getting-started.md") == ("@flat",)
    assert codeowners.owners_of(rules, "docs/build-app/troubleshooting.md") == ()
    assert codeowners.owners_of(rules, "x/apps/y/z.py") == ("@apps",)
    assert codeowners.owners_of(rules, "build/logs/a/b.log") == ("@logs",)
    assert codeowners.owners_of(rules, "src/build/logs/a.log") == ()
