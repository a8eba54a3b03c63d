"""What a person reading an issue on GitHub can see, and nothing else (issue 37, item 10).

A writer approves an issue by reading it on GitHub's page, so the text that reaches a
prompt is the text that page shows. GitHub renders Markdown with cmark-gfm and passes raw
HTML through an HTML5 parser and a sanitizer; what neither shows is taken out here:

- HTML comments ``<!-- … -->`` and the other things an HTML5 parser reads as comments
  (``<? … >``, ``<!DOCTYPE …>``, ``<![CDATA[ … >``, ``</ 3 …>``): outside code. In
  a code block or a code span GitHub shows them as text, so they stay. In raw HTML (an
  HTML block) a comment with no end hides the rest of the page, wherever cmark put it,
  so everything after it goes too; in a paragraph cmark shows an unended one as text.
- Link reference definitions (``[x]: url "title"``, the ``[//]: # (…)`` comment trick):
  they render nothing. A link that uses one keeps its text, not its address.
- A code fence's info string past its first word, the language (```` ```py hidden ````):
  GitHub shows none of it, and colours the code by the language.
- Invisible characters, everywhere (code too): format characters (Unicode category Cf:
  zero-width spaces and joiners, bidi controls, tag characters, the soft hyphen, the
  BOM), variation selectors, Hangul fillers, control characters but tab and newline,
  and the unassigned rest of the tag block. Zero-width joiners go with them: an emoji
  sequence falls apart into its emoji, which loses no meaning for a coding task, and
  a kept joiner would be a channel.

The block structure (which lines are code, raw HTML, a paragraph or a definition) comes
from markdown-it-py, a CommonMark parser like cmark-gfm. Where the two could read a line
differently the rule takes out more, never less: a paragraph with a ``|`` (which GFM may
read as a table, whose cells split code spans) trusts no code span in it.

Not taken out, and said so in the README: what a reader reaches by hovering or
expanding (a link's address and title, an image's alt text, ``<details>``), and the
attributes of raw HTML tags, which the agent sees as written.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable("table")

# Leaf blocks whose lines GitHub shows: code as text, raw HTML parsed, the rest as inline
# Markdown. A line in none of them (and not blank) is a link reference definition.
_CODE = frozenset({"fence", "code_block"})
_HTML = "html_block"
_INLINE = frozenset({"paragraph_open", "heading_open", "table_open"})
_OTHER = frozenset({"hr"})

# CommonMark's raw HTML tags and autolinks: where one starts, a backtick in it opens no
# code span (they bind tighter than code spans).
_ATTR = r"""(?:\s+[A-Za-z_:][A-Za-z0-9_.:-]*(?:\s*=\s*(?:[^\s"'=<>`]+|'[^']*'|"[^"]*"))?)"""
_TAG = re.compile(rf"<[A-Za-z][A-Za-z0-9-]*{_ATTR}*\s*/?>|</[A-Za-z][A-Za-z0-9-]*\s*>")
_AUTOLINK = re.compile(
    r"<[A-Za-z][A-Za-z0-9.+-]{1,31}:[^\s<>]*>"
    r"|<[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*>"
)
# Where an HTML5 parser starts a comment (a real one, or a "bogus" one: <?, <!x, </3).
_COMMENT_START = re.compile(r"<!--|<[?!]|</[^A-Za-z>]")
_COMMENT_END = re.compile(r"--!?>")
_LANGUAGE = re.compile(r"[\w+#.-]{1,30}")


@dataclass(frozen=True)
class Visible:
    """``text`` as a reader sees it, and what was taken out: ``comments`` (HTML
    comments and the like, and link reference definitions) and ``chars`` (invisible
    characters)."""

    text: str
    comments: int = 0
    chars: int = 0

    @property
    def removed(self) -> bool:
        return bool(self.comments or self.chars)


def visible(markdown: str) -> Visible:
    """What GitHub's page shows of ``markdown`` (an issue's body, a comment), as Markdown
    source: hidden parts out, everything a reader sees kept as written."""
    text = markdown.replace("\r\n", "\n").replace("\r", "\n")
    shown, comments = _without_comments(text)
    plain, chars = without_invisible(shown)
    return Visible(plain, comments, chars)


def without_invisible(text: str) -> tuple[str, int]:
    """``text`` without the characters no reader sees, and how many there were."""
    kept = [c for c in text if not _invisible(c)]
    return "".join(kept), len(text) - len(kept)


def _invisible(c: str) -> bool:
    o = ord(c)
    if c in "\t\n":
        return False
    cat = unicodedata.category(c)
    return (
        cat in ("Cf", "Cc", "Cs")
        or 0xFE00 <= o <= 0xFE0F  # variation selectors
        or 0xE0000 <= o <= 0xE0FFF  # the tag block and its supplement's selectors
        or 0x180B <= o <= 0x180F  # Mongolian free variation selectors
        or o in (0x115F, 0x1160, 0x3164, 0xFFA0)  # Hangul fillers: letters that draw nothing
    )


def _without_comments(text: str) -> tuple[str, int]:
    lines = text.split("\n")
    kinds: list[str | None] = [None] * len(lines)
    blocks = [-1] * len(lines)  # which leaf block a line is in: each is read alone
    removed = 0
    for n, token in enumerate(_PARSER.parse(text)):
        if token.map is None:
            continue
        if token.type == "fence" and token.map[0] < len(lines):
            opening, hid = _fence_opening(lines[token.map[0]], token.markup, token.info)
            lines[token.map[0]] = opening
            removed += hid
        kind = (
            "code"
            if token.type in _CODE
            else "html"
            if token.type == _HTML
            else "inline"
            if token.type in _INLINE
            else "other"
            if token.type in _OTHER
            else None
        )
        if kind is None:
            continue
        start, end = token.map
        for i in range(start, min(end, len(lines))):
            kinds[i], blocks[i] = kind, n
    out: list[str] = []
    i = 0
    while i < len(lines):
        kind = kinds[i]
        j = i + 1
        # The lines of one leaf block are read together (a comment or a code span can
        # run over lines), and never with the next block's: a code span cannot.
        while j < len(lines) and kinds[j] == kind and blocks[j] == blocks[i]:
            j += 1
        block = "\n".join(lines[i:j])
        if kind is None:
            if _definition(block):
                removed += sum(1 for line in lines[i:j] if _definition(line))
                block = "\n".join(line for line in lines[i:j] if not _definition(line))
            out.append(block)
        elif kind in ("code", "other"):
            out.append(block)
        else:
            kept, n, rest_hidden = _strip_block(block, raw=kind == "html")
            out.append(kept)
            removed += n
            if rest_hidden:
                # An unended comment in raw HTML: the HTML5 parser reads the rest of the
                # page as comment, code blocks and all.
                return "\n".join(out), removed
        i = j
    return "\n".join(out), removed


def _fence_opening(line: str, markup: str, info: str) -> tuple[str, int]:
    """A fence's opening line with only the language of its info string: GitHub shows
    none of the info string, and uses its first word to colour the code. Anything past
    a plain language name is taken out (1), as a place to hide words."""
    words = info.split(None, 1)
    lang = words[0] if words and _LANGUAGE.fullmatch(words[0]) else ""
    if lang == info.strip():
        return line, 0
    at = line.find(markup)
    return line[: at + len(markup)] + lang, 1


def _definition(line: str) -> bool:
    """Whether a line outside every shown block says anything: a link reference
    definition's line (blank lines and bare ``>`` or list markers say nothing)."""
    return bool(line.strip(" \t>-*+0123456789.)"))


def _strip_block(block: str, *, raw: bool) -> tuple[str, int, bool]:
    """``block`` without its comments; how many; whether the last one never ends and
    hides the rest of the page. ``raw``: an HTML block (no code spans in it, and an
    unended comment hides all after it); otherwise inline Markdown."""
    trust_code = not raw and "|" not in block
    out: list[str] = []
    removed = 0
    i = 0
    n = len(block)
    while i < n:
        c = block[i]
        if not raw and c == "\\" and i + 1 < n:
            out.append(block[i : i + 2])  # an escaped character is shown as itself
            i += 2
            continue
        if trust_code and c == "`":
            run = len(block[i:]) - len(block[i:].lstrip("`"))
            close = _closing_run(block, i + run, run)
            if close is not None:
                out.append(block[i:close])
                i = close
                continue
            out.append(block[i : i + run])
            i += run
            continue
        if c == "<" and not raw:
            if m := _TAG.match(block, i) or _AUTOLINK.match(block, i):
                out.append(m.group())
                i = m.end()
                continue
            if (end := _inline_raw_end(block, i)) is not None:
                # cmark passes this through as raw HTML: the browser reads it as such.
                kept, hid, rest_hidden = _strip_block(block[i:end], raw=True)
                out.append(kept)
                removed += hid
                if rest_hidden:
                    return "".join(out), removed, True
                i = end
                continue
        if c == "<" and raw and (start := _COMMENT_START.match(block, i)):
            end = _comment_end(block, i, start.group())
            if end is None:
                return "".join(out), removed + 1, True
            removed += 1
            i = end
            continue
        out.append(c)
        i += 1
    return "".join(out), removed, False


def _inline_raw_end(block: str, i: int) -> int | None:
    """Where the raw HTML that cmark reads in a paragraph at ``i`` ends (a comment, a
    processing instruction, a declaration, CDATA), or None: then it is shown as text."""
    for opener, closer in (("<!--", "-->"), ("<![CDATA[", "]]>"), ("<?", "?>")):
        if block.startswith(opener, i):
            end = block.find(closer, i + len(opener) - (2 if opener == "<!--" else 0))
            return end + len(closer) if end >= 0 else None
    if re.match(r"<![A-Za-z]", block[i : i + 3]):
        gt = _gt(block, i)
        return gt + 1 if gt is not None else None
    return None


def _closing_run(block: str, start: int, run: int) -> int | None:
    """The index after the next run of exactly ``run`` backticks from ``start``."""
    for m in re.finditer(r"`+", block[start:]):
        if len(m.group()) == run:
            return start + m.end()
    return None


def _comment_end(block: str, i: int, opener: str) -> int | None:
    """Where an HTML5 parser ends the comment that starts at ``i``: a real comment at
    the first ``-->`` or ``--!>`` (``<!-->`` and ``<!--->`` are whole ones), a bogus one
    at the first ``>``; None when it does not end in ``block``."""
    if opener == "<!--":
        m = _COMMENT_END.search(block, i + 2)
        return m.end() if m else None
    gt = _gt(block, i + 2)
    return gt + 1 if gt is not None else None


def _gt(block: str, start: int) -> int | None:
    """The first ``>`` from ``start`` that is not a block quote's marker at the start of
    a line: cmark takes those off before the browser reads the HTML."""
    for m in re.finditer(">", block[start:]):
        at = start + m.start()
        if block[block.rfind("\n", 0, at) + 1 : at].strip(" >"):
            return at
    return None
