"""The seam module's documents (peercache.bench.document) against what serve, drive and the HiCache suite
really write with --out: the same keys, in the same order, with the same values."""
import json
import pathlib
import subprocess

import pytest

from conftest import BENCH, Procs, free_port
from peercache.bench import options
from peercache.bench.document import (DRIVE_READY_WORDS, SCHEMA_VERSION, DocumentError, DriveDocument, DriveMeta,
                                      DrivePoint, ServeDocument, SuiteDocument)
from peercache.bench.serve import READY_LINE

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "hicache_suite"

#: The keys drive's document has always had, in its order (as drive.py wrote them by hand before the seam).
DRIVE_KEYS = ["schema_version", "tool", "mode", "meta", "points", "status", "error"]
DRIVE_META_KEYS = [
    "host", "kernel", "machine", "cpu", "cpus", "command", "start", "end", "discovery_addr", "protocol",
    "directory", "devices", "layout", "objects_per_page", "page_size", "batch_size", "concurrencies",
    "processes", "working_set", "max_channels", "tcp_poll_us", "tcp_wire", "dir_cache_ttl", "duration",
    "warmup", "op", "verify", "integrity", "access", "gpu", "gpu_registration", "ib_port", "gid_index",
    "metrics", "metrics_scrapes", "versions", "git_revision"]
DRIVE_POINT_KEYS = [
    "concurrency", "processes", "threads", "batch_size", "page_size", "duration_s", "bytes", "batches",
    "gb_per_s", "pages_per_s", "objects_per_s", "latency_us", "latency_samples", "latency_batches", "hit_rate",
    "keys", "errors", "verify_failures", "redirected", "verified", "rails", "status", "reason",
    "window_start", "window_end"]
SERVE_KEYS = ["schema_version", "mode", "meta", "readers_done", "refused_ops", "data_server"]
SERVE_META_KEYS = ["host", "kernel", "machine", "cpu", "cpus", "command", "start", "end", "protocol", "layout",
                   "page_size", "objects", "integrity", "devices", "versions", "rails", "metrics", "git_revision"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """serve's and drive's --out documents of one short loopback run (tcp, 2 points)."""
    tmp = tmp_path_factory.mktemp("doc")
    addr = f"127.0.0.1:{free_port()}"
    small = ["--discovery-addr", addr, "--working-set", "32", "--page-size", "8192"]
    procs = Procs()     # the procs fixture's class, for one run the module's tests share
    try:
        serve = procs.start([*BENCH, "serve", *small, "--readers", "1", "--out", str(tmp / "serve.json")])
        procs.wait_line(serve, READY_LINE)
        r = subprocess.run([*BENCH, "drive", *small, "--batch-size", "4", "--concurrencies", "1,2",
                            "--duration", "0.5", "--warmup", "0.1", "--ready-timeout", "10",
                            "--out", str(tmp / "drive.json")], capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        assert serve.wait(timeout=20) == 0
    finally:
        procs.cleanup()
    return (json.loads((tmp / "drive.json").read_text()), json.loads((tmp / "serve.json").read_text()), r.stderr)


def _same(a, b) -> None:
    """Equal values and, in every object at every depth, the same keys in the same order."""
    assert json.dumps(a) == json.dumps(b)


def test_a_document_built_through_the_dataclasses_is_drives_real_document_key_for_key(real):
    doc = real[0]
    assert list(doc) == DRIVE_KEYS and list(doc["meta"]) == DRIVE_META_KEYS
    assert [list(p) for p in doc["points"]] == [DRIVE_POINT_KEYS] * 2
    built = DriveDocument(meta=DriveMeta(**doc["meta"]), points=[DrivePoint(**p) for p in doc["points"]],
                          status=doc["status"], error=doc["error"])
    _same(built.to_dict(), doc)
    _same(DriveDocument.from_dict(doc).to_dict(), doc)
    assert doc["schema_version"] == SCHEMA_VERSION == 1 and doc["tool"] == "peercache-bench"


def test_serves_real_document_reads_back_key_for_key(real):
    doc = real[1]
    assert list(doc) == SERVE_KEYS and list(doc["meta"]) == SERVE_META_KEYS
    _same(ServeDocument.from_dict(doc).to_dict(), doc)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("suite_*.json")))
def test_the_suites_real_documents_read_back_key_for_key(name):
    doc = json.loads((FIXTURES / name).read_text())
    _same(SuiteDocument.from_dict(doc).to_dict(), doc)


def test_a_hicache_drive_document_carries_its_read_path_last_in_meta(real):
    doc = json.loads(json.dumps(real[0]))
    doc["mode"] = "hicache-drive"
    doc["meta"]["read_path"] = "PeerCacheStore.batch_get_v1 into a page_first host KV pool"
    _same(DriveDocument.from_dict(doc).to_dict(), doc)
    assert "read_path" not in DriveDocument.from_dict(real[0]).to_dict()["meta"]


def test_drive_prints_the_seams_ready_words_and_options_still_names_them(real):
    assert options.DRIVE_READY_WORDS is DRIVE_READY_WORDS
    assert f"drive: 1 {DRIVE_READY_WORDS} 127.0.0.1:" in real[2]


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(schema_version=2), r"drive document of schema_version 2, but this peercache reads "
                                           r"schema_version 1: re-run the bench with a peercache-bench"),
    (lambda d: d.pop("schema_version"), r"schema_version None"),
    (lambda d: d.update(mode="serve"), r"mode 'serve': not a drive document"),
    (lambda d: d["meta"].pop("tcp_wire"), r"drive.meta: no 'tcp_wire'.*re-run"),
    (lambda d: d["points"][1].update(extra=1), r"drive.points\[1\]: unknown 'extra'"),
])
def test_from_dict_refuses_another_version_mode_or_fields_and_says_what_to_do(real, change, match):
    doc = json.loads(json.dumps(real[0]))
    change(doc)
    with pytest.raises(DocumentError, match=match):
        DriveDocument.from_dict(doc)
