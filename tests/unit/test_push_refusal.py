"""The push refusal classifier on GitHub's exact texts (as its users report them)."""

from __future__ import annotations

from bot.core.rules import push_refusal
from bot.core.rules.push_refusal import (
    Kind,
    LargeFile,
    Secret,
    agent_note,
    classify,
    maintainer_detail,
    ref_statuses,
    remote_lines,
)
from bot.core.text.defuse import JOINER

SHA = "5477a7dd26384ed3c8b3814ee677f755ad27a597"
REF = "refs/heads/loop/issue-1"


def porcelain(reason: str) -> str:
    return (
        f"To https://github.com/acme/widgets\n!\t{SHA}:{REF}\t[remote rejected] ({reason})\nDone\n"
    )


def one(stdout: str, stderr: str = ""):  # type: ignore[no-untyped-def]
    (status,) = ref_statuses(stdout)
    assert (status.flag, status.ref) == ("!", REF)
    return classify(status, remote_lines(stderr))


def test_workflow_permission() -> None:
    r = one(
        porcelain(
            "refusing to allow a GitHub App to create or update workflow "
            "`.github/workflows/ci.yml` without `workflows` permission"
        )
    )
    assert (r.kind, r.workflow, r.fixable) == (Kind.WORKFLOWS, ".github/workflows/ci.yml", False)
    retyped = one(
        porcelain(
            "refusing to allow a GitHub App to create or update workflow "
            ".github/workflows/main.yml without workflows permission"
        )
    )
    assert (retyped.kind, retyped.workflow) == (Kind.WORKFLOWS, ".github/workflows/main.yml")


PUSH_PROTECTION = f"""\
remote: Resolving deltas: 100% (7/7), completed with 3 local objects.
remote: error: GH013: Repository rule violations found for {REF}.
remote:
remote: - GITHUB PUSH PROTECTION
remote:   —————————————————————————————————————————
remote:     Resolve the following violations before pushing again
remote:
remote:     - Push cannot contain secrets
remote:
remote:
remote:      (?) Learn how to resolve a blocked push
remote:      https://docs.github.com/code-security/secret-scanning/working-with-secret-scanning-and-push-protection/working-with-push-protection-from-the-command-line#resolving-a-blocked-push
remote:
remote:
remote:       —— GitHub Personal Access Token ——————————————————————
remote:        locations:
remote:          - commit: {SHA}
remote:            path: src/api/github.ts:34
remote:
remote:        (?) To push, remove secret from commit(s) or follow this URL to allow the secret.
remote:        https://github.com/acme/widgets/security/secret-scanning/unblock-secret/2gakJrAdu
remote:
remote:       —— DeepSeek API Key ——————————————————————————————————
remote:        locations:
remote:          - commit: {SHA}
remote:            path: .env:6
remote:
To https://github.com/acme/widgets
"""


def test_push_protection_with_each_secret_type_and_place() -> None:
    r = one(porcelain("push declined due to repository rule violations"), PUSH_PROTECTION)
    assert r.kind == Kind.SECRET and r.fixable
    assert r.secrets == (
        Secret("GitHub Personal Access Token", SHA, "src/api/github.ts", 34),
        Secret("DeepSeek API Key", SHA, ".env", 6),
    )
    note = agent_note(r)
    assert "GitHub Personal Access Token in `src/api/github.ts` line 34" in note
    assert "Never try to get around the check" in note


LARGE = """\
remote: error: Trace: 0e1f2a3b4c5d
remote: error: See https://gh.io/lfs for more information.
remote: error: File assets/demo.zip is 123.45 MB; this exceeds GitHub's file size limit of 100.00 MB
remote: error: GH001: Large files detected. You may want to try Git Large File Storage - https://git-lfs.github.com.
"""


def test_push_protections_older_wording_is_a_secret_too() -> None:
    older = PUSH_PROTECTION.replace(
        "Resolve the following violations before pushing again",
        "Resolve the following secrets before pushing again.",
    ).replace("remote:     - Push cannot contain secrets\n", "")
    r = one(porcelain("push declined due to repository rule violations"), older)
    assert r.kind == Kind.SECRET and len(r.secrets) == 2


def test_large_file_with_its_path_and_size() -> None:
    r = one(porcelain("pre-receive hook declined"), LARGE)
    assert (r.kind, r.files) == (Kind.LARGE_FILE, (LargeFile("assets/demo.zip", "123.45 MB"),))
    assert "`assets/demo.zip` (123.45 MB)" in agent_note(r)


CREATION = f"""\
remote: error: GH013: Repository rule violations found for {REF}.
remote: Review all repository rules at https://github.com/acme/widgets/rules?ref=refs%2Fheads%2Floop%2Fissue-1
remote:
remote: - Cannot create ref due to creations being restricted.
remote:
"""


def test_creation_restricted_stops_with_what_to_do() -> None:
    r = one(porcelain("push declined due to repository rule violations"), CREATION)
    assert (r.kind, r.fixable) == (Kind.CREATION_RESTRICTED, False)
    detail = maintainer_detail(r)
    assert "Cannot create ref due to creations being restricted." in detail
    assert "Narrow the ruleset's pattern" in detail and "/loop-restart" in detail


def test_anything_else_is_other_with_githubs_words_defused() -> None:
    stderr = "remote: error: GH013: Commits must have verified signatures. See @acme/admins #12\n"
    r = one(porcelain("push declined due to repository rule violations"), stderr)
    assert r.kind == Kind.OTHER
    detail = maintainer_detail(r)
    assert "verified signatures" in detail
    assert f"@{JOINER}acme" in detail and f"#{JOINER}12" in detail  # pings no one


def test_accepted_and_other_statuses_are_read_too() -> None:
    out = (
        f"To x\n*\t{SHA}:{REF}\t[new branch]\n"
        f"+\t{SHA}:refs/heads/b\tabc...def (forced update)\nDone\n"
    )
    statuses = ref_statuses(out)
    assert [(s.flag, s.ref, s.reason) for s in statuses] == [
        ("*", REF, ""),
        ("+", "refs/heads/b", "forced update"),
    ]


def test_branch_rules_that_refuse_the_first_push_stop_the_loop_before_any_work() -> None:
    creation = {"type": "creation", "ruleset_id": 7, "ruleset_source": "acme/app"}
    signed = {"type": "required_signatures"}
    other = {"type": "non_fast_forward"}
    stop = push_refusal.branch_rules_stop([other, creation], "loop/issue-3", new=True)
    assert stop is not None and "creating branches" in stop and "ruleset 7" in stop
    # Creation matters only to a branch not yet pushed; signatures always.
    assert push_refusal.branch_rules_stop([creation], "loop/issue-3", new=False) is None
    assert push_refusal.branch_rules_stop([signed], "loop/issue-3", new=False) is not None
    assert push_refusal.branch_rules_stop([other], "loop/issue-3", new=True) is None
    assert push_refusal.branch_rules_stop([], "loop/issue-3", new=True) is None
