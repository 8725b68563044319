"""Cluster testbeds for tests: a copy of the built-in local-cluster testbed on a bridge of its own, for tests
that open namespace hosts while another test file of the same run (another xdist worker) holds local-cluster's
``pcclu`` bridge; and the Soft-RoCE guest's cluster hosts (softroce-cluster.yaml's)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

LOCAL_CLUSTER = Path(__file__).resolve().parents[1] / "experiments" / "testbeds" / "local-cluster.yaml"


def local_cluster_copy(tmp_path: Path, tag: str, index: int, hosts: int | None = None, **fields) -> Path:
    """local-cluster.yaml with its hosts, bridge tag and 198.18.79.0/24 renamed to ``tag`` and
    198.18.<index>.0/24 (its first ``hosts`` hosts, ``fields`` set on top), written under ``tmp_path``."""
    text = LOCAL_CLUSTER.read_text().replace("pcclu", tag).replace("198.18.79.", f"198.18.{index}.")
    doc = yaml.safe_load(text.replace("index: 79", f"index: {index}"))
    if hosts is not None:
        doc["hosts"] = doc["hosts"][:hosts]
    doc.update(results=str(tmp_path / "results"), **fields)
    path = tmp_path / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def guest_hosts() -> list[tuple[str, str]]:
    """The Soft-RoCE guest's cluster hosts (device, address), or a skip (a failure where rdma is required)
    saying why."""
    spec = os.environ.get("PEERCACHE_CLUSTER_HOSTS", "")
    if not spec:
        why = ("no cluster hosts here: run it in the Soft-RoCE guest with --cluster-hosts 3 "
               "(`make test-rdma` does)")
        if os.environ.get("PEERCACHE_REQUIRE_RDMA"):
            pytest.fail(why)
        pytest.skip(why)
    return [tuple(h.split("@", 1)) for h in spec.split(",")]
