"""``loopbot doctor --github``, the repositories' rules: what GitHub will ask of loops there
before the first one runs, each rule as a line with what loopbot does about it.

Read as the installation reads them: the rules on the default branch and on a ``loop/*``
branch (``GET rules/branches/{branch}``; rules match branches by name, so ``loop/1``
need not exist), the repository's merge buttons (``GET repo``), the summary's
``protected`` of the default branch (classic protection's settings need
``administration`` read, which the App does not ask for), and whether the installation
granted ``workflows``. Pure functions of what the API answered; ``doctor_github`` asks.

A rule that makes loops wait (approvals, a merge queue) is a warning: loops work, and
the operator should know they will wait. A rule that stops them (squash merging off,
``loop/*`` branches that cannot be created or pushed) fails the doctor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.ops.doctor import Check

LOOP_BRANCH = "loop/1"  # a branch named as loopbot names them, to read the rules on loop/*
SHOWN_REPOS = 20  # per installation: the rules of more repositories are not read

Rule = Mapping[str, Any]


def _params(rule: Rule) -> Mapping[str, Any]:
    return rule.get("parameters") or {}


def _reviews(p: Mapping[str, Any]) -> list[str]:
    """A ``pull_request`` rule's asks that make a loop wait, each with what loopbot does."""
    out = []
    n = int(p.get("required_approving_review_count") or 0)
    if n:
        out.append(
            f"requires {n} approving review{'s' if n > 1 else ''} by a writer: the loop waits "
            "(phase awaiting_approval) and asks the writer who approved the issue to review"
        )
    if p.get("require_code_owner_review"):
        out.append("requires code owners' review: the wait names the owners of the changed files")
    if p.get("dismiss_stale_reviews_on_push"):
        out.append("dismisses approvals on a push: after one, the loop waits for a new approval")
    if p.get("require_last_push_approval"):
        out.append(
            "requires approval by someone other than the last pusher: loopbot pushes last, so any "
            "writer's approval counts"
        )
    if p.get("required_review_thread_resolution"):
        out.append(
            "requires resolved conversations: loopbot resolves its own review threads "
            "and waits for a person to resolve theirs"
        )
    return out


def default_branch_checks(where: str, branch: str, rules: Sequence[Rule]) -> list[Check]:
    """The rules on the default branch: what a loop's merge will wait for, or be refused."""
    name = f"{where} {branch}"
    checks: list[Check] = []
    for rule in rules:
        kind, p = str(rule.get("type")), _params(rule)
        if kind == "pull_request":
            for ask in _reviews(p):
                checks.append(Check(name, True, ask, warn=True))
            methods = p.get("allowed_merge_methods")
            if isinstance(methods, list) and "squash" not in methods:
                checks.append(
                    Check(
                        name,
                        False,
                        f"a ruleset allows only {', '.join(map(str, methods)) or 'no'} merges: "
                        "loopbot merges by squash only, so every loop is refused at the merge",
                        "allow squash in the ruleset's pull_request rule (allowed merge methods)",
                    )
                )
        elif kind == "required_status_checks":
            names = [str(c.get("context")) for c in p.get("required_status_checks") or []]
            checks.append(
                Check(
                    name,
                    True,
                    f"requires checks {', '.join(names) or '(none named)'}: the gate waits for "
                    "them, and gives the loop a turn on a failing one",
                )
            )
        elif kind == "merge_queue":
            method = str(p.get("merge_method") or "MERGE").lower()
            checks.append(
                Check(
                    name,
                    True,
                    f"requires a merge queue ({method}): loopbot enqueues its pull request "
                    "with the head it reviewed and completes the loop when the queue merges it",
                    warn=True,
                )
            )
        elif kind == "update":
            checks.append(
                Check(
                    name,
                    False,
                    "updates are restricted to the ruleset's bypass list (update): GitHub "
                    "blocks every merge into it, so loops end refused at the merge",
                    "lift the restriction, or merge loopbot's pull requests by hand",
                )
            )
        elif kind in ("required_signatures", "required_linear_history"):
            what = "signed commits" if kind == "required_signatures" else "a linear history"
            checks.append(
                Check(
                    name,
                    True,
                    f"requires {what} ({kind}): loopbot's squash merge, made by GitHub, "
                    "satisfies it",
                )
            )
        elif kind in ("deletion", "non_fast_forward", "creation") or kind in PUSH_RULES:
            # loopbot never creates, deletes or pushes to the default branch: a push
            # rule's refusals come on loop/*, and are listed there.
            continue
        elif kind in MERGE_GATES:
            checks.append(
                Check(
                    name,
                    True,
                    f"requires {MERGE_GATES[kind]} ({kind}): GitHub refuses the merge until "
                    "then; the gate waits only for the checks the branch requires, so a "
                    "merge refused for this ends the loop refused / not_mergeable with "
                    "GitHub's words",
                    warn=True,
                )
            )
        else:
            checks.append(_unknown(name, kind))
    return checks


def loop_branch_checks(where: str, rules: Sequence[Rule]) -> list[Check]:
    """The rules on ``loop/*``: loopbot's own branches, which it must create and push."""
    name = f"{where} loop/*"
    checks: list[Check] = []
    for rule in rules:
        kind, p = str(rule.get("type")), _params(rule)
        stop = {
            "creation": "creating loop/* branches is restricted (creation)",
            "update": "pushing to loop/* branches is restricted (update)",
            "required_signatures": "signed commits are required on loop/* "
            "(required_signatures): loopbot's commits are not signed",
        }.get(kind)
        if stop:
            checks.append(
                Check(
                    name,
                    False,
                    f"{stop}: "
                    + (
                        "each loop's first push is refused, and the loop ends failed / "
                        "push_refused after its first turn"
                        if kind == "update"
                        else "each loop stops before any work, failed / push_refused"
                    ),
                    "narrow the ruleset's branch pattern so it does not match loop/* "
                    "(loopbot does not rely on a bypass)",
                )
            )
        elif kind == "non_fast_forward":
            checks.append(
                Check(
                    name,
                    True,
                    "force pushes are refused (non_fast_forward): a loop whose default branch "
                    "changed a workflow, which loopbot brings in by rewriting its branch with "
                    "a lease, ends failed / push_refused",
                    warn=True,
                )
            )
        elif kind == "deletion":
            checks.append(
                Check(
                    name,
                    True,
                    "deleting loop/* branches is restricted (deletion): a merged loop's "
                    "branch stays, and its status comment says so",
                )
            )
        elif kind in ("pull_request", "required_status_checks", "merge_queue"):
            continue  # loopbot never merges into loop/*
        elif kind in MERGE_GATES:
            continue  # they gate merges into loop/*, which loopbot never makes
        elif kind == "required_linear_history":
            checks.append(
                Check(
                    name,
                    True,
                    "requires a linear history (required_linear_history): merging the "
                    "default branch in to resolve a conflict is refused; those loops end "
                    "failed / push_refused",
                    warn=True,
                )
            )
        else:
            checks.append(_push_rule(name, kind, p) or _unknown(name, kind))
    return checks


PUSH_RULES = frozenset(
    {"file_path_restriction", "file_extension_restriction", "max_file_size", "max_file_path_length"}
)
MERGE_GATES = {
    "code_scanning": "code scanning results",
    "workflows": "workflows to pass",
    "required_deployments": "deployments to succeed",
}


def _push_rule(name: str, kind: str, p: Mapping[str, Any]) -> Check | None:
    """A push ruleset's rule: GitHub refuses the push, and the loop stops with its words."""
    what = {
        "file_path_restriction": lambda: (
            "pushes touching "
            + ", ".join(map(str, p.get("restricted_file_paths") or []))
            + " are refused"
        ),
        "file_extension_restriction": lambda: (
            "pushes adding files ending "
            + ", ".join(map(str, p.get("restricted_file_extensions") or []))
            + " are refused"
        ),
        "max_file_size": lambda: f"files over {p.get('max_file_size')} MB are refused",
        "max_file_path_length": lambda: (
            f"paths longer than {p.get('max_file_path_length')} characters are refused"
        ),
    }.get(kind)
    if what is not None:
        return Check(
            name,
            True,
            f"{what()} ({kind}): a loop whose commit does so ends failed / push_refused "
            "with GitHub's words on the issue",
            warn=True,
        )
    return None


def _unknown(name: str, kind: str) -> Check:
    return Check(
        name,
        True,
        f"a rule loopbot does not know ({kind}): if it refuses a push or a merge, the "
        "loop stops with GitHub's words on the issue",
        warn=True,
    )


def repo_checks(
    where: str,
    info: Mapping[str, Any],
    default_rules: Sequence[Rule] | None,
    loop_rules: Sequence[Rule] | None,
    protected: bool | None,
) -> list[Check]:
    """One repository: its merge buttons, classic protection, and the rules above. A
    repository with nothing that makes loops wait or stop gets one line saying so."""
    branch = str(info.get("default_branch") or "main")
    checks: list[Check] = []
    if info.get("allow_squash_merge") is False:
        checks.append(
            Check(
                f"{where} merge methods",
                False,
                "squash merging is turned off: loopbot merges by squash only, so every "
                "loop is refused at the merge (refused / not_mergeable)",
                "turn on 'Allow squash merging' in the repository's settings (General)",
            )
        )
    if protected:
        checks.append(
            Check(
                f"{where} {branch}",
                True,
                "has classic branch protection: its settings need administration read, "
                "which loopbot's App does not ask for; the gate follows GitHub's own "
                "verdict on each pull request (reviewDecision, mergeStateStatus), waiting "
                "for the approvals it asks",
                warn=True,
            )
        )
    if default_rules is None or loop_rules is None:
        checks.append(
            Check(
                f"{where} rules",
                True,
                "rulesets could not be read (GitHub Enterprise Server without rulesets?): "
                "what they ask shows only at the merge",
                warn=True,
            )
        )
    checks += default_branch_checks(where, branch, default_rules or [])
    checks += loop_branch_checks(where, loop_rules or [])
    if not checks:
        checks.append(Check(where, True, f"no rule on {branch} or loop/* makes loops wait or stop"))
    return checks


def workflows_check(where: str, granted: Mapping[str, Any]) -> Check:
    """Whether the installation may push workflow changes (app.yml does not ask)."""
    level = str(granted.get("workflows") or "none")
    if level == "write":
        return Check(
            f"workflows ({where})",
            True,
            "granted: the agent's changes under .github/workflows/ are pushed like any "
            "other; loopbot never needs it",
            warn=True,
        )
    return Check(
        f"workflows ({where})",
        True,
        "not granted (app.yml does not ask for it): GitHub refuses the App's pushes that "
        "change .github/workflows/, so loopbot keeps those changes out of its commits and "
        "puts them in the pull request as a patch for a person",
    )


def more_repos_check(where: str, total: int) -> Check:
    return Check(
        f"rules ({where})",
        True,
        f"the rules of the first {SHOWN_REPOS} of {total} repositories were read; the "
        "others' show at their first loop",
        warn=True,
    )
