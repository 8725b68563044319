"""The lab's command line says what was wrong and what to do (issue 41, item 6): --scenarios takes scenario
names (--scenarios-file the file), a folder given as --testbed is one line, and a schema error says in words
what a field allows, never its regex."""
from pathlib import Path

import pytest
import yaml

from peercache.lab.pipeline import __main__ as cli
from peercache.lab.pipeline import experiments

ROOT = Path(__file__).resolve().parents[3]
LOCAL = "experiments/testbeds/local.yaml"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _listed(capsys) -> list[str]:
    return [line.split("/")[0] for line in capsys.readouterr().out.splitlines()]


def test_scenarios_takes_names_comma_separated_or_repeated(capsys):
    assert cli.main(["validate", "--testbed", LOCAL]) == 0
    every = _listed(capsys)
    assert {"single_nic", "engines", "multi_rail"} <= set(every)
    assert cli.main(["validate", "--testbed", LOCAL, "--scenarios", "engines,single_nic"]) == 0
    both = _listed(capsys)
    assert set(both) == {"single_nic", "engines"}
    assert both == [s for s in every if s in ("single_nic", "engines")]     # the testbed's order, all its points
    assert cli.main(["validate", "--testbed", LOCAL, "--scenarios", "single_nic", "--scenarios", "engines"]) == 0
    assert _listed(capsys) == both


def test_scenarios_file_is_its_own_flag(tmp_path, capsys):
    point = {"shm_limit": {"kind": "memcpy", "size": [65536]}}
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump({"single_nic": {"description": "one point", "rdma": point, "local": point}}))
    tb = yaml.safe_load((ROOT / LOCAL).read_text())
    tb["scenarios"] = ["single_nic"]
    (tmp_path / "tb.yaml").write_text(yaml.safe_dump(tb))
    assert cli.main(["validate", "--testbed", str(tmp_path / "tb.yaml"), "--scenarios-file", str(sc),
                     "--scenarios", "single_nic"]) == 0
    assert capsys.readouterr().out == "single_nic/memcpy_s64K: memcpy\n"


@pytest.mark.parametrize("names, expect", [
    # a scenario of the scenario file that this testbed does not run: how to add it, and what it runs
    ("cluster", ["'cluster' is a scenario, but testbed local does not run it",
                 "add it to the testbed's field 'scenarios'", "name one it runs: single_nic, "]),
    # no scenario at all: what the testbed runs, and every scenario there is
    ("single_nic,pingpong", ["'pingpong' is no scenario", "testbed local runs single_nic, ",
                             "(every scenario: single_nic, "]),
])
def test_a_scenario_name_the_testbed_does_not_run_is_one_line_naming_the_ones_it_does(capsys, names, expect):
    assert cli.main(["validate", "--testbed", LOCAL, "--scenarios", names]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    for part in expect:
        assert part in err, err


@pytest.mark.parametrize("cmd", ["validate", "preflight"])
@pytest.mark.parametrize("value, expect", [
    ("experiments/scenarios.yaml", "looks like a file, but --scenarios takes scenario names (e.g. "
                                   "single_nic,engines); give a scenario file with --scenarios-file"),
    ("single_nic,,engines", "give scenario names separated by commas, none empty"),
])
def test_a_file_or_an_empty_name_given_to_scenarios_says_what_it_takes(capsys, cmd, value, expect):
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, "--testbed", LOCAL, "--scenarios", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --scenarios" in err and expect in err, err


@pytest.mark.parametrize("cmd", ["validate", "preflight"])
def test_scenarios_has_help_saying_it_takes_names(capsys, cmd):
    with pytest.raises(SystemExit):
        cli.main([cmd, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--scenarios NAMES only these of the testbed's scenarios: names separated by commas, or the flag " \
           "repeated (e.g. --scenarios single_nic,engines)" in text
    assert "--scenarios-file FILE the scenario file the names refer to [experiments/scenarios.yaml]" in text
    assert "--testbed FILE the testbed definition, a YAML file (e.g. experiments/testbeds/local.yaml)" in text
    assert "testbeds live in" not in text


@pytest.mark.parametrize("argv", [
    ["validate", "--testbed", "experiments/testbeds"],
    ["preflight", "--testbed", "experiments/testbeds"],
    ["capture", "--testbed", "experiments/testbeds", "--role", "producer", "--out", "/nonexistent/x.json"],
])
def test_a_folder_given_as_the_testbed_is_one_line_naming_its_files(capsys, argv):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "IsADirectoryError" not in err
    assert "experiments/testbeds is a folder, not a testbed file; give one YAML file (it holds " in err, err
    assert "local.yaml" in err and "e.g. experiments/testbeds/" in err


def test_a_folder_given_as_the_scenario_file_is_one_line(capsys):
    assert cli.main(["validate", "--testbed", LOCAL, "--scenarios-file", "experiments"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "experiments is a folder, not a scenario file; give one YAML file" in err


def test_a_missing_scenario_file_points_to_the_scenario_file_not_the_testbeds(capsys):
    assert cli.main(["validate", "--testbed", LOCAL, "--scenarios-file", "nope.yaml"]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml: no such scenario file; the scenario file is " in err and "testbeds live" not in err, err


def _patterns(node, where="") -> list[tuple[str, dict]]:
    """Every subschema of ``node`` that has a pattern, with where it is."""
    out = []
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):          # the keyword, not a field named pattern
            out.append((where, node))
        for k, v in node.items():
            out += _patterns(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _patterns(v, f"{where}/{i}")
    return out


@pytest.mark.parametrize("schema", ["testbed", "scenarios"])
def test_every_pattern_of_the_schemas_says_in_words_what_it_allows(schema):
    s = experiments.testbed_schema() if schema == "testbed" else experiments.scenarios_schema()
    found = _patterns(s)
    assert len(found) >= (10 if schema == "testbed" else 2)
    missing = [where for where, sub in found if not sub.get("allowed")]
    assert not missing, f"patterns without an `allowed` beside them: {missing}"
    for where, sub in found:
        assert "^" not in sub["allowed"] and "(?!" not in sub["allowed"], where


@pytest.mark.parametrize("change, field, allowed", [
    ({"hosts": {"producer": {"host": "ssh:a b", "address": "10.0.0.1"},
                "consumer": {"host": "local", "address": "127.0.0.1"}}},
     "hosts.producer.host", "local, netns:<name> (A-Z a-z 0-9 _ . -) or ssh:[user@]host[:port] (no spaces)"),
    ({"hosts": {"producer": {"host": "local", "address": "10.0.0.1 x"},
                "consumer": {"host": "local", "address": "127.0.0.1"}}},
     "hosts.producer.address", "an IP address or host name, without spaces"),
    ({"name": "my testbed"}, "name", "1 to 64 of the characters A-Z a-z 0-9 _ . - (no spaces)"),
    ({"devices": ["mlx5 0"]}, "devices.0", "an RDMA device name: 1 to 64 of A-Z a-z 0-9 _ . : -"),
    ({"netns_pair": {"tag": "Pc", "index": 3}}, "netns_pair.tag", "1 to 8 lowercase letters or digits"),
])
def test_a_schema_error_names_the_field_and_what_it_allows_not_a_regex(tmp_path, change, field, allowed):
    tb = yaml.safe_load((ROOT / LOCAL).read_text())
    tb.update(change)
    path = tmp_path / "tb.yaml"
    path.write_text(yaml.safe_dump(tb))
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_testbed(path)
    msg = str(e.value)
    assert f"field '{field}': " in msg and f"is not allowed here; use {allowed}" in msg, msg
    assert "does not match" not in msg and "(?!" not in msg and "$" not in msg, msg


def test_a_scenario_name_error_says_what_a_name_may_be(tmp_path):
    point = {"p": {"kind": "memcpy", "size": [65536]}}
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump({"Single-NIC": {"description": "x", "rdma": point, "local": point}}))
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_scenarios(sc)
    msg = str(e.value)
    assert "'Single-NIC' is not allowed here; use a name of lowercase letters, digits and _, starting with a " \
           "letter" in msg and "does not match" not in msg, msg
