"""The bench's cluster flags, checked before anything starts: serve --join, --key-prefix, --access zipf
--zipf-s; the keys --key-prefix makes; the Zipf draws of --access zipf."""
import subprocess

import numpy as np
import pytest

from conftest import BENCH
from peercache.bench import options
from peercache.bench.cli import build_parser
from peercache.bench.drive import DriveConfig, Worker
from peercache.bench.drive.access import ZipfPages, zipf_probabilities
from peercache.errors import ConfigError


def _validate(mode: str, *argv: str):
    args = build_parser().parse_args([mode, *argv])
    options.validate(args, mode)
    return args


@pytest.mark.parametrize("argv, match", [
    # a directory on another host: its address is not one serve can bind its data server to
    (["--join", "--readers", "0", "--discovery-addr", "10.1.2.3:31998"], r"--join: the directory at 10\.1\.2\.3:31998 "
                                                                         r"is another host's.*give --bind"),
    (["--join", "--readers", "0", "--directory", "10.1.2.3:31998"], r"give --bind"),
    # the drivers' reader_done goes to the directory's host, not to serve
    (["--join", "--discovery-addr", "127.0.0.1:31998"], r"--join with --readers 1: .*give --readers 0"),
    (["--join", "--readers", "2", "--bind", "10.0.0.2", "--discovery-addr", "10.1.2.3:31998"],
     r"--join with --readers 2"),
    (["--join", "--readers", "0", "--directory", "redis://127.0.0.1:6379/0"], r"Redis --directory.*drop --join"),
    (["--key-prefix", "pA,pB"], r"serve publishes one working set under one prefix.*names 2"),
])
def test_serve_refuses_join_and_prefix_misuse_saying_what_to_give(argv, match):
    with pytest.raises(ConfigError, match=match):
        _validate("serve", *argv)


def test_serve_join_accepts_a_loopback_directory_or_a_bind():
    args = _validate("serve", "--join", "--readers", "0", "--discovery-addr", "127.0.0.1:31998")
    assert args.join and args.bind is None
    _validate("serve", "--join", "--readers", "0", "--bind", "10.0.0.2", "--discovery-addr", "10.1.2.3:31998")
    _validate("serve", "--readers", "3", "--discovery-addr", "10.1.2.3:31998")    # without --join: as before


@pytest.mark.parametrize("prefixes, match", [
    ("p A", r"'p A' is not a key prefix"),
    ("pA/x", r"'pA/x' is not a key prefix"),
    ("pA,,pB", r"'' is not a key prefix"),
    ("x" * 33, r"is not a key prefix: give 1 to 32"),
    ("pA,pB,pA", r"names 'pA' more than once"),
    (",".join(f"p{i}" for i in range(65)), r"names 65 prefixes; at most 64"),
])
def test_bad_key_prefixes_are_refused(prefixes, match):
    with pytest.raises(ConfigError, match=r"--key-prefix.*" + match):
        _validate("drive", "--key-prefix", prefixes)
    if "," not in prefixes:
        with pytest.raises(ConfigError, match=match):
            _validate("serve", "--key-prefix", prefixes)


@pytest.mark.parametrize("argv, match", [
    (["--access", "zipf", "--zipf-s", "0"], r"--zipf-s must be a Zipf exponent S with 0 < S"),
    (["--access", "zipf", "--zipf-s", "-1.2"], r"--zipf-s must be"),
    (["--access", "zipf", "--zipf-s", "nan"], r"--zipf-s must be"),
    (["--zipf-s", "1.2"], r"--zipf-s is the exponent of --access zipf, but --access is random"),
    # the union of two prefixes' working sets holds 2 x 8 pages: a batch of 17 would repeat one
    (["--key-prefix", "pA,pB", "--working-set", "8", "--batch-size", "17"],
     r"--batch-size 17 is larger than --working-set 8 x 2 --key-prefix's"),
])
def test_drive_refuses_bad_zipf_and_batches_beyond_the_union(argv, match):
    with pytest.raises(ConfigError, match=match):
        _validate("drive", *argv)


def test_drive_settings_of_the_cluster_flags():
    cfg = DriveConfig.from_args(_validate("drive", "--key-prefix", "pA,pB", "--working-set", "8", "--batch-size",
                                          "16", "--access", "zipf"), Worker)
    assert cfg.key_prefixes == ("pA", "pB") and cfg.pages == 16 and cfg.zipf_s == 1.0
    plain = DriveConfig.from_args(_validate("drive"), Worker)
    assert plain.key_prefixes == () and plain.pages == plain.working_set and plain.zipf_s is None


def test_the_cli_refuses_with_exit_2_and_names_the_flag():
    r = subprocess.run([*BENCH, "serve", "--join", "--discovery-addr", "127.0.0.1:1"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "invalid options: --join with --readers 1" in r.stderr, r.stderr


def test_page_keys_without_a_prefix_are_the_keys_of_every_earlier_run():
    assert options.page_keys(3, "mla") == [b"pc/0", b"pc/1", b"pc/2"]
    assert options.page_keys(2, "mha", "") == options.page_keys(2, "mha", ()) == \
        [b"pc/0/k", b"pc/0/v", b"pc/1/k", b"pc/1/v"]


def test_page_keys_under_prefixes_are_their_union_prefix_by_prefix():
    assert options.page_keys(2, "mla", "pA") == [b"pc/pA/0", b"pc/pA/1"]
    assert options.page_keys(2, "mha", ["pA", "pB"]) == [
        b"pc/pA/0/k", b"pc/pA/0/v", b"pc/pA/1/k", b"pc/pA/1/v",
        b"pc/pB/0/k", b"pc/pB/0/v", b"pc/pB/1/k", b"pc/pB/1/v"]
    # union page j is page j % n of prefix j // n, its objects at j * objects per page (drive's indexing)
    union = options.page_keys(5, "mha", ("a", "b", "c"))
    for j in range(15):
        assert union[2 * j] == options.page_keys(5, "mha", "abc"[j // 5])[2 * (j % 5)]


def test_zipf_hottest_page_is_drawn_as_often_as_the_finite_law_says():
    n, s, draws = 1000, 1.2, 200_000
    zipf = ZipfPages(n, s, seed=5)
    pages = zipf.draw(np.random.default_rng(11), (draws // 50, 50))     # blocks of batches, as drive draws
    assert pages.min() >= 0 and pages.max() < n
    counts = np.bincount(pages.reshape(-1), minlength=n)
    p1 = 1.0 / sum(r ** -s for r in range(1, n + 1))                    # 1/H(1000, 1.2) = 0.2306
    assert zipf_probabilities(n, s)[0] == pytest.approx(p1)
    # the hottest page: within 5 standard deviations (0.0047) of the analytic share; an unbounded Zipf
    # (numpy's zipf: 1/zeta(1.2) = 0.179) or a uniform draw (0.001) is far outside
    assert abs(counts[zipf.hottest(1)[0]] / draws - p1) < 5 * np.sqrt(p1 * (1 - p1) / draws)
    assert counts.argmax() == zipf.hottest(1)[0]
    # and the second page has 1/2^S of the first's share
    assert counts[zipf.hottest(2)[1]] / draws == pytest.approx(p1 / 2 ** s, abs=0.004)


def test_zipf_hot_pages_are_fixed_by_the_seed_and_spread_over_the_working_set():
    a, b, other = ZipfPages(1000, 1.2, seed=3), ZipfPages(1000, 1.2, seed=3), ZipfPages(1000, 1.2, seed=4)
    assert list(a.hottest(10)) == list(b.hottest(10))
    assert list(a.hottest(10)) != list(other.hottest(10))
    # two drivers' threads (their own random streams) with the same seed find the same hot pages
    da = np.bincount(a.draw(np.random.default_rng(1), (2000, 32)).reshape(-1), minlength=1000)
    db = np.bincount(b.draw(np.random.default_rng(2), (2000, 32)).reshape(-1), minlength=1000)
    assert set(np.argsort(-da)[:3]) == set(np.argsort(-db)[:3]) == set(a.hottest(3))
    # a permutation: every page has a rank, and the ten hottest are not one producer's (pages 0..499)
    assert sorted(a.order) == list(range(1000))
    assert 0 < np.count_nonzero(a.hottest(10) < 500) < 10
