"""The one escaping rule (peercache/lab/analysis/markup.py): a value from a host, a tool or a log shows as
written in the lab's Markdown and HTML, through both renderers (mistune for report.html, nbconvert for
collect.html), in every place the documents put one; and report.html embeds only the report's own figures.
The browser check of whole pages is in test_report_browser.py."""
import html
import re

import pytest

from peercache.lab.analysis import markup, report
from peercache.lab.analysis.format import markdown_table

#: Text that is markup in Markdown or HTML, or both.
VALUES = ["<img src=x onerror=\"alert(1)\"> <script>alert(2)</script>", "a | b", "*bold* _em_ __s__ a__b__c",
          "`tick` ``two``", "&amp; &lt; &#60; &", "$x$ $$y$$", "[l](javascript:alert(1)) ![i](x.png)", "# heading",
          "- item", "+ x", "1. one", "3) three", "> quote", "a\\b \\*", "~~strike~~", "_lead trail_", "x_ y _z",
          "<http://a.b>", "http://x.y/<b>", "  --- ", "***", "===", "#hash", "\\", "a <!-- c --> b", "<details>",
          "[^1]", "\\<", "line one\n# line two\r\n- three"]
#: Where a document puts a value: a paragraph, a list item (notes), a note, a table cell, after a label.
PLACES = {"paragraph": "{}", "list item": "- {}", "note": "> **Note:** {}", "cell": "| a |\n|---|\n| {} |\n",
          "after a label": "hosts: {}"}


def _nbconvert(text: str) -> str:
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
    return MarkdownWithMath(renderer=IPythonRenderer(escape=False)).render(text)   # as nbconvert ships it


def _shown(page: str, place: str) -> str:
    """The text a browser shows for the value: tags dropped, entities decoded, the fixed words removed."""
    if place == "cell":
        page = page.split("<tbody>")[1]
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    return " ".join(text.replace("Note:", "", 1).replace("hosts:", "", 1).split())


@pytest.mark.parametrize("render", [markup.markdown_html, _nbconvert], ids=["mistune", "nbconvert"])
@pytest.mark.parametrize("place", PLACES)
def test_a_value_shows_as_written_and_is_never_markup(render, place):
    tags = lambda page: re.findall(r"<[^>]*>", page)   # noqa: E731
    plain = tags(render(PLACES[place].format("plain")))
    for value in VALUES:
        page = render(PLACES[place].format(markup.md_text(value)))
        assert _shown(page, place) == " ".join(value.split()), (value, page)
        assert tags(page) == plain, (value, page)     # the same elements as for a plain word: no markup


def test_markdown_the_lab_composed_passes_and_its_values_are_escaped():
    got = markup.md("**{}** (kernel {})", "<b>x</b>", markup.md_code("a ` b"))
    assert isinstance(got, markup.Markdown) and markup.md_text(got) is got
    assert got == "**\\<b>x\\</b>** (kernel ``a ` b``)"
    # a str operation drops the mark: mixed with plain text, the whole is escaped again (shows, never opens)
    assert markup.md_text(got + "!") == markup.md_text(str(got) + "!") != got + "!"
    block = markup.md_code_block(["ls", "echo ```", "cat <x>"])
    assert block.startswith("````\n") and block.endswith("\n````\n")
    assert "<pre><code>ls\necho ```\ncat &lt;x&gt;\n</code></pre>" in markup.markdown_html(block)


def test_the_reports_folded_blocks_stay_and_any_other_raw_html_is_escaped():
    page = markup.markdown_html("<details><summary>all 3 rows</summary>\n\n- a\n\n</details>\n\n"
                                "<div onclick=\"x()\">y</div>\n\ntext <b>z</b>\n")
    assert "<details><summary>all 3 rows</summary>" in page and "</details>" in page
    assert "&lt;div onclick" in page and "<div" not in page and "&lt;b&gt;z" in page


def test_a_table_cell_is_text():
    table = markdown_table([{"a|b": "<img src=x onerror=y>", "n": 1234567.0}])
    assert table.splitlines()[0] == "| a\\|b | n |" and "\\<img src=x onerror=y>" in table and "1.235e+06" in table


def test_the_html_embeds_only_the_reports_own_figures(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "own one.png").write_bytes(png)
    (tmp_path / "secret.png").write_bytes(png)
    text = ("![own](figs/own%20one.png)\n\n![other](secret.png)\n\n"
            + markup.md_text('<img src="secret.png">') + "\n")
    page = report.render_html(text, tmp_path, "t", figures=[tmp_path / "figs" / "own one.png"])
    assert page.count("data:image/png;base64,") == 1 and 'src="secret.png"' in page
    assert '&lt;img src="secret.png"&gt;' in page.replace("&quot;", '"')
    assert "data:image" not in report.render_html(text, tmp_path, "t")     # no figures named: none embedded
