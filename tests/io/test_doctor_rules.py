"""``loopbot doctor --github`` names each rule of a repository that has them all: the real
CLI against the local GitHub, which lists the rules as ``GET rules/branches/{branch}``
does, with GitHub's rule types and parameters."""

from __future__ import annotations

from pathlib import Path

from bot.ops.doctor_rules import loop_branch_checks, repo_checks
from bot.standins.github import GitHubServer
from bot.standins.github.state import ReviewRule
from tests.helpers import REPO, sample_repo
from tests.io.test_doctor_github import doctor, lines

EVERY_RULE = [
    (
        "main",
        {
            "type": "merge_queue",
            "parameters": {
                "check_response_timeout_minutes": 60,
                "grouping_strategy": "ALLGREEN",
                "max_entries_to_build": 5,
                "max_entries_to_merge": 5,
                "merge_method": "SQUASH",
                "min_entries_to_merge": 1,
                "min_entries_to_merge_wait_minutes": 5,
            },
        },
    ),
    ("main", {"type": "required_signatures"}),
    ("main", {"type": "required_linear_history"}),
    ("main", {"type": "deletion"}),
    ("main", {"type": "non_fast_forward"}),
    ("main", {"type": "update", "parameters": {"update_allows_fetch_and_merge": False}}),
    (
        "main",
        {
            "type": "code_scanning",
            "parameters": {
                "code_scanning_tools": [
                    {
                        "tool": "CodeQL",
                        "alerts_threshold": "errors",
                        "security_alerts_threshold": "high_or_higher",
                    }
                ]
            },
        },
    ),
    (
        "main",
        {
            "type": "workflows",
            "parameters": {
                "workflows": [{"path": ".github/workflows/required.yml", "repository_id": 1}]
            },
        },
    ),
    ("loop/*", {"type": "creation"}),
    ("loop/*", {"type": "required_signatures"}),
    ("loop/*", {"type": "non_fast_forward"}),
    ("loop/*", {"type": "required_linear_history"}),
    (
        "*",
        {"type": "file_path_restriction", "parameters": {"restricted_file_paths": ["secrets/**"]}},
    ),
    ("*", {"type": "max_file_size", "parameters": {"max_file_size": 10}}),
    (
        "*",
        {
            "type": "file_extension_restriction",
            "parameters": {"restricted_file_extensions": [".exe"]},
        },
    ),
    ("*", {"type": "max_file_path_length", "parameters": {"max_file_path_length": 200}}),
    (
        "*",
        {
            "type": "commit_message_pattern",
            "parameters": {"operator": "starts_with", "pattern": "feat"},
        },
    ),
]


def test_a_repository_with_every_rule_has_each_named(
    github: GitHubServer, env: dict[str, str], tmp_path: Path
) -> None:
    iid = sample_repo(github)
    repo = github.repos[REPO]
    repo.review_rules["main"] = ReviewRule(
        required_approving_review_count=2,
        require_code_owner_review=True,
        dismiss_stale_reviews_on_push=True,
        require_last_push_approval=True,
        required_review_thread_resolution=True,
        allowed_merge_methods=("merge", "rebase"),
    )
    repo.allow_squash_merge = False
    repo.ruleset_checks["main"] = ["ci"]
    repo.protection["main"] = ["lint"]  # classic protection: the summary says protected
    repo.listed_rules = list(EVERY_RULE)
    github.add_repo("acme/plain", {"README.md": "hi\n"}, installation_id=iid)

    r = doctor(env, tmp_path)

    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    failed = "\n".join(lines(out, "FAIL"))
    warned = "\n".join(lines(out, "warn"))
    main, loop = f"{REPO} main:", f"{REPO} loop/*:"
    # What stops loops fails the doctor, each with the fix.
    assert f"{REPO} merge methods: squash merging is turned off" in failed
    assert f"{main} a ruleset allows only merge, rebase merges" in failed
    assert f"{main} updates are restricted to the ruleset's bypass list (update)" in failed
    assert f"{loop} creating loop/* branches is restricted (creation)" in failed
    assert f"{loop} signed commits are required on loop/* (required_signatures)" in failed
    assert failed.count("each loop stops before any work, failed / push_refused") == 2
    assert "narrow the ruleset's branch pattern so it does not match loop/*" in out
    assert "turn on 'Allow squash merging'" in out
    # What makes loops wait is a warning saying what loopbot does about it.
    assert f"{main} requires 2 approving reviews by a writer: the loop waits" in warned
    assert f"{main} requires code owners' review" in warned
    assert f"{main} dismisses approvals on a push: after one, the loop waits" in warned
    assert f"{main} requires approval by someone other than the last pusher" in warned
    assert "loopbot pushes last, so any writer's approval counts" in warned
    assert f"{main} requires resolved conversations: loopbot resolves its own" in warned
    assert f"{main} requires a merge queue (squash): loopbot enqueues" in warned
    assert f"{main} has classic branch protection: its settings need administration read" in out
    assert f"{main} requires checks ci: the gate waits for them" in out
    assert f"{main} requires signed commits (required_signatures)" in out
    assert f"{main} requires a linear history (required_linear_history)" in out
    assert f"{main} requires code scanning results (code_scanning)" in warned
    assert f"{main} requires workflows to pass (workflows): GitHub refuses the merge" in warned
    assert "merge refused for this ends the loop refused / not_mergeable" in warned
    assert f"{loop} force pushes are refused (non_fast_forward)" in warned
    assert f"{loop} requires a linear history (required_linear_history)" in warned
    # Push rules, once: on loop/*, where loopbot pushes.
    assert f"{loop} pushes touching secrets/** are refused (file_path_restriction)" in warned
    assert f"{loop} files over 10 MB are refused (max_file_size)" in warned
    assert f"{loop} pushes adding files ending .exe are refused" in warned
    assert f"{loop} paths longer than 200 characters are refused" in warned
    assert out.count("are refused (file_path_restriction)") == 1
    assert out.count("(max_file_size)") == out.count("(max_file_path_length)") == 1
    for where in (main, loop):
        assert f"{where} a rule loopbot does not know (commit_message_pattern)" in warned
    assert f"{loop} requires code scanning" not in out
    # The default branch's deletion and force-push rules concern no loop: not listed.
    assert "(deletion)" not in out and f"{main} force pushes" not in out
    assert "[ok  ] workflows (acme): not granted (app.yml does not ask for it)" in out
    assert "[ok  ] acme/plain: no rule on main or loop/* makes loops wait or stop" in out


def test_many_repositories_are_read_up_to_a_bound(
    github: GitHubServer, env: dict[str, str], tmp_path: Path
) -> None:
    iid = github.add_installation("acme")
    for i in range(22):
        github.add_repo(f"acme/r{i:02d}", {"README.md": "hi\n"}, installation_id=iid)

    r = doctor(env, tmp_path)

    assert r.stdout.count("makes loops wait or stop") == 20, r.stdout
    assert "rules (acme): the rules of the first 20 of 22 repositories were read" in r.stdout


def test_unreadable_rules_say_so_and_loop_rules_of_the_default_branch_kind_are_skipped() -> None:
    checks = repo_checks("acme/x", {"default_branch": "trunk"}, None, None, False)
    assert [c.name for c in checks] == ["acme/x rules"]
    assert checks[0].warn and "could not be read" in checks[0].detail
    assert loop_branch_checks("acme/x", [{"type": "pull_request"}]) == []
    # A merged loop's branch stays: said, not a warning (nothing waits or stops for it).
    (kept,) = loop_branch_checks("acme/x", [{"type": "deletion"}])
    assert kept.ok and not kept.warn and "branch stays" in kept.detail


def test_the_listed_rules_are_githubs_documented_types(
    github: GitHubServer, env: dict[str, str]
) -> None:
    """githubkit parses what the local GitHub lists into GitHub's own rule models (the
    OpenAPI description's ``repository-rule-detailed``), every type and its parameters."""
    from bot.core.settings import load_settings
    from bot.io.github.client import GitHubApp

    iid = sample_repo(github)
    repo = github.repos[REPO]
    repo.review_rules["main"] = ReviewRule(required_approving_review_count=1)
    repo.ruleset_checks["main"] = ["ci"]
    repo.listed_rules = list(EVERY_RULE)
    gi = GitHubApp(load_settings(env)).installation(iid)
    owner, name = REPO.split("/")
    seen = set()
    for branch in ("main", "loop/1"):
        parsed = gi._call(
            lambda gh, b=branch: gh.rest.repos.get_branch_rules(owner, name, b).parsed_data
        )
        assert all(type(r).__name__.startswith("RepositoryRuleDetailedOneof") for r in parsed)
        seen |= {r.type for r in parsed}
    assert seen == {rule["type"] for _, rule in repo.listed_rules} | {
        "pull_request",
        "required_status_checks",
    }
