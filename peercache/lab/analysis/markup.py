"""Text into Markdown and HTML: the one escaping rule of the lab's documents.

Everything a report or the collect notebook shows that came from a host (a capture's CPU model, a
NIC's firmware), a tool (a failed point's stderr) or a log is text, never markup. A CPU model of
``<img src=x onerror=...>`` must show as those characters in report.md, report.html and collect.html,
and run nowhere; a reason with a ``|`` must stay in its table cell, a ``*`` or a backtick must show.

- :func:`md_text` escapes a value for Markdown; every value goes through it on its way into a document
  (:func:`peercache.lab.analysis.format.markdown_table` calls it for every cell).
- What the lab composes as Markdown itself (a link, a code span, bold around an escaped value) is a
  :class:`Markdown`, made with :func:`md`, :func:`md_code` or :func:`md_code_block`; md_text leaves it
  as it is. Any str operation on a Markdown returns a plain str, which md_text escapes again: mixing
  in unescaped text fails safe (backslashes and asterisks show), never open.
- :func:`markdown_html` renders the lab's Markdown to HTML with raw HTML escaped too, so a value that
  ever got past md_text still shows as text (report.html); papermill_run configures nbconvert the same
  way for collect.html.
"""
from __future__ import annotations

import html
import re
from typing import Any, Iterable


class Markdown(str):
    """Markdown the lab composed from escaped values: :func:`md_text` passes it through unchanged."""

    __slots__ = ()


# CommonMark lets any ASCII punctuation be backslash-escaped, and an escaped character is always literal
# text. Escaped here: what opens code (`), emphasis (* and _), links and images ([ ]), raw HTML and
# autolinks (<), entities (&: "&lt;" must show as written, not as "<"), table cells (|), strikethrough
# (~), nbconvert's math ($), and the backslash itself. A "_" between two letters or digits opens nothing
# (CommonMark's intraword rule), so run ids like single_nic-peercache_p8 stay readable in report.md. A ">"
# closes nothing once "<" is escaped (and an escaped one ends nbconvert's bare URLs with a backslash).
# The ":" of "://" is escaped too: nbconvert links bare URLs, and its URL would swallow the backslash of
# an escaped "<" after it ("http://x/\<img ...>"), leaving the "<img" raw; a value's URL is text anyway.
_INLINE = re.compile(r"[\\`*\[\]<&|~$]|(?<![^\W_])_|_(?![^\W_])|:(?=//)")
# Only at the start of a line (a value that begins a list item or a paragraph): a heading (# : nbconvert
# takes "#word" for one too), a quote (>), a list item or a rule (- + = then a space, the end or more of
# them: "- x", "---"), a numbered item (1. or 1) then a space). "-3.2" is left as it is.
_LINE_START = re.compile(r"^(?:([#>])|([-+=])(?=[\s\-+=]|$)|(\d{1,9})([.)])(?=\s|$))")


def md_text(value: Any) -> str:
    """``value`` as Markdown that shows exactly its text; a :class:`Markdown` as it is.

    The result is one line: a line break (tool stderr has them) becomes a space, since a break ends a
    table row or a list item; whitespace at the ends, invisible in HTML and read as indentation by
    Markdown, is dropped.
    """
    if isinstance(value, Markdown):
        return value
    text = re.sub(r"\s*[\r\n]+\s*", " ", "" if value is None else str(value)).strip()
    text = _INLINE.sub(lambda m: "\\" + m.group(0), text)
    return _LINE_START.sub(lambda m: m.group(3) + "\\" + m.group(4) if m.group(3) else "\\" + m.group(0), text)


def md(template: str, *values: Any) -> Markdown:
    """``template`` (Markdown the lab wrote) with each ``{}`` filled by a value escaped by :func:`md_text`."""
    return Markdown(template.format(*(md_text(v) for v in values)))


def md_code(value: Any) -> Markdown:
    """``value`` as an inline code span, shown verbatim: the fence is longer than any backtick run in it.

    Not for table cells (GitHub splits a row at a ``|`` even inside code): use md_text there.
    """
    text = re.sub(r"[\r\n]+", " ", str(value))
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ")) else ""
    return Markdown(f"{fence}{pad}{text}{pad}{fence}")


def md_code_block(lines: Iterable[Any]) -> Markdown:
    """Lines as a fenced code block, shown verbatim: no line in it can close the fence (it is longer)."""
    body = "\n".join(str(l) for l in lines)
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", body)), default=0) + 1)
    return Markdown(f"{fence}\n{body}\n{fence}\n")


# The one raw HTML the report writes itself: a folded block, "<details><summary>TEXT</summary>" and
# "</details>" (GitHub renders them too). TEXT is escaped like any text; any other raw HTML is escaped.
_FOLD = re.compile(r"\s*(?:<details><summary>([^<>]*)</summary>|(</details>))\s*")


def markdown_html(markdown_text: str) -> str:
    """The lab's Markdown as an HTML fragment (GitHub tables), with raw HTML escaped: shown as text.

    mistune's ``escape=True`` is the defence behind md_text: were a value ever put in unescaped, its
    ``<script>`` would show as text, not run. Links to ``javascript:`` and the like become "#harmful-link".
    """
    # mistune comes with nbconvert, not declared by the lab itself: only report.html's rendering needs it
    import mistune

    class Renderer(mistune.HTMLRenderer):
        def block_html(self, text: str) -> str:
            m = _FOLD.fullmatch(text)
            if m is None:
                return super().block_html(text)
            return (f"<details><summary>{html.escape(html.unescape(m.group(1)))}</summary>\n"
                    if m.group(2) is None else "</details>\n")

    return mistune.create_markdown(renderer=Renderer(escape=True, allow_harmful_protocols=False),
                                   plugins=["table"])(markdown_text)
