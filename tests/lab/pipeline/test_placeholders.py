"""Placeholders fail safely (issue 41, item 3): the example testbed's ``<placeholders>`` are refused one line
each, saying what to put there; they plan only when asked to; the ssh profile names no testbed."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from peercache.lab.pipeline import __main__ as cli
from peercache.lab.pipeline import experiments

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = "experiments/testbeds/roce-8x-cx7.yaml"
GOLDEN = ROOT / "tests" / "lab" / "point_names.txt"


def test_validate_refuses_the_example_one_line_per_placeholder_saying_what_to_put(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["validate", "--testbed", EXAMPLE]) == 2
    out, err = capsys.readouterr()
    assert out == ""                                          # no point listed for a testbed that cannot run
    lines = [l for l in err.splitlines() if "is a placeholder: put " in l]
    fields = [l.split("'")[1] for l in lines]
    assert fields == [f"hosts.{role}.{key}" for role in ("producer", "consumer") for key in ("host", "address",
                                                                                             "python")]
    assert "6 placeholder(s) left to fill in" in err
    host = next(l for l in lines if "hosts.producer.host" in l)
    assert "ssh:<...> is a placeholder: put the producer's ssh login (user@host[:port]" in host
    assert "put the interpreter with PeerCache on the consumer" in lines[-1]
    assert f"validate --testbed {EXAMPLE} --allow-placeholders" in err      # how to plan it anyway


def test_the_example_plans_its_points_when_placeholders_are_allowed(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["validate", "--testbed", EXAMPLE, "--allow-placeholders"]) == 0
    listed = [l.split(":")[0].replace("/", " ") for l in capsys.readouterr().out.splitlines()]
    golden = [l.split(" ", 1)[1] for l in GOLDEN.read_text().splitlines() if l.startswith("roce-8x-cx7 ")]
    assert listed == golden and len(listed) > 50
    # ... but never logs in to hosts it does not have
    assert cli.main(["validate", "--testbed", EXAMPLE, "--allow-placeholders", "--connect"]) == 2
    assert "fill the testbed's <placeholders> in" in capsys.readouterr().err


def test_the_one_placeholder_rule_finds_them_anywhere_and_nothing_else(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments/testbeds/local-cluster.yaml").read_text())
    assert experiments.placeholders(doc) == []                 # the shipped runnable testbeds hold none
    doc["hosts"][1]["address"] = "<host b's address>"
    doc["results"] = "data/raw/<your folder>"
    found = experiments.placeholders(doc)
    assert [(f, what) for f, _, what in found] == [("hosts.1.address", "host b's address"),
                                                    ("results", "your folder")]
    path = tmp_path / "tb.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_testbed(path)
    assert "field 'hosts.1.address': <...> is a placeholder: put host b's address" in str(e.value)
    assert "field 'results': data/raw/<...> is a placeholder: put your folder" in str(e.value)
    filled = experiments.fill_placeholders(doc)
    assert filled["hosts"][1]["address"] == "placeholder-1" and filled["results"] == "data/raw/placeholder-2"


def test_the_ssh_profile_names_no_testbed_and_says_how_to_give_one():
    prof = yaml.safe_load((ROOT / "profiles/ssh-testbed/config.yaml").read_text())
    assert "config" not in prof
    assert yaml.safe_load((ROOT / "profiles/ssh-testbed" / prof["configfile"]).read_text()) == {"testbed": None}
    for extra in ([], ["--config", "scenarios=experiments/scenarios.yaml"]):
        r = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/ssh-testbed", "-n", *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert "no testbed given (this profile names none)" in out and "--config testbed=" in out, out
        assert "wildcards:" not in out                         # nothing planned, not the local testbed either
