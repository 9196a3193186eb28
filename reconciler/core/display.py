"""Values from machines, made safe to show: numbers that can be drawn, text that renders as text.

Everything a job can produce (a loss, a message, a log line, an artifact's name) reaches the
ledger (``status/README.md``, ``status/<run>.svg``), the plan comment on a pull request and the
live page. None of it is trusted: a diverging run reports NaN or Infinity by itself, and a
hostile one can report 1e308, an integer of a thousand digits, a string where a number belongs,
control characters, markdown that renders a link or an image, or HTML. What is shown goes
through here, so one odd value can neither stop a status commit (an exception while drawing) nor
change what a reader sees beyond its own cell.

- ``finite``: a real, finite float, or None (NaN, ±Infinity, ints too large for a float,
  booleans, strings: anything a chart cannot place).
- ``number``: any value as short text: ``nan``, ``inf``, ``-inf``, ``>1e308``, ``1.235``.
- ``clean``: text without control characters (line breaks, escapes, NUL, bidi overrides, lone
  surrogates) and with runs of whitespace as one space, cut to a bound.
- ``md``: ``clean``, then every character markdown could act on backslash-escaped, and ``@``
  kept from mentioning anyone: for cells and list items of GitHub-flavoured markdown.
- ``html_text``: ``clean``, then ``html.escape`` (quotes included, so it is safe in attributes).
"""

from __future__ import annotations

import html
import math
import re
import unicodedata

from . import boundary

TEXT_LIMIT = 200

# Markdown acts on these wherever they stand (links, images, emphasis, code, strikethrough, math,
# raw HTML, entities, table cells, headings); a backslash before any ASCII punctuation makes it a
# literal character in CommonMark and GitHub's flavour alike.
_MD_SPECIAL = set("\\`*_{}[]()#!|~$")
# Raw HTML and entities: written as entities, which GitHub shows as the characters themselves.
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# "- x", "+ x" and "1. x" start a list when they open a line (a list item's text does).
_MD_LINE_START = re.compile(r"^(\d+(?=[.)])|(?=[-+]))")
# GitHub links "@name" to a user or team (and notifies them) in rendered text, escaped or not: a
# zero-width space after the "@" keeps the text as it reads and links no one.
_NO_MENTION = "@\u200b"


def finite(value) -> float | None:
    """``value`` as a finite float, or None when it is not a number a chart can place."""
    return boundary.finite(value, math.inf)


def number(value, digits: int = 4) -> str:
    """Any value as short text: finite numbers with ``digits`` significant digits; NaN, the
    infinities and ints beyond the float range by name; anything else as bounded clean text."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        if finite(value) is None:
            return ">1e308" if value > 0 else "<-1e308"
        return f"{value:.{digits}g}" if abs(value) >= 10 ** (digits + 6) else str(value)
    return clean(value, 40)


def clean(value, limit: int = TEXT_LIMIT) -> str:
    """``value`` as one line of printable text: control and format characters dropped, whitespace
    runs as one space, at most ``limit`` characters (an ellipsis says it was cut)."""
    if value is None:
        return ""
    try:
        text = value if isinstance(value, str) else str(value)
    except (ValueError, TypeError):  # e.g. an int with more digits than str() converts
        return "?"
    if len(text) > limit * 4 + 64:  # never scan megabytes to show a few hundred characters
        text = text[: limit * 4 + 64]
    if not text.isprintable():  # the common case, printable text, has nothing to drop
        # Whitespace becomes a space. Other characters of category C go: Cc, C0/C1 controls
        # (\r, \x1b, NUL); Cf, format (bidi overrides, zero-width); Cs, lone surrogates, which
        # cannot even be encoded; Co/Cn, private and unassigned.
        text = "".join(" " if ch.isspace() else ch for ch in text
                       if ch.isspace() or unicodedata.category(ch)[0] != "C")
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text


def md(value, limit: int = TEXT_LIMIT) -> str:
    """``value`` as literal text inside GitHub-flavoured markdown (a table cell, a list item)."""
    text = clean(value, limit)
    escaped = "".join("\\" + ch if ch in _MD_SPECIAL else _MD_ENTITIES.get(ch, ch) for ch in text)
    escaped = _MD_LINE_START.sub(lambda m: m.group(1) + "\\", escaped, count=1)
    return escaped.replace("@", _NO_MENTION)


def html_text(value, limit: int = TEXT_LIMIT) -> str:
    """``value`` as text inside HTML, an element's content or a quoted attribute's value."""
    return html.escape(clean(value, limit), quote=True)
