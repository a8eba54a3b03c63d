"""Bare mirrors and per-issue worktrees, with git as the harness (never the agent) runs it.

Layout under ``LOOPBOT_DATA_DIR``::

    mirrors/{owner}/{repo}.git                 bare; remote branches in refs/remotes/origin/*
    worktrees/{owner}/{repo}/issue-{N}         the loop's checkout of branch loop/issue-N

The mirror keeps remote branches under ``refs/remotes/origin`` so that fetching never
collides with the loop branches checked out in worktrees.

Credentials: the installation token reaches git through a credential helper given on
the command line (``-c credential.helper=...``) that reads it from the environment of
that one git process. It is never in a URL, on disk, or in a log.

Everything in the worktree is hostile input to the harness: the repository's files and
whatever the agent wrote (``.gitconfig``, ``.gitattributes`` naming filters, a ``.git``
replaced by a directory, a FIFO or a pointer elsewhere, nested repositories with their
own config). So harness git never reads configuration from anywhere the agent can
write: no system or global config (``HOME`` and ``XDG_CONFIG_HOME`` point at nothing,
``GIT_CONFIG_GLOBAL=/dev/null``), only the mirror's own config, which the sandbox sees
read-only; every program-running key (hooks, fsmonitor, gpg, ssh, pagers, attributes
files, external diff) overridden on the command line. Worktree commands name their git
directory explicitly (``GIT_DIR``/``GIT_WORK_TREE``), so the worktree's ``.git`` is
never opened; before a commit the harness removes nested ``.git`` entries and special
files (FIFOs, sockets, devices) so git never descends into a repository the agent made.
Fetches and pushes go from the mirror, never from the worktree.

Mirrors are shared by every work horse on the machine (RQ forks one per job), so fetch,
worktree add/move, commits, pushes and ref updates hold a file lock per mirror. What a
worktree holds beside its commits (ignored files, setup's and verify's leftovers) is
``jobs/tree/files.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from bot.core.rules import push_refusal
from bot.io.logs import get_logger
from jobs.tree.files import LEFTOVERS, TreeFiles
from jobs.tree.git import (
    MAX_GITFILE,
    Checkout,
    FileState,
    GitError,
    _read_small_regular,
    _remove,
    defuse_tree,
    files_at,
    git,
    has_file_named,
    mirror_lock,
)

HELD_OUT = "loopbot-held-out"  # in the worktree's admin dir while held-out verify runs
log = get_logger("loopbot.worktree")


class PushRefused(GitError):
    """GitHub refused the push (a ``[remote rejected]`` ref status): what it said."""

    def __init__(self, refusal: push_refusal.Refusal) -> None:
        super().__init__(f"GitHub refused the push of {refusal.ref}: {refusal.reason}")
        self.refusal = refusal


MAX_SPARES = 2  # finished worktrees kept per repository for reuse
# In the mirror's info/attributes, which outranks every .gitattributes in a tree: no
# attribute converts content between the worktree and a commit (eol, ident, encodings,
# filters), so a commit holds the worktree's bytes, byte for byte, and a checkout writes
# the commit's. Verify, which runs on the worktree, then judges exactly what is committed.
NEUTRAL_ATTRIBUTES = "* -text -eol -crlf -ident -filter -working-tree-encoding\n"


def _neutral_attributes(mirror: Path) -> None:
    info = mirror / "info"
    info.mkdir(exist_ok=True)
    target = info / "attributes"
    if not target.is_file() or target.read_text() != NEUTRAL_ATTRIBUTES:
        target.write_text(NEUTRAL_ATTRIBUTES)


class Worktrees(TreeFiles):
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        # merge-base of two commits, by their shas: a fact that never changes, asked
        # for several times a turn (the diff's start for the tests check, the nested
        # guidance, "did the tree change"). One git process saved is a fork saved.
        self._merge_bases: dict[tuple[str, str, str], str] = {}
        self._urls: dict[Path, str] = {}  # each mirror's remote, as sync_mirror set it

    def mirror_path(self, repo: str) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "mirrors" / owner / f"{name}.git"

    def worktree_path(self, repo: str, issue: int) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "worktrees" / owner / name / f"issue-{issue}"

    def sync_mirror(self, repo: str, clone_url: str, token: str) -> Path:
        """Create the bare mirror once, then fetch into it before each use."""
        mirror = self.mirror_path(repo)
        with mirror_lock(mirror):
            if not (mirror / "HEAD").exists():
                mirror.mkdir(parents=True, exist_ok=True)
                git(mirror, "init", "--bare", "-q")
                git(mirror, "remote", "add", "origin", clone_url)
                git(mirror, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
                git(mirror, "config", "gc.auto", "0")  # gc would stall a loop; run it apart
            else:
                git(mirror, "remote", "set-url", "origin", clone_url)
            self._urls[mirror] = clone_url
            _neutral_attributes(mirror)
            git(mirror, "fetch", "--prune", "--no-tags", "-q", "origin", token=token)
        return mirror

    def remote_sha(self, mirror: Path, branch: str) -> str | None:
        out = git(
            mirror, "rev-parse", "--verify", "-q", f"refs/remotes/origin/{branch}", check=False
        )
        return out.strip() or None

    def _git(
        self, path: Path, mirror: Path, *args: str, check: bool = True, errors: str = "replace"
    ) -> str:
        """git on the worktree at ``path``, with its git directory named explicitly, and
        what setup and verify left there ignored (``exclude_leftovers``)."""
        admin = self._admin_dir(path, mirror)
        if admin is None:
            raise GitError(f"{path} is not a worktree of {mirror}")
        excludes = f"core.excludesFile={admin / LEFTOVERS}"
        return git(path, "-c", excludes, *args, git_dir=admin, check=check, errors=errors)

    def checkout(
        self, repo: str, issue: int, branch: str, default_branch: str, mirror: Path
    ) -> Checkout:
        """The loop's worktree: reused, recreated from the pushed branch, or new."""
        path = self.worktree_path(repo, issue)
        base_sha = self.remote_sha(mirror, default_branch)
        if base_sha is None:
            raise GitError(f"default branch {default_branch!r} not found on the remote")
        pushed = self.remote_sha(mirror, branch)
        with mirror_lock(mirror):
            if path.exists() and self._valid(path, mirror, branch):
                self._restore_gitfile(path, mirror)
                self._held_out_interrupted(Checkout(path, mirror, branch, base_sha, resumed=True))
                head = self.head(path, mirror)
                if pushed and head != pushed and self._is_ancestor(mirror, head, pushed):
                    # Another worker pushed further (we were presumed dead): move up to it.
                    defuse_tree(path)
                    self._git(path, mirror, "reset", "-q", "--hard", pushed)
                return Checkout(path, mirror, branch, base_sha, resumed=True)
            if path.exists() or path.is_symlink():
                _remove(path)
            git(mirror, "worktree", "prune")
            path.parent.mkdir(parents=True, exist_ok=True)
            start = f"refs/remotes/origin/{branch}" if pushed else base_sha
            if not self._reuse_spare(repo, mirror, path, branch, start):
                git(mirror, "worktree", "add", "-q", "-f", "-B", branch, str(path), start)
            admin = self._admin_dir(path, mirror)
            if admin is not None:
                (admin / LEFTOVERS).write_text("")  # a new loop: nothing left over yet
        return Checkout(path, mirror, branch, base_sha, resumed=pushed is not None)

    def _held_out_interrupted(self, checkout: Checkout) -> None:
        """A worker died during held-out verify (``held_out``): what is uncommitted is
        the base's tests, not the agent's work. Back to the head's commit. Called with the
        mirror's lock held."""
        admin = self._admin_dir(checkout.path, checkout.mirror)
        marker = admin / HELD_OUT if admin is not None else None
        if marker is None or not marker.exists():
            return
        defuse_tree(checkout.path)
        self._git(checkout.path, checkout.mirror, "reset", "-q", "--hard")
        self._git(checkout.path, checkout.mirror, "clean", "-q", "-fd")
        not_on_head = [p for p in marker.read_text().split("\0") if p]
        self._clean_paths(checkout, not_on_head, locked=True)
        marker.unlink(missing_ok=True)
        log.warning("worktree.held_out_interrupted", path=str(checkout.path))

    # -- spares: finished worktrees kept for reuse ---------------------------------------

    def spares_dir(self, repo: str) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "spares" / owner / name

    def release(self, repo: str, issue: int) -> None:
        """A finished loop's worktree becomes a spare for the next loop (or is removed)."""
        path = self.worktree_path(repo, issue)
        mirror = self.mirror_path(repo)
        spares = self.spares_dir(repo)
        if (
            not path.exists()
            or self._admin_dir(path, mirror) is None
            or (spares.exists() and len(list(spares.iterdir())) >= MAX_SPARES)
        ):
            self.remove(repo, issue)
            return
        try:
            with mirror_lock(mirror):
                self._restore_gitfile(path, mirror)
                defuse_tree(path)
                # Free the loop branch and leave nothing of this loop behind: tracked files
                # as committed, untracked and ignored files (build output, caches) deleted.
                # Parked on a commit GitHub has (the newest fetched), not on the loop's
                # own head: a commit whose push failed must be reachable from nothing
                # once the branch goes (``_collect``).
                park = git(
                    mirror,
                    "for-each-ref",
                    "--count=1",
                    "--sort=-committerdate",
                    "--format=%(objectname)",
                    "refs/remotes/origin",
                ).strip()
                self._git(path, mirror, "checkout", "-q", "-f", "--detach", *[park][: bool(park)])
                self._git(path, mirror, "reset", "-q", "--hard")
                self._git(path, mirror, "clean", "-q", "-ffdx")
                if unseen := self.remove_unseen(path, mirror):  # where git looks away
                    log.warning("worktree.unseen_removed", removed=unseen[:20], count=len(unseen))
                if not self.is_clean(Checkout(path, mirror, "", "", resumed=False)):
                    raise GitError("git clean left files behind")
                spares.mkdir(parents=True, exist_ok=True)
                target = spares / f"spare-{uuid.uuid4().hex[:12]}"
                git(mirror, "worktree", "move", str(path), str(target))
                self._collect(mirror, issue)
        except (GitError, OSError) as exc:
            # A tree git cannot clean (too deep, unreadable, read-only) is no spare: the
            # whole worktree goes, however it was made.
            log.warning("worktree.release_failed", path=str(path), error=str(exc)[:300])
            self.remove(repo, issue)

    def _reuse_spare(self, repo: str, mirror: Path, path: Path, branch: str, start: str) -> bool:
        """A spare moved to ``path`` and checked out at ``start``; False when there is
        none, or it cannot be made to hold exactly the commit (then it is gone)."""
        if not self._take_spare(repo, mirror, path):
            return False
        try:
            # Recycled (cleaned when released): only the files that differ are written.
            # Whatever reached it while it waited goes, as at its release.
            self._git(path, mirror, "checkout", "-q", "-f", "-B", branch, start)
            if unseen := self.remove_unseen(path, mirror):
                log.warning("worktree.unseen_removed", removed=unseen[:20], count=len(unseen))
        except (GitError, OSError) as exc:
            log.warning("worktree.spare_unusable", spare=str(path), output=str(exc)[-200:])
            _remove(path)
            git(mirror, "worktree", "prune")
            return False
        return True

    def _take_spare(self, repo: str, mirror: Path, path: Path) -> bool:
        spares = self.spares_dir(repo)
        for spare in sorted(spares.glob("spare-*")) if spares.exists() else []:
            result = git(mirror, "worktree", "move", str(spare), str(path), check=False)
            if path.exists() and self._admin_dir(path, mirror) is not None:
                self._restore_gitfile(path, mirror)
                return True
            log.warning("worktree.spare_unusable", spare=str(spare), output=result[-200:])
            with contextlib.suppress(GitError, OSError):
                _remove(spare)
        return False

    def _valid(self, path: Path, mirror: Path, branch: str) -> bool:
        if self._admin_dir(path, mirror) is None:
            return False
        out = self._git(path, mirror, "rev-parse", "--abbrev-ref", "HEAD", check=False)
        return out.strip() == branch

    def _restore_gitfile(self, path: Path, mirror: Path) -> None:
        """Put back the ``.git`` file git wrote, for the agent's own git commands.

        The harness never reads it (it names the git directory itself), but the agent
        may have replaced it with a directory, a link, a FIFO or a pointer elsewhere.
        """
        gitfile = path / ".git"
        admin = self._admin_dir(path, mirror)
        if admin is None:
            raise GitError(f"{path} is not a worktree of {mirror}")
        expected = f"gitdir: {admin}\n"
        if _read_small_regular(gitfile, MAX_GITFILE) != expected:
            _remove(gitfile)
            gitfile.write_text(expected)

    def _admin_dir(self, path: Path, mirror: Path) -> Path | None:
        """The worktree's directory under ``mirror/worktrees`` (trusted: the agent cannot
        write the mirror). Usually named after the path; a recycled spare keeps its name.
        """
        target = str(path / ".git")
        named = mirror / "worktrees" / path.name
        candidates = [named, *sorted((mirror / "worktrees").glob("*"))]
        for admin in candidates:
            gitdir = admin / "gitdir"
            if gitdir.is_file() and gitdir.read_text().strip() == target:
                return admin
        return None

    def _is_ancestor(self, mirror: Path, a: str, b: str) -> bool:
        try:
            git(mirror, "merge-base", "--is-ancestor", a, b)
        except GitError:
            return False
        return True

    def head(self, path: Path, mirror: Path | None = None) -> str:
        return self._git(path, mirror or self._mirror_of(path), "rev-parse", "HEAD").strip()

    def _mirror_of(self, path: Path) -> Path:
        # worktrees/{owner}/{repo}/issue-N and spares/{owner}/{repo}/spare-X alike
        return self.data_dir / "mirrors" / path.parent.parent.name / f"{path.parent.name}.git"

    def commit_all(self, checkout: Checkout, message: str) -> str | None:
        """Commit whatever the agent changed; None when nothing changed."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout) as removed:
            if removed:
                log.warning("worktree.defused", removed=removed[:20], count=len(removed))
            self._git(path, mirror, "add", "-A")
            status = self._git(path, mirror, "status", "--porcelain", "--ignore-submodules=all")
            if not status.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message)
            return self.head(path, mirror)

    def set_aside(self, checkout: Checkout, prefix: str) -> dict[str, str]:
        """Keep what the agent changed under ``prefix`` (a directory, ``.github/workflows/``)
        out of the next commit: the worktree's files there go back to the commit the next
        one builds on (the default branch's during a merge of it). Returns each changed
        path's patch against that commit (empty: nothing changed there)."""
        path, mirror = checkout.path, checkout.mirror
        admin = self._admin_dir(path, mirror)
        merging = admin is not None and (admin / "MERGE_HEAD").is_file()
        ref = "MERGE_HEAD" if merging else "HEAD"
        with self._tree(checkout):
            self._git(path, mirror, "add", "-A", "--", prefix, check=False)
            names = self._git(
                path,
                mirror,
                "diff",
                "--cached",
                "--name-only",
                "-z",
                "--no-renames",
                ref,
                "--",
                prefix,
            )
            changed = [p for p in names.split("\0") if p]
            patches = {
                p: self._git(
                    path,
                    mirror,
                    "diff",
                    "--cached",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-renames",
                    ref,
                    "--",
                    p,
                )
                for p in changed
            }
            if changed:
                self._git(
                    path,
                    mirror,
                    "--literal-pathspecs",
                    "restore",
                    "-q",
                    f"--source={ref}",
                    "--staged",
                    "--worktree",
                    "--",
                    *changed,
                )
        return patches

    def linearize(self, checkout: Checkout) -> str | None:
        """When the head is a merge of the default branch (``merge_base_in``): the
        branch's work as one commit on the default branch's head instead, the same tree.
        GitHub judges each pushed commit against its parents, and a merge commit whose
        diff against the branch brings a person's change it refuses from the App (a
        workflow) is never needed: the pull request is squash-merged anyway. The new
        head (pushed with a lease: history rewritten), or None when the head is no merge."""
        path, mirror = checkout.path, checkout.mirror
        parents = self._git(path, mirror, "rev-list", "--parents", "-n", "1", "HEAD").split()
        if len(parents) < 3:
            return None
        head, base = parents[0], parents[2]
        with self._tree(checkout):
            message = self._git(path, mirror, "log", "-1", "--format=%B", head).strip()
            squashed = self._git(
                path,
                mirror,
                "commit-tree",
                f"{head}^{{tree}}",
                "-p",
                base,
                "-m",
                message or "loop: the branch on the default branch",
            ).strip()
            self._git(path, mirror, "reset", "-q", "--soft", squashed)
        return squashed

    def merge_touches(self, checkout: Checkout, prefix: str) -> bool:
        """Whether the head is a merge whose diff against the branch it extends (its first
        parent) changes anything under ``prefix``."""
        path, mirror = checkout.path, checkout.mirror
        parents = self._git(path, mirror, "rev-list", "--parents", "-n", "1", "HEAD").split()
        if len(parents) < 3:
            return False
        out = git(mirror, "diff", "--name-only", parents[1], parents[0], "--", prefix)
        return bool(out.strip())

    def unpushed_to_index(self, checkout: Checkout, pushed: str) -> None:
        """The commits after ``pushed`` (GitHub refused them) undone, their changes kept
        staged and in the worktree: the next commit holds the agent's tree as it is then,
        so refused content it removed is in no commit that is pushed."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--soft", pushed)

    def merge_base_in(self, checkout: Checkout, default_branch: str) -> list[str]:
        """Merge the default branch (as last fetched) into the loop branch.

        Returns the conflicted paths, with their conflict markers left in the worktree
        and the merge in progress: the agent resolves them and the turn's commit
        concludes the merge. An empty list means the merge committed cleanly.
        """
        path, mirror = checkout.path, checkout.mirror
        ref = f"refs/remotes/origin/{default_branch}"
        with self._tree(checkout):
            merged = self._git(
                path,
                mirror,
                "merge",
                "--no-edit",
                "-m",
                f"loop: merge {default_branch}",
                ref,
                check=False,
            )
            conflicted = self._git(path, mirror, "diff", "--name-only", "--diff-filter=U").split()
            if not conflicted and not self._is_ancestor(mirror, ref, self.head(path, mirror)):
                raise GitError(f"merging {default_branch} failed: {merged.strip()[-500:]}")
        return conflicted

    def discard_uncommitted(self, checkout: Checkout) -> None:
        """Back to the last commit: uncommitted, untracked and ignored files removed."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-ffdx")

    def changed_since_base(self, checkout: Checkout, head: str | None = None) -> bool:
        return (head or self.head(checkout.path, checkout.mirror)) != checkout.base_sha

    def fork_point(self, checkout: Checkout, head: str | None = None) -> str:
        """Where the branch's diff starts, as the pull request shows it: the merge base of
        its head and the default branch (the default branch after a merge of it).
        ``head``: the branch's head when the caller has just read it."""
        head = head or self.head(checkout.path, checkout.mirror)
        key = (str(checkout.mirror), checkout.base_sha, head)
        if (known := self._merge_bases.get(key)) is not None:
            return known
        out = git(checkout.mirror, "merge-base", checkout.base_sha, head, check=False).strip()
        if out:  # no merge base (unrelated histories) is not a fact worth keeping
            if len(self._merge_bases) >= 256:
                self._merge_bases.clear()
            self._merge_bases[key] = out
        return out or checkout.base_sha

    def tree_changed(self, checkout: Checkout, head: str | None = None) -> bool:
        """Whether the committed tree differs from the base's: commits that add up to no
        change (an edit and its revert) are no change. Called after ``commit_all``, so
        the commit holds everything the agent left."""
        head = head or self.head(checkout.path, checkout.mirror)
        base = self.fork_point(checkout, head)
        trees = git(checkout.mirror, "rev-parse", f"{head}^{{tree}}", f"{base}^{{tree}}")
        ours, theirs = trees.split()
        return ours != theirs

    def changed_files(self, checkout: Checkout, head: str | None = None) -> list[str]:
        """Files the branch adds or changes against its fork point (deletions left out)."""
        return self.changed_paths(checkout, head, deletions=False)

    def changed_paths(
        self, checkout: Checkout, head: str | None = None, *, deletions: bool = True
    ) -> list[str]:
        """Every path the branch adds, changes or (``deletions``) deletes against its fork
        point; a rename is its two paths."""
        head = head or self.head(checkout.path, checkout.mirror)
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--name-only",
            *([] if deletions else ["--diff-filter=d"]),
            "-z",
            self.fork_point(checkout, head),
            head,
        )
        return [p for p in out.split("\0") if p]

    @contextlib.contextmanager
    def held_out(self, checkout: Checkout, base: str, paths: list[str]) -> Iterator[None]:
        """The worktree with ``paths`` as they are on ``base``: changed ones put back,
        ones the branch added removed. Everything else stays the branch's head. Put back
        to the head's commit on the way out (ignored files kept: setup's output)."""
        path, mirror = checkout.path, checkout.mirror
        on_base = set(self.listed(checkout, base, paths, names_only=True).split("\0")) - {""}
        on_head = set(self.listed(checkout, "HEAD", paths, names_only=True).split("\0")) - {""}
        not_on_head = [p for p in paths if p not in on_head]
        admin = self._admin_dir(path, mirror)
        marker = admin / HELD_OUT if admin is not None else None
        try:
            if marker is not None:
                # A worker killed in here leaves the base's tests in the worktree: the
                # next one puts the head back first (``checkout``), never commits them.
                marker.write_text("\0".join(not_on_head))
            with self._tree(checkout):
                # Literal pathspecs: a test file named ``*.py`` is that file, not a glob.
                if kept := [p for p in paths if p in on_base]:
                    self._git(path, mirror, "--literal-pathspecs", "checkout", base, "--", *kept)
                if added := [p for p in paths if p not in on_base]:
                    self._git(
                        path,
                        mirror,
                        "--literal-pathspecs",
                        "rm",
                        "-q",
                        "-f",
                        "--ignore-unmatch",
                        "--",
                        *added,
                    )
            yield
        finally:
            self.restore_committed(checkout)
            self._clean_paths(checkout, not_on_head)
            if marker is not None:
                marker.unlink(missing_ok=True)

    def _clean_paths(self, checkout: Checkout, paths: list[str], *, locked: bool = False) -> None:
        """``paths`` removed from the worktree, ignored or not: the base's files the head
        does not have, after held-out verify (the head's .gitignore may hide them)."""
        if not paths:
            return
        with contextlib.nullcontext() if locked else self._tree(checkout):
            self._git(
                checkout.path,
                checkout.mirror,
                "--literal-pathspecs",
                "clean",
                "-q",
                "-ffdx",
                "--",
                *paths,
            )

    def listed(
        self, checkout: Checkout, sha: str, paths: list[str], *, names_only: bool = False
    ) -> str:
        """``git ls-tree -r`` of ``paths`` at ``sha`` ("HEAD": the worktree's), NUL-separated:
        modes, blob ids and names, or the names only."""
        if not paths:
            return ""
        names = ["--name-only"] if names_only else []
        at = self.head(checkout.path, checkout.mirror) if sha == "HEAD" else sha
        return git(
            checkout.mirror, "--literal-pathspecs", "ls-tree", "-r", "-z", *names, at, "--", *paths
        )

    def files_with_added_lines(self, checkout: Checkout, head: str | None = None) -> list[str]:
        """Files where the branch adds at least one non-blank line against its fork point:
        an empty or whitespace-only test file captures nothing."""
        head = head or self.head(checkout.path, checkout.mirror)
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--numstat",
            "--ignore-blank-lines",
            "--ignore-all-space",
            "-z",
            self.fork_point(checkout, head),
            head,
        )
        found = []
        for item in (p for p in out.split("\0") if p):
            added, _, rest = item.partition("\t")
            _, _, path = rest.partition("\t")
            if added.isdigit() and int(added) > 0 and path:
                found.append(path)
        return found

    def is_clean(self, checkout: Checkout) -> bool:
        """Nothing uncommitted in the worktree (ignored files aside)."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            status = self._git(
                path,
                mirror,
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--ignore-submodules=all",
            )
        return not status.strip()

    def restore_committed(self, checkout: Checkout) -> None:
        """Back to the last commit, keeping ignored files (caches, installed packages):
        undoes what a command run on a clean checkout wrote into tracked or new files."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")

    def diff_stat(self, checkout: Checkout) -> str:
        return git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--stat",
            checkout.base_sha,
            self.head(checkout.path, checkout.mirror),
        )

    # -- milestones and post_action (jobs/loop/job.py) ------------------------------------------

    def diff_between(self, checkout: Checkout, base: str, head: str) -> str:
        """The diff from ``base`` to ``head`` (a section's work, for its audit)."""
        return git(checkout.mirror, "diff", "--no-ext-diff", "--no-textconv", base, head)

    def numstat_between(
        self, checkout: Checkout, base: str, head: str
    ) -> list[tuple[str, int | None]]:
        """Each path ``base``..``head`` touches (renames as delete and add), with its
        added plus deleted lines; None for a binary file, whose size no line count says."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--numstat",
            "-z",
            base,
            head,
        )
        found: list[tuple[str, int | None]] = []
        for item in (p for p in out.split("\0") if p):
            added, _, rest = item.partition("\t")
            deleted, _, path = rest.partition("\t")
            binary = not (added.isdigit() and deleted.isdigit())  # git says "-" "-"
            found.append((path, None if binary else int(added) + int(deleted)))
        return found

    def drop_to(self, checkout: Checkout, sha: str) -> None:
        """Put the branch and the worktree back at ``sha`` (an unpushed commit dropped),
        keeping ignored files."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--hard", sha)
            self._git(path, mirror, "clean", "-q", "-fd")

    # -- metric loops (jobs/loop/metric.py) --------------------------------------------------

    def tracked_files(self, checkout: Checkout) -> list[str]:
        """Every path git tracks at the head (phase 0: the scope must match one)."""
        out = git(
            checkout.mirror,
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            self.head(checkout.path, checkout.mirror),
        )
        return [p for p in out.split("\0") if p]

    def commit_paths(self, checkout: Checkout, sha: str) -> list[str]:
        """The paths commit ``sha`` adds, changes or deletes against its first parent
        (renames as a delete and an add): what the scope must allow."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--name-only",
            "-z",
            f"{sha}^",
            sha,
        )
        return [p for p in out.split("\0") if p]

    def revert_head(self, checkout: Checkout) -> str:
        """Undo the head commit with a new commit (``git revert --no-edit``): the history
        keeps what was tried. Uncommitted files (what a command wrote) go first."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")
            self._git(path, mirror, "revert", "--no-edit", "HEAD")
            return self.head(path, mirror)

    def restore_tree(self, checkout: Checkout, sha: str, message: str) -> str | None:
        """A new commit whose tree is ``sha``'s (the commits after it undone, kept in the
        history); None when the tree is ``sha``'s already."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout):
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")
            self._git(path, mirror, "read-tree", "-u", "--reset", sha)
            status = self._git(path, mirror, "status", "--porcelain", "--ignore-submodules=all")
            if not status.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message)
            return self.head(path, mirror)

    def commit_file(self, checkout: Checkout, name: str, text: str, message: str) -> str | None:
        """Write ``name`` at the worktree's root and commit it alone, even where the
        repository ignores it; None when it is unchanged. Whatever the agent left at that
        path (a link to elsewhere) is removed first, never followed."""
        path, mirror = checkout.path, checkout.mirror
        target = path / name
        with self._tree(checkout):
            if target.is_symlink() or target.exists():
                _remove(target)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            self._git(path, mirror, "add", "-f", "--", name)
            staged = self._git(path, mirror, "diff", "--cached", "--name-only")
            if not staged.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message, "--", name)
            return self.head(path, mirror)

    def push(
        self, checkout: Checkout, token: str, sha: str | None = None, *, lease: str | None = None
    ) -> str:
        """Push the loop branch's head (``sha`` when the caller knows it) from the mirror,
        fast-forward only: never clobber others. ``lease``: the branch's head on GitHub
        this push replaces (a rewritten history, ``--force-with-lease``); "" when it
        must not exist yet.

        The transfer (seconds, against GitHub) runs without the mirror's lock, which every
        other loop of the repository needs for its commits: it names the commit and the
        URL, not a ref and the remote, so git only reads objects here and writes no ref
        (a push to a named remote would update its remote-tracking ref). That ref is
        written after, under the lock.

        The answer is read from the ref status (``--porcelain``): a ref GitHub refused
        (a repository rule, push protection, a large file) raises ``PushRefused`` with
        what GitHub said, never passes for a pushed one.
        """
        mirror, branch = checkout.mirror, checkout.branch
        if sha is None:
            sha = git(mirror, "rev-parse", f"refs/heads/{branch}").strip()
        url = self._urls.get(mirror) or git(mirror, "config", "--get", "remote.origin.url")
        target = f"refs/heads/{branch}"
        forced = [] if lease is None else [f"--force-with-lease={target}:{lease}"]
        err: list[str] = []
        out = git(
            mirror,
            "push",
            "--porcelain",
            "--no-progress",
            *forced,
            url.strip(),
            f"{sha}:{target}",
            token=token,
            check=False,
            stderr=err,
        )
        statuses = [s for s in push_refusal.ref_statuses(out) if s.ref == target]
        if statuses and statuses[0].flag == "!":
            status = statuses[0]
            if status.summary == "[remote rejected]":
                raise PushRefused(push_refusal.classify(status, push_refusal.remote_lines(err[0])))
            raise GitError(f"git push refused {target}: {status.summary} ({status.reason})")
        if not statuses or statuses[0].flag not in (" ", "+", "*", "="):
            raise GitError(f"git push failed: {(err[0] if err else '').strip()[-2000:]}")
        with mirror_lock(mirror):
            git(mirror, "update-ref", f"refs/remotes/origin/{branch}", sha)
        return sha

    def remove(self, repo: str, issue: int) -> None:
        path = self.worktree_path(repo, issue)
        mirror = self.mirror_path(repo)
        if path.exists() or path.is_symlink():
            with contextlib.suppress(OSError):
                _remove(path)
        if mirror.exists():
            with mirror_lock(mirror):
                git(mirror, "worktree", "prune", check=False)
                self._collect(mirror, issue)

    def _collect(self, mirror: Path, issue: int) -> None:
        """A finished loop's branch leaves the mirror, and with it what only it held: a
        commit whose push failed (a file too large for GitHub) would otherwise stay in
        the shared mirror for good (``gc.auto`` is off), loop after loop. The pushed
        branch stays on GitHub; the mirror fetches it again when a loop needs it. Loose
        objects nothing reaches any more are pruned (the mirror lock is held: no commit
        of another loop is under way). Never fails the release."""
        branch = f"refs/heads/loop/issue-{issue}"
        try:
            used = git(mirror, "worktree", "list", "--porcelain")
        except GitError:
            return
        if f"branch {branch}\n" in used + "\n":
            return  # checked out again already (another loop of the issue)
        git(mirror, "update-ref", "-d", branch, check=False)
        # Worktrees' HEAD reflogs hold every commit they had checked out: expired first
        # (the harness never reads a reflog).
        expire = ("reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all")
        git(mirror, *expire, check=False)
        git(mirror, "prune", "--expire=now", check=False)

    def owned_worktrees(self) -> list[tuple[str, int, Path]]:
        """Every worktree on disk as (repo, issue, path), for the reaper."""
        root = self.data_dir / "worktrees"
        out = []
        if root.exists():
            for p in root.glob("*/*/issue-*"):
                try:
                    out.append(
                        (
                            f"{p.parent.parent.name}/{p.parent.name}",
                            int(p.name.removeprefix("issue-")),
                            p,
                        )
                    )
                except ValueError:
                    continue
        return out


__all__ = [
    "Checkout",
    "FileState",
    "GitError",
    "PushRefused",
    "Worktrees",
    "defuse_tree",
    "files_at",
    "git",
    "has_file_named",
    "mirror_lock",
]
