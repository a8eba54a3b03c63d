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
- Raw HTML tags of elements GitHub's sanitizer drops (``<ignore-the-issue>``), and raw
  HTML tags' attributes but a link's or an image's address (``href``, ``src``): the
  sanitizer drops most (``data-*``, ``hidden``, words that are only names) and draws the
  rest nowhere (a ``title`` on an empty element, an ``alt`` of an image that loads). A
  tag with no end in its HTML block (an unclosed quoted value) reads on into what cmark
  renders after it, whole paragraphs, so everything after it goes too.
- A link whose text shows nothing (``[](<ignore the issue>)``): nothing to hover, so
  its address and title are drawn nowhere.
- Footnote definitions no ``[^label]`` refers to: GitHub renders footnotes and drops
  those, with their following lines.
- Math (``$…$``, ``$$…$$``, a ````` ```math ````` block) holding a TeX command that draws
  text nowhere (``\\phantom{…}``, ``\\color{transparent}``, a tooltip, a macro definition):
  GitHub draws math with MathJax; the whole span goes.
- Invisible characters, everywhere (code too), and outside code the character
  references that draw one (``&#xE0049;``, ``&ZeroWidthSpace;``): format characters
  (Unicode category Cf: zero-width spaces and joiners, bidi controls, tag characters,
  the soft hyphen, the BOM), variation selectors, Hangul fillers, control characters
  but tab and newline, and the unassigned rest of the tag block. Zero-width joiners go
  with them: an emoji sequence falls apart into its emoji, which loses no meaning for
  a coding task, and a kept joiner would be a channel.

The block structure (which lines are code, raw HTML, a paragraph or a definition) comes
from markdown-it-py, a CommonMark parser like cmark-gfm. Where the two could read a line
differently the rule takes out more, never less: a paragraph with a ``|`` (which GFM may
read as a table, whose cells split code spans) trusts no code span in it.

Not taken out, and said so in docs/repositories.md: what a reader reaches by hovering or
expanding (a Markdown link's address and title, a Markdown image's alt text,
``<details>``), and a raw tag's ``href`` and ``src``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from html import unescape as html_unescape
from urllib.parse import unquote

import cmarkgfm  # type: ignore[import-untyped]
from cmarkgfm.cmark import Options  # type: ignore[import-untyped]
from markdown_it import MarkdownIt

# Only the block structure is read (markdown-it's inline rules are slow on some hostile
# text and would say nothing used here); past its nesting limit (20) a line is in no
# block, so it goes as a definition would: more out, never less.
_PARSER = MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"])

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
# As GitHub renders: footnotes on (an indented line in a footnote is no code block).
_CMARK_OPTIONS = (
    Options.CMARK_OPT_UNSAFE | Options.CMARK_OPT_SOURCEPOS | Options.CMARK_OPT_FOOTNOTES
)
_PRE_AT = re.compile(r'<pre data-sourcepos="(\d+):\d+-(\d+):\d+"')
_TICKS = re.compile(r"`+")
_DECLARATION = re.compile(r"<![A-Z]+[ \t\n\v\f\r]")
_GT = re.compile(">")
_TAG_OPEN = re.compile(r"</?[A-Za-z]")
# Raw HTML other than a comment that may start inside one cmark refuses.
_INNER_RAW = re.compile(r"<\?|<!\[CDATA\[|<![A-Z]")
# A link destination's characters that matter, how far one is read, and a run of them.
_DEST_STOP = re.compile(r"\\.|[()\s]", re.S)
_DEST_CHARS = 2000
_RUN = re.compile(r"\S*")
# TeX commands (MathJax, as GitHub renders math) that draw their text nowhere, in a colour
# the page may share, off the line, only on hover, or that define what does.
_HIDING_TEX = re.compile(
    r"\\(?:[hv]?phantom|color|textcolor|colorbox|fcolorbox|bbox|style|class|cssId"
    r"|[lrc]lap|math[lrc]lap|smash|raise|lower|move(?:left|right)|[hm]?kern|[hm]?skip"
    r"|mskip|hspace|mspace|mathchoice|texttip|mathtip|toggle|href|unicode|require|def"
    r"|[re]?newcommand|let|html|data|renewenvironment|newenvironment|mmlToken)(?![A-Za-z])"
)
_MATH_FENCE = re.compile(r"[ \t>]*(?:`{3,}|~{3,})[ \t]*math\b")
# A character reference (numeric, or named; HTML5 reads some names without the ";").
_CHARREF = re.compile(r"&(?:#[0-9]{1,8};?|#[xX][0-9a-fA-F]{1,7};?|[A-Za-z][A-Za-z0-9]{1,31};?)")
# A footnote definition's first line, in quotes or list items too, and the ids cmark-gfm
# gives the definitions it shows.
_NOTE = re.compile(r"(?:[ \t]*>|[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t])*[ \t]*\[\^([^\]\s]+)\]:")
_NOTE_ID = re.compile(r'<li id="fn-([^"]*)"')
# Where an HTML5 parser starts a tag, and what it reads as space in one.
_TAG_START = re.compile(r"</?[A-Za-z][^\t\n\f\r />]*")
_HTML_SPACE = " \t\n\f\r"
# The attributes a reader reaches on GitHub's page: a link's and an image's address.
_SHOWN_ATTRIBUTES = frozenset({"href", "src"})
# The elements GitHub's sanitizer keeps (html-pipeline's SanitizationFilter allowlist).
_SHOWN_ELEMENTS = frozenset(
    [
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "h7",
        "h8",
        "br",
        "b",
        "i",
        "strong",
        "em",
        "a",
        "pre",
        "code",
        "img",
        "tt",
        "div",
        "ins",
        "del",
        "sup",
        "sub",
        "p",
        "ol",
        "ul",
        "table",
        "thead",
        "tbody",
        "tfoot",
        "blockquote",
        "dl",
        "dt",
        "dd",
        "kbd",
        "q",
        "samp",
        "var",
        "hr",
        "ruby",
        "rt",
        "rp",
        "li",
        "tr",
        "td",
        "th",
        "s",
        "strike",
        "summary",
        "details",
        "caption",
        "figure",
        "figcaption",
        "abbr",
        "bdo",
        "cite",
        "dfn",
        "mark",
        "small",
        "span",
        "time",
        "wbr",
    ]
)
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
    shown, comments, rest_hidden = _without_comments(text)
    if rest_hidden:
        # GitHub draws the footnotes after the whole page: what hides the rest of the
        # page hides every footnote too, wherever it was defined.
        shown, comments, _ = _without_comments(text, notes_hidden=True)
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


def _without_comments(text: str, *, notes_hidden: bool = False) -> tuple[str, int, bool]:
    lines = text.split("\n")
    code = _cmark_code_lines(text)
    kinds: list[str | None] = [None] * len(lines)
    blocks = [-1] * len(lines)  # which leaf block a line is in: each is read alone
    quoted: set[int] = set()  # the blocks inside a block quote (their lines start with ">")
    depth = 0
    removed = 0
    for n, token in enumerate(_PARSER.parse(text)):
        depth += {"blockquote_open": 1, "blockquote_close": -1}.get(token.type, 0)
        if depth:
            quoted.add(n)
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
            # Code only where cmark-gfm reads code too: a line markdown-it alone takes
            # for code is read as raw HTML (every comment out).
            kinds[i] = "html" if kind == "code" and i not in code else kind
            blocks[i] = n
    for i in _unreferenced_notes(text, lines, kinds, every=notes_hidden):
        kinds[i] = None  # said nowhere on the page: goes as a definition does
    # The line after the last comment end: an unended comment in a paragraph before it
    # may be one cmark ends there, if the two parsers end the paragraph apart.
    ends = max(text.rfind("-->"), text.rfind("--!>"))
    last_end = text.count("\n", 0, ends) if ends >= 0 else -1
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
            if kind == "code" and _MATH_FENCE.match(block) and _HIDING_TEX.search(block):
                # GitHub draws a ```math block as math: one that can hide goes whole.
                block = block.split("\n", 1)[0]
                removed += 1
            out.append(block)
        else:
            kept, n, rest_hidden = _strip_block(
                block, raw=kind == "html", quoted=blocks[i] in quoted, end_later=last_end >= j
            )
            out.append(kept)
            removed += n
            if rest_hidden:
                # An unended comment in raw HTML: the HTML5 parser reads the rest of the
                # page as comment, code blocks and all. (Or one in a paragraph with an end
                # further on, which cmark may read as one paragraph.)
                return "\n".join(out), removed, True
        i = j
    return "\n".join(out), removed, False


def _cmark_code_lines(text: str) -> set[int]:
    """The lines (from 0) of the code blocks cmark-gfm, GitHub's parser, reads in
    ``text``: its HTML says where each ``<pre>`` came from."""
    html = cmarkgfm.github_flavored_markdown_to_html(text, _CMARK_OPTIONS)
    lines: set[int] = set()
    for m in _PRE_AT.finditer(html):
        lines.update(range(int(m[1]) - 1, int(m[2])))
    return lines


def _unreferenced_notes(
    text: str, lines: list[str], kinds: list[str | None], *, every: bool = False
) -> set[int]:
    """The lines of the footnote definitions GitHub does not show: it renders footnotes
    (cmark-gfm's extension, which markdown-it does not read) and drops a definition no
    ``[^label]`` refers to, or any of a label defined twice, with its lazy and indented lines.
    ``every``: all of them. Any with raw HTML goes too (the two parsers read it apart).
    A label is matched as cmark-gfm wrote it into the page, without case; one written
    otherwise goes too."""
    starts = [
        (i, m[1]) for i, line in enumerate(lines) if kinds[i] != "code" and (m := _NOTE.match(line))
    ]
    if not starts:
        return set()
    html = cmarkgfm.github_flavored_markdown_to_html(text, _CMARK_OPTIONS)
    shown = {unquote(html_unescape(label)).casefold() for label in _NOTE_ID.findall(html)}
    hidden: set[int] = set()
    labels = Counter(label.casefold() for _, label in starts)
    for i, label in starts:
        note = {i}
        j = i + 1
        # To the next definition at most (it starts a footnote of its own): each line is
        # read once, however many definitions a body holds.
        while j < len(lines) and kinds[j] != "code" and not _NOTE.match(lines[j]):
            if not lines[j].strip(" \t>"):
                # A blank line ends it unless an indented line (its next block) follows.
                k = j
                while k < len(lines) and not lines[k].strip(" \t>"):
                    k += 1
                if k == len(lines) or not lines[k].expandtabs(4).startswith("    "):
                    break
                j = k
            note.add(j)
            j += 1
        # A definition's lines are blocks of the footnote to cmark, none to markdown-it:
        # raw HTML in one (an unended comment) is not read as cmark reads it, so a
        # definition with a "<" goes whole (more out, never less).
        raw = any("<" in lines[n] for n in note)
        # A label defined twice: cmark-gfm shows one of them (the first, or a nested
        # later one): all go.
        if every or raw or label.casefold() not in shown or labels[label.casefold()] > 1:
            hidden |= note
    return hidden


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


def _strip_block(
    block: str, *, raw: bool, quoted: bool, end_later: bool = False
) -> tuple[str, int, bool]:
    """``block`` without its comments; how many; whether the last one never ends and
    hides the rest of the page. ``raw``: an HTML block (no code spans in it, and an
    unended comment hides all after it); otherwise inline Markdown."""
    trust_code = not raw and "|" not in block
    last: dict[str, int] = {}  # where each closer last appears in ``block``
    out: list[str] = []
    removed = 0
    i = 0
    n = len(block)
    hide_until = 0
    while i < n:
        c = block[i]
        if not raw and c == "\\" and i + 1 < n:
            out.append(block[i : i + 2])  # an escaped character is shown as itself
            i += 2
            continue
        if c == "&" and (ref := _CHARREF.match(block, i)):
            # A character reference GitHub draws as an invisible character (tag
            # characters written "&#xE0049;", "&ZeroWidthSpace;"): the reader sees
            # nothing, a model reads it back. It becomes that character, which
            # ``without_invisible`` then takes out and counts.
            drawn = html_unescape(ref.group())
            if drawn != ref.group() and all(_invisible(ch) for ch in drawn):
                out.append(drawn if i >= hide_until else "")
                i = ref.end()
                continue
        if c == "$" and (math := _hiding_math(block, i)) is not None:
            # Math GitHub draws with MathJax, holding a command that draws text nowhere
            # (``\phantom{…}``, a transparent ``\color``, a tooltip): the span goes.
            removed += 1
            i = math
            continue
        if not raw and c == "[" and (link := _empty_link(block, i)) is not None:
            # A link with no text to show: nothing to hover, its address and title are
            # drawn nowhere ("[](<ignore the issue …>)").
            removed += 1
            i = link
            continue
        if trust_code and c == "`":
            run = len(_TICKS.match(block, i).group())  # type: ignore[union-attr]
            close = _closing_run(block, i + run, run)
            if close is not None and not _tag_across(block, i + run, close):
                out.append(block[i:close])
                i = close
                continue
            out.append(block[i : i + run])
            i += run
            continue
        if c == "<" and not raw:
            if (
                end_later
                and block.startswith("<!--", i)
                and _inline_raw_end(block, i, last, quoted) is None
            ):
                return "".join(out), removed + 1, True
            if m := _TAG.match(block, i):
                # A whole tag (CommonMark's grammar): the HTML5 parser ends it where
                # cmark does; its attributes but an address are never shown.
                kept, _, hid = _read_tag(m.group(), 0, quoted) or ("", 0, 1)
                out.append(kept)
                removed += hid
                i = m.end()
                continue
            if m := _AUTOLINK.match(block, i):
                out.append(m.group())
                i = m.end()
                continue
            if (end := _inline_raw_end(block, i, last, quoted)) is not None:
                # cmark passes this through as raw HTML: the browser reads it as such.
                # cmark may end it at a later "-->" than this, over a code span that
                # seems to follow: no code span after it is trusted.
                trust_code = False
                kept, hid, rest_hidden = _strip_block(block[i:end], raw=True, quoted=quoted)
                out.append(kept)
                removed += hid
                if rest_hidden:
                    return "".join(out), removed, True
                i = end
                continue
        if c == "<" and raw and _TAG_START.match(block, i):
            # A tag as an HTML5 parser reads it: its attributes are never shown.
            read = _read_tag(block, i, quoted)
            if read is None:
                # It does not end in this block: the browser reads on into what cmark
                # renders after it (an unclosed quote takes whole paragraphs into a
                # value), so the rest of the page may be hidden.
                return "".join(out), removed + 1, True
            kept, end, hid = read
            if block.find("<!--", i + 1, end) >= 0:
                # cmark may have shown this "<" as text (in a paragraph's raw run): then
                # a comment starts inside, and the two readings part ways for the rest
                # (one reads a comment to its end, the other tags past it): the rest of
                # the page goes, as with an unended comment.
                return "".join(out), removed + 1, True
            if i >= hide_until:
                out.append(kept)
            removed += hid
            i = end
            continue
        if c == "<" and raw and (start := _COMMENT_START.match(block, i)):
            ends = _comment_end(block, i, start.group(), quoted)
            if ends is None:
                return "".join(out), removed + 1, True
            removed += 1
            # A bogus comment in a quote ends at the first ">" or, when that was the
            # quote's marker, at a later one: all up to the later one goes, and what
            # follows the first is still read for a comment that starts there.
            early, late = ends
            hide_until = max(hide_until, late)
            # A "<!--" inside a bogus comment may be a real one's start (when cmark
            # showed the bogus one's "<" as text): the two readings part ways from
            # there (one reads that comment to its end, the other the tags after the
            # bogus one's end), so the rest goes, as with an unended comment.
            if start.group() != "<!--" and block.find("<!--", i + 1, early) >= 0:
                return "".join(out), removed, True
            i = early
            continue
        if i >= hide_until:
            out.append(c)
        i += 1
    return "".join(out), removed, False


def _read_tag(block: str, i: int, quoted: bool) -> tuple[str, int, int] | None:
    """The tag that starts at ``i`` read as an HTML5 tokenizer reads it: what of it is
    kept (its name and the attributes a reader can reach), where it ends, and how many
    attributes were taken out; None when it does not end in ``block``.

    GitHub's sanitizer drops most attributes (``data-*``, ``style``, ``hidden``, words
    that are only attribute names) and what it keeps is drawn nowhere on the page
    (``title`` on an element with nothing to hover, ``alt`` of an image that loads,
    ``aria-label``): only a link's or an image's address is kept, as a Markdown link's
    is. In a ``quoted`` block a ``>`` that may be the quote's marker does not end the
    tag: the tag read longer takes out more."""
    m = _TAG_START.match(block, i)
    if m is None:
        return None
    # An element the sanitizer does not allow is dropped, its tags with it: a made-up
    # name (``<ignore-the-issue-and-…>``) is drawn nowhere.
    allowed = m.group().lstrip("</").lower() in _SHOWN_ELEMENTS
    kept = [m.group()]
    removed = 0 if allowed else 1
    j = m.end()
    n = len(block)
    while True:
        while j < n and (block[j] in _HTML_SPACE or block[j] == "/"):
            j += 1
        if j >= n:
            return None
        if block[j] == ">" and not _marker(block, j, quoted):
            kept.append(">")
            return ("".join(kept) if allowed else ""), j + 1, removed
        start = j
        j += 1  # the first character of a name may be "=" or a marker ">"
        while j < n and block[j] not in _HTML_SPACE and block[j] not in "/>=":
            j += 1
        name = block[start:j].lower()
        while j < n and block[j] in _HTML_SPACE:
            j += 1
        if j < n and block[j] == "=":
            j += 1
            while j < n and block[j] in _HTML_SPACE:
                j += 1
            if j < n and block[j] in "\"'":
                close = block.find(block[j], j + 1)
                if close < 0:
                    return None
                j = close + 1
            else:
                while (
                    j < n
                    and block[j] not in _HTML_SPACE
                    and (block[j] != ">" or _marker(block, j, quoted))
                ):
                    j += 1
        if name in _SHOWN_ATTRIBUTES and allowed:
            kept.append(" " + block[start:j].strip(_HTML_SPACE))
        else:
            removed += 1


def _marker(block: str, at: int, quoted: bool) -> bool:
    """Whether the ``>`` at ``at`` may be a block quote's marker (cmark takes those off
    before the browser reads the HTML)."""
    return quoted and not block[block.rfind("\n", 0, at) + 1 : at].strip(" >")


def _empty_link(block: str, i: int) -> int | None:
    """Where the inline link at ``i`` ends when its text shows nothing (empty, spaces or
    invisible characters), or None (not such a link; or one read otherwise, which cmark
    then shows as text)."""
    j = i + 1
    while j < len(block) and block[j] != "]":
        if not (block[j].isspace() or _invisible(block[j])):
            return None
        j += 1
    if not block.startswith("](", j):
        return None
    j += 2
    n = len(block)
    while j < n and block[j] in " \t\n":
        j += 1
    if j < n and block[j] == "<":
        close = block.find(">", j)
        if close < 0 or "\n" in block[j:close]:
            return None
        j = close + 1
    else:
        # Only parentheses, backslashes and spaces are looked at (the regex skips the
        # rest); cmark nests at most 32 parentheses (deeper, it reads no link: text).
        # Past _DEST_CHARS the destination's whole run goes: more out, and no scan of
        # a hostile body grows with its length for every "[" in it.
        start, depth = j, 0
        for m in _DEST_STOP.finditer(block, j):
            j = m.start()
            if j - start > _DEST_CHARS:
                return _RUN.match(block, start).end()  # type: ignore[union-attr]
            ch = m.group()
            if len(ch) == 2:
                continue  # an escaped character
            if ch == "(":
                depth += 1
                if depth > 32:
                    return None
            elif ch == ")" and depth:
                depth -= 1
            else:
                break  # a space, or the ")" that ends the destination
        else:
            return None
    while j < n and block[j] in " \t\n":
        j += 1
    if j < n and block[j] in "\"'(":
        closer = ")" if block[j] == "(" else block[j]
        close = block.find(closer, j + 1)
        if close < 0:
            return None
        j = close + 1
        while j < n and block[j] in " \t\n":
            j += 1
    return j + 1 if j < n and block[j] == ")" else None


def _hiding_math(block: str, i: int) -> int | None:
    """Where the math span that starts at the ``$`` at ``i`` ends, when it holds a TeX
    command that can hide text; None otherwise. Any ``$`` to the next (``$$`` to the next
    ``$$``) is taken for a span: a looser reading than GitHub's takes out more."""
    opener = "$$" if block.startswith("$$", i) else "$"
    close = block.find(opener, i + len(opener))
    if close < 0:
        return None
    end = close + len(opener)
    return end if _HIDING_TEX.search(block, i, end) else None


def _inline_raw_end(block: str, i: int, last: dict[str, int], quoted: bool) -> int | None:
    """Where the raw HTML that cmark reads in a paragraph at ``i`` ends (a comment, a
    processing instruction, a declaration, CDATA), or None: then it is shown as text."""
    for opener, closer in (("<!--", "-->"), ("<![CDATA[", "]]>"), ("<?", "?>")):
        if block.startswith(opener, i):
            start = i + len(opener) - (2 if opener == "<!--" else 0)
            # The last closer, found once a block: many openers and no closer stay linear.
            if closer not in last:
                last[closer] = block.rfind(closer)
            if last[closer] < start:
                return None
            # To the last closer, not the first: cmark's scanner may take a longer run
            # than the browser's first end, and what lies between is raw HTML to the
            # browser (read as such below): reading more of it as raw takes out more.
            end = last[closer] + len(closer)
            if opener != "<!--":
                return end
            # cmark may refuse the comment (a "--" inside) and read raw HTML that starts
            # in it (a "<?…?>" ending further on): read on to where that could end too.
            at = i + 4
            while (inner := _INNER_RAW.search(block, at, end)) is not None:
                further = _inline_raw_end(block, inner.start(), last, quoted)
                at = inner.end()
                if further is not None and further > end:
                    end = further
            return end
    # A declaration as cmark-gfm reads one: capitals, then space. Reading one where cmark
    # does not would swallow the start of a real comment after it.
    if m := _DECLARATION.match(block, i):
        if ">" not in last:
            last[">"] = block.rfind(">")
        gt = _gt(block, m.end(), quoted) if last[">"] >= m.end() else None
        return gt + 1 if gt is not None else None
    return None


def _tag_across(block: str, start: int, close: int) -> bool:
    """Whether a raw HTML tag that starts between ``start`` and ``close`` (a code span's
    content and closing run) ends past it: cmark-gfm may read the tag, and the browser
    the span's closing backticks as part of an attribute; the span is not trusted."""
    for m in _TAG_OPEN.finditer(block, start, close):
        tag = _TAG.match(block, m.start())
        if tag is not None and tag.end() > close:
            return True
    return False


def _closing_run(block: str, start: int, run: int) -> int | None:
    """The index after the next run of exactly ``run`` backticks from ``start``."""
    for m in _TICKS.finditer(block, start):
        if len(m.group()) == run:
            return m.end()
    return None


def _comment_end(block: str, i: int, opener: str, quoted: bool) -> tuple[int, int] | None:
    """Where an HTML5 parser ends the comment that starts at ``i``, (earliest, latest):
    a real comment at the first ``-->`` or ``--!>`` (``<!-->`` and ``<!--->`` are whole
    ones), a bogus one at the first ``>`` (in a ``quoted`` block, a ``>`` that may be
    the quote's marker gives the earliest, the first that cannot the latest); None when
    it does not end in ``block``."""
    if opener == "<!--":
        m = _COMMENT_END.search(block, i + 2)
        return (m.end(), m.end()) if m else None
    late = _gt(block, i + 2, quoted)
    if late is None:
        return None
    early = block.find(">", i + 2)
    return early + 1, late + 1


def _gt(block: str, start: int, quoted: bool) -> int | None:
    """The first ``>`` from ``start`` that is not a block quote's marker at the start of
    a line (in a ``quoted`` block): cmark takes those off before the browser reads the
    HTML. Taking a ``>`` of the text for a marker ends the comment later: more out."""
    for m in _GT.finditer(block, start):
        at = m.start()
        if not quoted or block[block.rfind("\n", 0, at) + 1 : at].strip(" >"):
            return at
    return None
