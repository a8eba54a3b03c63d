"""Text that loopbot posts to GitHub, made harmless: the one defusing function.

Whatever an issue talked a model into writing, and whatever a file or an issue title is
called, text loopbot posts must not notify people or teams, link or close issues, or
break out of the markup around it. ``safe_text`` does the first two, and
``bot.io.github.client.Installation`` runs every text it sends through it (comments, reviews and
their inline comments, pull request titles and bodies, squash titles and messages,
check run output), so no caller can forget. ``code_span`` and ``code_block`` show text
literally inside loopbot's own markup.

How: not by parsing Markdown (GitHub's renderer has tables, footnotes, seven kinds of
HTML block, entity decoding, lazy continuation lines; a parser that disagrees with it in
one corner is a bypass), but by making the few characters GitHub acts on inert wherever
they are. A WORD JOINER (U+2060, invisible, no line break) goes right after:

- an ``@`` followed by a letter or digit: GitHub's mention filter needs the name right
  after the ``@`` (``@alice``, ``@acme/team``, and so ``bob@example.com`` too);
- a ``#`` followed by a digit, and ``GH-`` followed by a digit: issue references
  (``#12``, ``owner/repo#12``, ``GH-12``), which GitHub links, cross-references and, after
  a closing keyword, closes;
- an ``&`` that starts a character reference (``&#64;``, ``&#x40;``, ``&commat;``): an
  entity would otherwise decode into an ``@`` or a ``#`` after this check;
- the first letter of a closing keyword (``fixes``) with a URL anywhere after it:
  GitHub also closes ``fixes https://github.com/o/r/issues/12``;
- the ``<!--`` of loopbot's own hidden marker (``<!-- loopbot:status -->``): loopbot finds
  the comments it edits by that marker, so quoted text carrying one would have another
  comment (the status comment) written into the one that quoted it.

In code spans and blocks the joiner is invisible too, so nothing shows; the cost is a
character that a copy of the text carries. The transformation is idempotent (a joined
``@`` is no longer followed by a letter) and linear in the text's length.
"""

from __future__ import annotations

import re

JOINER = "\u2060"

_MENTION = re.compile(r"@(?=[A-Za-z0-9])")
_REF = re.compile(r"(?i)(#|GH-)(?=[0-9])")
# Numeric references can spell any character; of the named ones only these two spell
# an @ or a #. Others (&amp; &lt;) stay as they are.
_ENTITY = re.compile(r"(?i)&(?=#|commat\b|num\b)")
_KEYWORD = re.compile(r"(?i)close[sd]?|fix(?:e[sd])?|resolve[sd]?")  # harsh: also inside words
_URL = re.compile(r"(?i)https?:|www\.")
_MARKER = re.compile(r"(?i)<!--(?=\s*loopbot\s*:)")


def _closing_keywords(text: str) -> str:
    """A joiner in every closing keyword that has a URL anywhere after it: GitHub's own
    reading of "fixes <issue URL>" is not documented closely enough to count on any
    distance, and the joiner costs nothing to a reader."""
    last_url = max((m.start() for m in _URL.finditer(text)), default=-1)
    return _KEYWORD.sub(
        lambda m: m.group()[0] + JOINER + m.group()[1:] if m.end() <= last_url else m.group(),
        text,
    )


def safe_text(text: str) -> str:
    """``text`` safe to post: it pings no one and names no issue GitHub would link or
    close. Looks the same to a reader. Idempotent."""
    text = _ENTITY.sub("&" + JOINER, text)
    text = _MENTION.sub("@" + JOINER, text)
    text = _REF.sub(lambda m: m.group(1) + JOINER, text)
    text = _MARKER.sub("<!--" + JOINER, text)
    return _closing_keywords(text)


def one_line(text: str) -> str:
    """A title: ``safe_text`` on one line."""
    return safe_text(" ".join(text.split()))


def code_span(text: str) -> str:
    """``text`` shown literally in one code span, whatever backticks it holds (a file
    name such as ``.github/`@acme/team`.md``)."""
    text = " ".join(text.splitlines())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str) -> str:
    """``text`` fenced so that nothing in it can close the fence early (test output, a
    diff, or an agent, may contain backticks): the fence is longer than any run inside."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"
