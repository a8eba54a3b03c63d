"""The one defusing function, checked against GitHub's own Markdown renderer.

The oracle renders text with cmark-gfm (GitHub's fork of cmark: tables, footnotes,
autolinks, raw HTML), then reads each text node a person sees, outside ``pre``, ``code``,
``a``, ``style`` and ``script`` (the elements GitHub's mention filter skips), and looks
for what GitHub acts on: a ``@name``, an issue reference, a closing keyword before an
issue URL. A hit in loopbot's output is a failure. The hostile inputs include every
bypass a red team found in an earlier, Markdown-parsing version of this function.
"""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from typing import Any

import cmarkgfm
from cmarkgfm.cmark import Options
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from redis import Redis

from bot.core.record import Status
from bot.core.text.defuse import JOINER, code_span, safe_text
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, label, open_issue, sample_repo

_OPTIONS = Options.CMARK_OPT_UNSAFE | Options.CMARK_OPT_FOOTNOTES
_SKIPPED = {"pre", "code", "a", "style", "script"}
# html-pipeline's MentionFilter pattern, and issue references as GitHub links them.
_MENTION = re.compile(r"(?:^|\W)@[a-z0-9][a-z0-9-]*", re.I | re.A)
_REF = re.compile(r"(?:^|[^\w/])(?:[\w.-]+/[\w.-]+)?#\d+|\bGH-\d+", re.I | re.A)
_CLOSING_URL = re.compile(
    r"(?i)\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\b\W{0,20}(?:https?://|www\.)"
)


class _TextNodes(HTMLParser):
    """Each text node outside the skipped elements, with character references decoded."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.nodes: list[str] = []
        self.current: str | None = None
        self.linked: list[str] = []  # all text outside code, links included

    def _flush(self) -> None:
        if self.current is not None:
            self.nodes.append(self.current)
            self.current = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self._flush()
        if tag in _SKIPPED:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self._flush()
        if tag in self.open:
            while self.open and self.open.pop() != tag:
                pass

    def handle_comment(self, data: str) -> None:
        self._flush()

    def handle_data(self, data: str) -> None:
        if not self.open:
            self.current = (self.current or "") + data
        if not set(self.open) - {"a"}:
            self.linked.append(data)


def live(text: str) -> list[str]:
    """What in ``text``, as GitHub renders it, would ping someone or name an issue."""
    parser = _TextNodes()
    parser.feed(cmarkgfm.github_flavored_markdown_to_html(text, options=_OPTIONS))
    parser._flush()
    found = [hit for node in parser.nodes for hit in _MENTION.findall(node) + _REF.findall(node)]
    # Closing keywords are read across inline markup ("Fixes **https://…**").
    return found + _CLOSING_URL.findall("".join(parser.linked))


URL = "https://github.com/acme/widgets/issues/4"
HOSTILE = [
    "fixes #3 for @carol",
    f"Fixes: **#1**, #2 and o/r#3, {URL}",
    "closes acme/other#3",
    f"Resolves {URL}",
    "Fixes www.github.com/acme/widgets/issues/4",
    "`\n\n@team\n\n`",
    '<span title="`">@acme/security-team</span>`',
    "&#64;acme/sec and &commat;bob, &#x40;eve",
    "fixes &#35;12 and #&#x31;2 and GH-&#x31;2",
    "@&#x62;ob and @&#x61;cme/team",
    "unclosed ` @a",
    "```py\n@x\n```\n@z",
    "<details><summary>@sum</summary>\n\n@inside\n</details>",
    "| a | @b |\n|---|---|\n| fixes #5 | c |",
    "| a | b |\n|---|---|\n| `x | @bob` |",
    "> quoted @alice fixes #6",
    "- item @bob\n  - nested closes #7",
    "![@dave](https://y) and @erin",
    "\\@escaped and \\`@x\\`",
    "_@bob_ and __@acme/team__ and _a_@bob",
    "x <!-- ` -->@bob` and x <? ` ?>@bob`",
    'x <span title=">" data-x="`">@bob`',
    "\\<code>@bob</code>",
    "<div><code>x</code> @bob",
    "- a\n\n   ```\n@bob\n   ```",
    "~~~\n```\n~~~\n@bob\n```",
    "`\r\r@bob\r\r`",
    "x\r<div>`@bob`",
    "x [^1]\n\n[^1]: <div> `@bob`",
    "<div>\n&#x40guy\n</div>",
    "@a@a and #1@b and @a#1",
    "GH-13 and gh-14",
]


def test_hostile_texts_are_harmless_idempotent_and_read_the_same() -> None:
    for text in HOSTILE:
        once = safe_text(text)
        assert live(once) == [], (text, once)
        assert safe_text(once) == once, text
        assert once.replace(JOINER, "") == text, "only invisible joiners are added"
    assert all(live(t) for t in HOSTILE if "&#x40guy" not in t), [t for t in HOSTILE if not live(t)]


def test_ordinary_text_is_left_alone() -> None:
    for text in [
        "Fixed the parser; see the docs.",
        "a | b &amp; c &lt;d&gt;",
        "https://x.org/page#top",
        "price: $5 #hashtag",
    ]:
        assert safe_text(text) == text
    assert code_span(".github/`@acme/team`.md") == "``.github/`@acme/team`.md``"
    assert live(safe_text(code_span(".github/`@acme/team`.md"))) == []


def test_time_is_linear_on_adversarial_input() -> None:
    """Inputs that made the parsing version quadratic (tens of seconds at 100 KB)."""
    for text in [
        "\\`` " * 25000,
        "```x\n" * 20000,
        "<a>\n\n" * 8000 + "@b\n" * 30000,
        "https://a.b " * 4000 + "@b " * 15000,
        "fixes " * 20000 + URL,
    ]:
        started = time.perf_counter()
        safe_text(text)
        assert time.perf_counter() - started < 1.0, text[:40]


_PIECES = st.sampled_from(
    [
        "@a",
        "@o/t",
        "fixes",
        "closes:",
        " #1",
        "o/r#2",
        "`",
        "``",
        "```",
        "\n",
        "\n\n",
        " ",
        "<b>",
        "</b>",
        '<i x="`">',
        "&#64;",
        "&#x",
        "4",
        "0;",
        "**",
        "_",
        "x",
        "and",
        ",",
        "GH-3",
        "\\",
        ">",
        "- ",
        "|",
        "---",
        "\r",
        "https://github.com/o/r/issues/1",
        "www.",
    ]
)


@hsettings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_nothing_survives_defusing(text: str) -> None:
    once = safe_text(text)
    assert live(once) == [], (text, once)
    assert safe_text(once) == once


def test_every_text_posted_in_a_hostile_loop_is_defused(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A title, an agent summary and critic findings written to close other issues and
    ping a team: after the merge, no text loopbot posted anywhere holds a live one."""
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\nmax_turns: 3\n")
    other = open_issue(github)
    hostile = f"Fixes #{other}, closes acme/other#3 cc @acme/security-team"
    n = open_issue(github, title=f"Add numbers; resolves #{other} @writer")
    fix = m.replace("calc.py", "return a - b", "return a + b")
    finding = {
        "severity": "sev3",
        "category": "style",
        "path": "calc.py",
        "line": 2,
        "title": f"nit @acme/security-team fixes #{other}",
        "body": hostile,
    }
    model.play(
        fix,
        m.text(f"Done. {hostile}\n\n| a | b |\n|---|---|\n| `x | @acme/security-team` |"),
        m.structured({"verdict": "approve", "summary": hostile, "findings": [finding]}),
    )
    label(github, "writer", n)
    drain()
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == Status.COMPLETED, record
    repo = github.repo(REPO)
    assert repo.issues[n].state == "closed" and repo.issues[other].state == "open"
    pr = repo.issues[record.pr_number]
    texts = {"pr title": pr.title, "pr body": pr.body}
    texts |= {f"comment {i}": c["body"] for i, c in repo.comments.items()}
    for number, reviews in repo.reviews.items():
        texts |= {f"review {number}.{k}": r.get("body") or "" for k, r in enumerate(reviews)}
    for number, comments in repo.review_comments.items():
        texts |= {f"review comment {number}.{k}": c["body"] for k, c in enumerate(comments)}
    for i, run in repo.check_runs.items():
        output = run.get("output") or {}
        for field in ("title", "summary", "text"):
            texts[f"check run {i} {field}"] = output.get(field) or ""
        for k, a in enumerate(output.get("annotations") or []):
            texts[f"check run {i} annotation {k}"] = f"{a.get('title')}\n{a.get('message')}"
    texts["squash commit"] = gitrepo.git(repo.path, "log", "-1", "--format=%B", "main")
    assert any("security-team" in t for t in texts.values())  # the hostile text got there
    bad = {where: live(t) for where, t in texts.items() if live(t)}
    # The pull request and the squash commit close the loop's own issue, on purpose, and
    # the squash title ends with its pull request's number, as GitHub's own squash does.
    own = [f" #{n}"]
    assert bad == {"pr body": own, "squash commit": [f"(#{record.pr_number}", *own]}, bad
