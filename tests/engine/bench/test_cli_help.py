"""serve --help and drive --help: everyday flags first, then RDMA's, the expert ones and (drive) the
lab-internal ones, each under its own named group; --readers 0 explained."""
import re

import pytest

from peercache.bench import options
from peercache.bench.cli import build_parser


def _help(mode: str) -> str:
    return build_parser()._subparsers._group_actions[0].choices[mode].format_help()


def _sections(text: str) -> dict[str, list[str]]:
    """Section title -> the flags listed under it, in the order --help shows them."""
    out: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            out[title] = []
        elif title is not None:
            m = re.match(r"  (--[a-z0-9-]+)", line)
            if m:
                out[title].append(m.group(1))
    return out


@pytest.mark.parametrize("mode, everyday, lab", [
    ("serve", ["--discovery-addr", "--page-size", "--working-set", "--readers", "--max-wait", "--out"], ["--trace"]),
    ("drive", ["--discovery-addr", "--page-size", "--batch-size", "--concurrencies", "--duration", "--out"],
     ["--start-at", "--start-file", "--time-scale", "--metrics-scrapes", "--timeline-ms", "--faults-expected"]),
])
def test_help_shows_everyday_flags_first_and_the_lab_ones_in_their_group(mode, everyday, lab):
    text = _help(mode)
    sections = _sections(text)
    titles = list(sections)
    assert titles[0] == "options", titles                      # argparse's own group, with -h: the everyday flags
    assert set(everyday) <= set(sections["options"]), sections["options"]
    assert any(t.startswith("RDMA devices") for t in titles) and any(t.startswith("expert") for t in titles)
    lab_titles = [t for t in titles if t.startswith("lab-internal")]
    if lab:
        assert len(lab_titles) == 1 and titles[-1] == lab_titles[0], titles
        assert set(sections[lab_titles[0]]) == set(lab)
        assert "set by the lab's runners" in lab_titles[0]
    else:
        assert not lab_titles, titles
    for flag in ("--start-file", "--time-scale", "--metrics-scrapes", "--devices", "--max-channels"):
        assert flag not in sections["options"], (mode, flag)
    # every flag once, in exactly one group; the usage line does not repeat them all
    shown = [f for fs in sections.values() for f in fs]
    assert len(shown) == len(set(shown)), shown
    assert text.splitlines()[0] == f"usage: peercache-bench {mode} [-h] [options]"


def test_serve_and_drive_still_take_every_shared_flag():
    for mode, table in (("serve", options.SERVE_HELP), ("drive", options.DRIVE_HELP)):
        names = [n for _, _, ns in table for n in ns]
        assert set(options.COMMON) <= set(names), (mode, set(options.COMMON) - set(names))
        flags = {f for fs in _sections(_help(mode)).values() for f in fs}
        assert {options.FLAGS[n].flag.name for n in names} == flags - {"--help"}


def test_readers_0_is_explained():
    text = " ".join(_help("serve").split())
    assert "--readers READERS drivers to wait for before exiting; 0: serve until interrupted (Ctrl-C, SIGTERM) " \
           "or --max-wait" in text


def test_grouped_flags_still_parse_as_before():
    a = build_parser().parse_args(["drive", "--start-file", "/tmp/x", "--time-scale", "2", "--gpu-device", "1",
                                   "--batch-size", "4"])
    assert (a.start_file, a.time_scale, a.gpu_device, a.batch_size, a.page_size) == ("/tmp/x", 2.0, 1, 4, None)
    a = build_parser().parse_args(["serve", "--readers", "0", "--devices", "mlx5_0", "--join"])
    assert (a.readers, a.devices, a.join, a.page_size) == (0, "mlx5_0", True, 131072)
