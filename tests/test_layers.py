"""The import contracts of pyproject.toml ([tool.importlinter]) hold: engine and lab, and the lab's layers."""
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports (import-linter) is not installed: it is in the test extra, run `make setup`"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    declared = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert f"{declared} kept, 0 broken" in r.stdout, r.stdout[-3000:]


def lint_with(tmp_path, module: str, line: str) -> subprocess.CompletedProcess:
    """lint-imports over a copy of the package in which ``module`` (a path under peercache/) gains ``line``."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    work = tmp_path / "copy"
    shutil.copytree(ROOT / "peercache", work / "peercache", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    bad = work / "peercache" / module
    bad.write_text(bad.read_text() + f"\n{line}  # noqa\n")
    return subprocess.run([exe, "--no-cache"], cwd=work, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("module,line,edge", [
    # the directory sits below the node
    ("directory/cache.py", "from peercache import node", "peercache.directory.cache -> peercache.node"),
    # the engine's layers: the page layout never reaches up into the node
    ("tags.py", "from peercache import node", "peercache.tags -> peercache.node"),
    # a lab tool never imports the analysis layer
    ("lab/tools/iperf3.py", "from peercache.lab.analysis import charts",
     "peercache.lab.tools.iperf3 -> peercache.lab.analysis"),
    # the scenario reports sit below charts and report, which find them through the registry
    ("lab/analysis/scenarios/gpudirect.py", "from peercache.lab.analysis import charts",
     "peercache.lab.analysis.scenarios.gpudirect -> peercache.lab.analysis.charts"),
])
def test_an_import_against_a_contract_is_caught(tmp_path, module, line, edge):
    r = lint_with(tmp_path, module, line)
    assert r.returncode != 0 and edge in r.stdout, r.stdout[-2000:]
