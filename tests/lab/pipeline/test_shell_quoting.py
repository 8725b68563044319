"""Nothing from a testbed reaches a shell as syntax: the pipeline runs with a space, `;`, `$(...)` and
a backtick in its paths and executes none of them; the testbed's `results` is kept to safe characters,
and a refusal says which in words; a host spec that ssh would read as an option is refused."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from peercache.lab.pipeline import experiments
from peercache.lab.pipeline.plan import Plan

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "tests/fixtures/pipeline/tiny.yaml"
#: Each piece would run `touch PWNED-...` in the job's folder if a rule left its path unquoted: the
#: command substitutions when the shell expands the rule's first command, the `;` one after it.
HOSTILE_DIR = "lab dir $(touch PWNED-subst) `touch PWNED-tick`;touch PWNED-semi;x"


def _testbed(**change) -> dict:
    doc = yaml.safe_load(TINY.read_text())
    doc.update(change)
    return doc


def test_the_pipeline_runs_with_shell_syntax_in_its_paths_and_runs_none_of_it(tmp_path):
    """One memcpy point through every rule (preflight, captures, the point, collect, charts, report).
    The checkout copy lives in a folder named with shell syntax, so every absolute path a rule is given
    (the testbed and scenario files, the raw, tidy, figure, capture and report folders) holds it, and
    the testbed's `results` holds a space (the schema keeps `;` and `$` out of the field itself)."""
    from conftest import pipeline_copy
    work = tmp_path / HOSTILE_DIR
    pipeline_copy(work)
    # one cheap point: the test is about what reaches the shell, not the measurement
    point = {"shm_limit": {"kind": "memcpy", "size": [65536]}}
    (work / "sc.yaml").write_text(yaml.safe_dump(
        {"single_nic": {"description": "one memcpy point", "rdma": point, "local": point}}))
    # a pair of its own (tag, index): the tiny run's pair may be up in another test at the same time
    tb = _testbed(name="quoted", results="data/raw/my run/quoted", scenarios=["single_nic"],
                  netns_pair={"tag": "pcquote", "index": 83},
                  hosts={"producer": {"host": "netns:pcquotea", "address": "198.18.83.1"},
                         "consumer": {"host": "netns:pcquoteb", "address": "198.18.83.2"}})
    (work / "tb.yaml").write_text(yaml.safe_dump(tb))
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--config",
                        f"testbed={work / 'tb.yaml'}", f"scenarios={work / 'sc.yaml'}"],
                       cwd=work, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    executed = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("PWNED*"))
    assert executed == [], f"a rule ran text from a path as a command: {executed}\n{out[-3000:]}"
    assert r.returncode == 0, out[-4000:]
    assert "unrecognized arguments" not in out
    result = work / "data/raw/my run/quoted/single_nic/memcpy_s64K/rep0/result.json"
    rows = json.loads(result.read_text())["rows"]
    assert rows and all(row["status"] == "ok" for row in rows), rows
    for f in ("data/raw/my run/quoted/testbed/preflight.json", "data/raw/my run/quoted/testbed/producer.json",
              "reports/quoted/report.html", "reports/quoted/collect.html", "figures/quoted/index.md"):
        assert (work / f).stat().st_size > 0, f


# Every field of every rule's shell command, by file: each must be quoted (`:q`), except a value that
# is already a whole shell command with each word quoted (the guest's, built by shlex.join).
ALREADY_A_COMMAND = {"params.cmd"}


def _shell_fields(text: str) -> list[str]:
    """The `{...}` fields of every `shell:` block of a Snakefile (the string lines under `shell:`)."""
    fields, in_shell = [], False
    for line in text.splitlines():
        s = line.strip()
        if s == "shell:":
            in_shell = True
        elif in_shell and s[:1] in "\"'":
            fields += re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", s)
        else:
            in_shell = False
    return fields


def test_every_field_of_every_shell_command_is_quoted():
    bare, seen = {}, 0
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        fields = _shell_fields(path.read_text())
        seen += len(fields)
        unquoted = [f for f in fields if not f.endswith(":q") and f not in ALREADY_A_COMMAND]
        if unquoted:
            bare[path.name] = unquoted
    assert seen >= 30, f"only {seen} shell fields found: the parser no longer reads the rules"
    assert bare == {}, f"shell fields without `:q`, by file: {bare}"


@pytest.mark.parametrize("results", [
    "data/raw/x;touch /tmp/PWNED;/tiny",      # the finding's value
    "data/raw/$(id)/tiny", "data/raw/`id`/tiny", "data/raw/a'b/tiny", 'data/raw/a"b/tiny',
    "data/raw/a|b/tiny", "data/raw/a&b/tiny", "data/raw/a>b/tiny", "data/raw/{x}/tiny",
    "data/raw/a\nb/tiny", "data/raw/tiny\n", "-rf/tiny", "",
])
def test_a_results_path_with_shell_syntax_is_refused_in_words(tmp_path, results):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_testbed(results=results)))
    with pytest.raises(experiments.DefinitionError) as e:
        experiments.load_testbed(bad)
    msg = str(e.value)
    assert "field 'results'" in msg and repr(results) in msg, msg
    # what is allowed, in words, and no regex for the reader to decode
    assert "letters, digits, spaces and the characters . _ - / only, not starting with '-'" in msg, msg
    assert "does not match" not in msg and "(?!" not in msg, msg


def test_a_results_path_with_a_space_is_a_valid_one(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_testbed(results="data/raw/my run/tiny")))
    assert Plan(str(good)).raw == "data/raw/my run/tiny"


@pytest.mark.parametrize("block", ["hosts", "fallback_hosts"])
@pytest.mark.parametrize("spec", ["ssh:-oProxyCommand", "ssh:-Evil", "ssh:root@-oProxyCommand"])
def test_a_host_ssh_would_read_as_an_option_stops_the_plan_naming_the_field(tmp_path, block, spec):
    doc = _testbed()
    doc[block]["consumer"]["host"] = spec
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(experiments.DefinitionError) as e:
        Plan(str(bad))
    msg = str(e.value)
    assert f"field '{block}.consumer.host'" in msg and "starts with '-'" in msg and "ssh:user@host" in msg, msg
