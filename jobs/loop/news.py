"""What a turn's prompt gives the agent once: the maintainers' comments and the nested
AGENTS.md of the files it changed; a part of ``LoopRunner`` both loops ask before a prompt."""

from __future__ import annotations

from typing import Any

from bot.core import attachments as attachment_rules
from bot.core.record import LoopRecord
from bot.core.rules.loop import discussion, nested_guidance
from bot.core.text import attachments as words
from bot.core.text import prompts
from bot.io.attachments import Attachments
from jobs.agents.backends import CLI_BACKENDS
from jobs.loop.runner import RunnerBase, _News
from jobs.tree.worktree import Checkout, files_at, has_file_named


class TurnNews(RunnerBase):
    """The comments and nested AGENTS.md a turn's prompt gives the agent, once each."""

    def _news(self, record: LoopRecord, base: str, *, first: bool) -> _News:
        """What the agent has not been given yet, as prompt sections: the maintainers'
        comments on the issue, and the nested AGENTS.md for the files it changed.

        In the first prompt (``first``: an empty conversation) everything counts as new,
        whatever the record says was delivered: a conversation lost with its worker took
        what it was given with it.
        """
        comments = self._discussion(set() if first else set(record.comments_delivered))
        guidance = self._nested_guidance(set() if first else set(record.guidance_delivered))
        attached, blocks = self._comment_files(comments)
        return _News(
            first=first,
            comments=comments,
            guidance=tuple(guidance),
            sections=(
                prompts.discussion(comments, first=first),
                *attached,
                prompts.nested_guidance(guidance, base),
            ),
            blocks=tuple(blocks),
        )

    def _comment_files(
        self, comments: discussion.Selection
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """The files attached to the writers' comments this prompt gives the agent for the
        first time: read now (their signed URLs live minutes), from GitHub's attachment
        hosts only and within the issue's limits, as the issue's are (bot/io/attachments.py).
        A comment whose text changed since it was selected gives none: its files are not
        the ones the selected text shows. The prompt's words on them, and the images and
        PDFs as blocks for the built-in agent (a CLI reads them in the sandbox's folder)."""
        files = Attachments(self.rt.settings.data_dir, self.rt.settings.api_url)
        cli = self.config.agent.backend in CLI_BACKENDS
        folder = str(files.folder(self.key)) if cli else None
        sections: list[str] = []
        blocks: list[dict[str, Any]] = []
        for c in comments.shown:
            if not attachment_rules.may_attach(c.body):
                continue  # no image or upload in its text: no read of its rendering
            body, html = self.gh.comment_rendered(self.repo, c.id)
            if body != c.body:
                continue
            fetched = files.fetch(self.key, f"comment-{c.id}", html)
            if not (fetched.files or fetched.skipped):
                continue
            whose = f"the comment by @{c.author} (write access)"
            texts = files.texts(self.key, fetched)
            sections.append(words.section(fetched, texts, folder, whose))
            if not cli:
                blocks += files.blocks(self.key, fetched)
            self.store.event(
                self.key,
                "comment_attachments",
                comment=c.id,
                files=[{"name": a.name, "kind": a.kind, "bytes": a.size} for a in fetched.files],
                skipped=[{"name": x.name, "reason": x.reason} for x in fetched.skipped],
            )
            if fetched.skipped:
                self.gh.upsert_comment(
                    self.repo,
                    self.issue_number,
                    f"{words.COMMENT_KEY}-{c.id}",
                    words.skipped_comment(fetched.skipped, f"@{c.author}'s comment"),
                )
        return sections, blocks

    def _discussion(self, delivered: set[int]) -> discussion.Selection:
        """The issue's comments not delivered yet that may go to the agent: by people who
        can write (asked once per author per turn, and only for comments that pass the
        other rules), within the prompt's room (bot/core/rules/loop/discussion.py)."""
        pending = discussion.candidates(self.gh.comments(self.repo, self.issue_number), delivered)
        writes = {
            login: self.gh.can_write(self.repo, login) for login in discussion.authors(pending)
        }
        return discussion.fit(discussion.by_writers(pending, writes))

    def _nested_guidance(self, delivered: set[str]) -> list[nested_guidance.Guidance]:
        """The nearest AGENTS.md below the root for each file the branch changed, not
        delivered yet, read from the default branch in the mirror (``checkout.base_sha``):
        never from the worktree, where the agent may have written its own."""
        checkout = self.checkout
        if not self._any_nested_guidance(checkout):
            return []  # most repositories: no git for it, turn after turn
        head = self.worktrees.head(checkout.path, checkout.mirror)
        if not self.worktrees.changed_since_base(checkout, head):
            return []
        changed = self.worktrees.changed_files(checkout, head)
        wanted = nested_guidance.candidates(changed)
        if not wanted:
            return []
        present = files_at(checkout.mirror, checkout.base_sha, wanted)
        new = [p for p in nested_guidance.nearest(changed, present) if p not in delivered]
        return nested_guidance.fit({p: present[p] for p in new})

    def _any_nested_guidance(self, checkout: Checkout) -> bool:
        """Whether the default branch (as this job checked it out) has an AGENTS.md below
        its root at all: read once per base, from the mirror."""
        known = self._nested_at.get(checkout.base_sha)
        if known is None:
            known = has_file_named(checkout.mirror, checkout.base_sha, nested_guidance.NAME)
            self._nested_at = {checkout.base_sha: known}
        return known

    def _delivered(self, news: _News, turn: int) -> None:
        """Record what the turn's prompt gave the agent, so no later prompt repeats it;
        the events name the comments and files, never their text."""
        comment_ids, paths = news.comments.ids, [g.path for g in news.guidance]
        if not comment_ids and not paths and not news.first:
            return

        def apply(r: LoopRecord) -> None:
            # A first prompt starts the record's lists over: its conversation is new.
            old_ids = [] if news.first else r.comments_delivered
            old_paths = [] if news.first else r.guidance_delivered
            r.comments_delivered = sorted({*old_ids, *comment_ids})
            r.guidance_delivered = sorted({*old_paths, *paths})

        self.store.update(self.key, apply)
        if comment_ids:
            self.store.event(
                self.key,
                "discussion",
                turn=turn,
                count=len(news.comments.shown),
                ids=[c.id for c in news.comments.shown],
                left_out=list(news.comments.dropped),
            )
        if paths:
            self.store.event(self.key, "nested_guidance", turn=turn, paths=paths)
