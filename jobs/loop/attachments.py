"""The approved issue's attachments, read when the loop starts on it (bot/io/attachments.py).

Read once per approval, at the start of the loop's job: the signed URLs live minutes, and
the job starts right after the approval. The files' hashes join the approved text on the
record; a job that resumes the loop (another worker, a restart) reads the issue again and
compares: bytes that differ from what the writer approved are an edit, and the loop stops
as for any such edit. Nothing is read when the issue's text is no longer the approved
text: that edit stops the loop before its next turn, and the files it points at reach no
model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.core.attachments import Fetched
from bot.core.record import LoopRecord, intake_hash
from bot.core.text import attachments as text
from bot.io.attachments import Attachments
from bot.io.github.client import Installation
from bot.io.store import Store


@dataclass
class Given:
    """What the prompts get of the attachments."""

    fetched: Fetched | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)  # images and PDFs
    texts: dict[str, str] = field(default_factory=dict)  # text files by stored name
    folder: Path | None = None  # where the files are stored on this worker

    def folders(self) -> tuple[Path, ...]:
        """The folder to mount read-only in the sandbox: the issue's files, and those of
        writers' comments read later in the job (jobs/loop/news.py)."""
        return () if self.folder is None else (self.folder,)

    def section(self, *, cli: bool = False) -> str:
        """The first prompt's part on the attachments; a CLI backend reads the files in
        the sandbox (the same path as on the worker: a read-only mount)."""
        folder = str(self.folder) if cli and self.folder is not None else None
        return text.section(self.fetched, self.texts, folder)


@dataclass
class Changed:
    """A file the writer approved reads differently now: an edit."""

    names: list[str]


def read(
    files: Attachments, gh: Installation, store: Store, record: LoopRecord, repo: str
) -> Given | Changed:
    """The attachments of ``record``'s approved text: fetched now for a new approval,
    else the recorded ones (downloaded again where this worker has none, and compared)."""
    key = record.key
    files.folder(key).mkdir(parents=True, exist_ok=True)  # mounted for a CLI backend
    if not record.approved_sha256:
        return Given(folder=files.folder(key))
    title, body, html = gh.issue_rendered(repo, record.issue)
    stored = Fetched.of(record.attachments)
    live = intake_hash(title, body) == record.approved_sha256
    if stored is not None and stored.approved == record.approved_sha256:
        if live and (changed := files.again(key, stored, html)):
            return Changed(changed)
        return _given(files, key, stored)
    if not live:  # edited since the approval: the turn's check stops the loop
        return Given(folder=files.folder(key))
    fetched = files.fetch(key, record.approved_sha256, html)
    record = store.update(key, lambda r: setattr(r, "attachments", fetched.as_json()))
    if fetched.files or fetched.skipped:
        store.event(
            key,
            "attachments",
            files=[
                {
                    "name": a.name,
                    "kind": a.kind,
                    "bytes": a.size,
                    "sha256": a.sha256,
                    "stored": a.stored,
                    "width": a.width,
                    "height": a.height,
                    "tokens": a.tokens,
                }
                for a in fetched.files
            ],
            skipped=[{"name": s.name, "reason": s.reason} for s in fetched.skipped],
        )
        for a in fetched.files:  # what the session log shows of each image
            if a.kind == "image":
                store.event(key, "attachment_thumbnail", name=a.name, src=files.thumbnail(key, a))
    if fetched.skipped:
        gh.upsert_comment(
            repo, record.issue, text.COMMENT_KEY, text.skipped_comment(fetched.skipped)
        )
    return _given(files, key, fetched)


def _given(files: Attachments, key: str, fetched: Fetched) -> Given:
    return Given(fetched, files.blocks(key, fetched), files.texts(key, fetched), files.folder(key))
