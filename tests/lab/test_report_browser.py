"""report.html in a real browser (headless Chromium): no horizontal overflow, every image loads, the overview
is on the first screen. Skips, saying why, where Chromium is not installed (`make test` installs it)."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab.analysis import report

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "tidy"
#: The first screen the checks assume: a laptop browser window.
WIDTH, HEIGHT = 1280, 900

#: Injected before </body>: opens every <details> (collapsed content must fit too), waits for the
#: images, measures, and writes the answer into the page for --dump-dom to return.
_PROBE = """<script>
window.addEventListener('load', () => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  const main = document.querySelector('main') || document.body;
  const wide = [...main.querySelectorAll('*')].filter(e => {
      const r = e.getBoundingClientRect(), m = main.getBoundingClientRect();
      return r.width > 0 && (r.right > m.right + 1 || r.left < m.left - 1) && !e.closest('.scroll');
  }).slice(0, 5).map(e => e.tagName + ': ' + (e.textContent || e.src || '').slice(0, 60));
  const imgs = [...document.images];
  const h2 = [...document.querySelectorAll('h2')].find(h => /overview/i.test(h.textContent));
  let t = h2 ? h2.nextElementSibling : null;
  while (t && t.tagName !== 'TABLE' && !t.querySelector('table')) t = t.nextElementSibling;
  if (t && t.tagName !== 'TABLE') t = t.querySelector('table');
  document.querySelectorAll('details').forEach(d => d.open = false);
  const r = t ? t.getBoundingClientRect() : null;
  const out = {
    main_overflow: main.scrollWidth - main.clientWidth,
    page_overflow: document.documentElement.scrollWidth - window.innerWidth,
    outside_main: wide,
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => (i.getAttribute('src') || '').slice(0, 80)),
    overview_top: r ? r.top + window.scrollY : null, overview_bottom: r ? r.bottom + window.scrollY : null,
    screen: window.innerHeight, h1: document.querySelectorAll('h1').length,
  };
  const pre = document.createElement('pre'); pre.id = 'pc-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    """The Chromium binary (Debian's `chromium`), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def probe(page: Path, tmp: Path) -> dict:
    """Load ``page`` (a copy beside it, so relative links resolve) in headless Chromium; the probe's answer."""
    copy = page.with_name(f".probe-{page.name}")
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", _PROBE + "</body>") if "</body>" in text else text + _PROBE,
                    encoding="utf-8")
    try:
        r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=15000",
                            f"--user-data-dir={tmp / 'chromium-profile'}", "--dump-dom", copy.as_uri()],
                           capture_output=True, text=True, timeout=180)
    finally:
        copy.unlink()
    m = re.search(r'<pre id="pc-probe">(.*?)</pre>', r.stdout, re.S)
    assert m, f"chromium gave no probe answer (rc {r.returncode}): {r.stderr[-1500:]}"
    return json.loads(html.unescape(m.group(1)))


def assert_reads_well(got: dict) -> None:
    """The three checks of a report page."""
    assert got["main_overflow"] <= 0 and got["page_overflow"] <= 0 and not got["outside_main"], \
        f"horizontal overflow: main {got['main_overflow']} px, page {got['page_overflow']} px, {got['outside_main']}"
    assert got["images"] >= 1 and not got["broken"], f"images that did not load: {got['broken']}"
    assert got["overview_top"] is not None, "no Overview table"
    assert got["overview_bottom"] <= got["screen"], \
        f"the overview table ends at {got['overview_bottom']:.0f} px, below the first screen ({got['screen']} px)"
    assert got["h1"] == 1, f"{got['h1']} top-level headings"


needs_chromium = pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed "
                                    "(Debian package `chromium`; `make setup` installs it): browser checks skipped")


@needs_chromium
@pytest.mark.parametrize("tidy, testbed", [(FIX, "fixture-2x-cx7"),
                                           (ROOT / "data" / "reference", "peercache-8xcx7-roce")])
def test_report_reads_well_in_a_browser(tmp_path, tidy, testbed):
    rep = report.build_report(tidy, tmp_path / "fig", testbed, FIX / "references.yaml")
    paths = report.write_report(rep, tmp_path / "reports" / testbed)
    assert_reads_well(probe(paths["html"], tmp_path))


@needs_chromium
def test_the_probe_catches_an_overflowing_page_and_a_broken_image(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><main style='max-width:40rem'><h1>x</h1><h2>Overview</h2>"
                   "<table><tr><td>" + "a" * 400 + "</td></tr></table><img src='missing.png'></main></body></html>")
    got = probe(bad, tmp_path)
    assert got["main_overflow"] > 0 and got["broken"] == ["missing.png"]
    with pytest.raises(AssertionError, match="horizontal overflow"):
        assert_reads_well(got)


if __name__ == "__main__":       # check any report page: python tests/lab/test_report_browser.py PAGE.html
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        result = probe(Path(sys.argv[1]).resolve(), Path(d))
    print(json.dumps(result, indent=1))
    assert_reads_well(result)
