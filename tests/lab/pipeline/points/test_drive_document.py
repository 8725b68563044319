"""The lab reads drive's and the HiCache suite's documents through the engine's seam
(peercache.bench.document) and refuses one of another schema version, saying what to re-run."""
import json
from pathlib import Path

import pytest

from peercache.bench.document import SCHEMA_VERSION, DocumentError
from peercache.lab.errors import ParseError
from peercache.lab.pipeline.points.peercache import read_drive_document
from peercache.lab.tools import hicache_suite as suite

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "lab"
#: drive documents the lab kept (real runs: rdma over Soft-RoCE, two rails)
DRIVES = sorted((FIX / "promscrape").glob("*/drive.json"))
SUITE = FIX / "hicache_suite" / "suite_netns_tcp_mla_s128K_b128_c1-2.json"


@pytest.mark.parametrize("path", DRIVES, ids=lambda p: p.parent.name)
def test_the_lab_reads_real_drive_documents_as_written(path):
    text = path.read_text()
    assert read_drive_document(text) == json.loads(text)


@pytest.mark.parametrize("mode", ["drive", "hicache-drive"])
def test_the_lab_refuses_a_drive_document_of_another_version_with_what_to_re_run(mode):
    doc = json.loads(DRIVES[0].read_text())
    doc["mode"], doc["schema_version"] = mode, SCHEMA_VERSION + 1
    with pytest.raises(DocumentError) as e:
        read_drive_document(json.dumps(doc))
    assert str(e.value) == (f"drive document of schema_version {SCHEMA_VERSION + 1}, but this peercache reads "
                            f"schema_version {SCHEMA_VERSION}: re-run the bench with a peercache-bench of the "
                            "lab's revision (or read the document with the lab of the revision that wrote it)")


def test_the_lab_refuses_a_drive_document_whose_fields_are_another_revisions():
    doc = json.loads(DRIVES[0].read_text())
    doc["points"][0]["gbps"] = doc["points"][0].pop("gb_per_s")
    with pytest.raises(DocumentError, match=r"drive.points\[0\]: no 'gb_per_s'; unknown 'gbps': .*re-run"):
        read_drive_document(json.dumps(doc))


def test_the_lab_refuses_a_suite_document_of_another_version_with_what_to_re_run():
    doc = json.loads(SUITE.read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ParseError, match=f"hicache suite document of schema_version {SCHEMA_VERSION + 1}, but "
                                         f"this peercache reads schema_version {SCHEMA_VERSION}: re-run the bench"):
        suite.parse_document(json.dumps(doc), source="suite.json")
