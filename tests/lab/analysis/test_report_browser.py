"""report.html in a real browser (headless Chromium): no horizontal overflow, every image loads, the overview
is on the first screen; and markup planted in a host's capture and a tool's stderr shows as text in report.html
and collect.html and runs in neither. Skips, saying why, where Chromium is not installed (`make test` installs
it)."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab.analysis import collect, papermill_run, report

ROOT = Path(__file__).resolve().parents[3]
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


#: Keeps Chromium on this machine: every host name fails to resolve (collect.html, from nbconvert, names
#: require.js and MathJax on a CDN), and no background fetches.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--no-first-run"]


def probe(page: Path, tmp: Path, script: str = _PROBE) -> dict:
    """Load ``page`` (a copy beside it, so relative links resolve) in headless Chromium with ``script``
    injected before </body>; the JSON the script wrote into <pre id="pc-probe">."""
    copy = page.with_name(f".probe-{page.name}")
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", script + "</body>") if "</body>" in text else text + script,
                    encoding="utf-8")
    try:
        r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            *OFFLINE, f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=15000",
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


# --- planted markup: text from hosts and tools shows as written and runs nowhere ---------------------------

TB = "fixture-2x-cx7"


def _planted(where: str) -> str:
    """An <img> whose onerror and a <script> that each add "PWNED:<where>" to the title, were they to run."""
    run = "document.title+=' PWNED:{}'"
    return f'<img src=x onerror="{run.format(where)}"> <script>{run.format(where + "-script")}</script>'


#: A capture's CPU model, a NIC's firmware (in the capture and in the runs' host blocks) and a failed point's
#: reason (a tool's stderr), each with markup and Markdown in it that must show as written. The URL checks
#: nbconvert's bare-URL links, which would swallow the escaping backslash before a "<".
CPU = "AMD EPYC 7313 " + _planted("cpu") + " *x* | `y` 1. # h"
FIRMWARE = "28.39.1002 " + _planted("firmware") + " _z_ &amp; $1$ [l](javascript:alert(1))"
STDERR = ("ib_read_bw: couldn't connect to node-a " + _planted("stderr") + " see http://node-a/"
          + _planted("stderr-url") + " ~~s~~ | <b>")
FAILED_RUN = "multi_rail-page131072_b32_t8-rep0"

#: Injected like _PROBE: the title (where a planted handler would have written), the page's text, its images.
_PLANTED_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  const out = {title: document.title, text: document.body.textContent.replace(/\\s+/g, ' '),
               images: [...document.images].map(i => (i.getAttribute('src') || '').slice(0, 40))};
  const pre = document.createElement('pre'); pre.id = 'pc-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500));
</script>"""


@pytest.fixture(scope="module")
def planted_pages(tmp_path_factory) -> dict[str, Path]:
    """report.html and collect.html of the fixture testbed with CPU, FIRMWARE and STDERR planted, each made
    the way the pipeline makes it: collect.html by the papermill-run collect notebook, report.html by
    write_report (what the report notebook calls) from the tidy tables that notebook wrote."""
    base = tmp_path_factory.mktemp("planted")
    rows, runs = collect.load_tidy(FIX / TB)
    failed = rows["run_id"] == FAILED_RUN
    rows.loc[failed, "status"], rows.loc[failed, "reason"], rows.loc[failed, "value"] = "failed", STDERR, None

    planted = lambda h: dict(h, cpu=dict(h["cpu"], model=CPU), nic=dict(h["nic"], firmware=FIRMWARE))  # noqa: E731
    runs["hosts"] = [json.dumps({role: planted(h) for role, h in json.loads(v).items()}) for v in runs["hosts"]]
    collect.write_raw_from_tidy(rows, runs, base / "raw", TB)
    caps = base / "captures"
    caps.mkdir()
    for role in ("producer", "consumer"):
        doc = json.loads((ROOT / "tests" / "fixtures" / "lab" / "hosts" / "local-netns" / f"{role}.json").read_text())
        doc["capture"]["cpu"]["model"] = CPU
        doc["capture"]["rdma"] = {"devices": [{"name": "mlx5_0", "hca_type": "MT4129", "fw_ver": FIRMWARE,
                                               "numa_node": 0}]}
        (caps / f"{role}.json").write_text(json.dumps(doc))
    _, collect_html = papermill_run.run_notebook(
        ROOT / "notebooks" / "collect.ipynb", base / "reports",
        dict(raw_dir=str(base / "raw"), tidy_dir=str(base / "tidy"), testbed=TB,
             references=str(FIX / "references.yaml")))
    rep = report.build_report(base / "tidy", base / "fig", TB, FIX / "references.yaml", captures_dir=caps)
    paths = report.write_report(rep, base / "reports" / TB)
    return {"report": paths["html"], "collect": collect_html}


@needs_chromium
@pytest.mark.parametrize("page, shown", [("report", [CPU, FIRMWARE, STDERR]), ("collect", [STDERR])])
def test_markup_from_hosts_and_tools_shows_as_text_and_runs_nowhere(planted_pages, tmp_path, page, shown):
    got = probe(planted_pages[page], tmp_path, _PLANTED_PROBE)
    assert "PWNED" not in got["title"], f"planted markup ran in {page}.html: the title became {got['title']!r}"
    missing = [s for s in shown if s not in got["text"]]
    assert not missing, f"{page}.html does not show these as written: {missing}"
    # the only images: report.html's embedded figures (collect.html has none); no planted <img> became one
    assert all(src.startswith("data:image/png;base64,") for src in got["images"]), got["images"]
    assert (len(got["images"]) >= 3) == (page == "report"), got["images"]


if __name__ == "__main__":       # check any report page: python tests/lab/analysis/test_report_browser.py PAGE.html
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        result = probe(Path(sys.argv[1]).resolve(), Path(d))
    print(json.dumps(result, indent=1))
    assert_reads_well(result)
