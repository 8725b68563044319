"""The import contracts of pyproject.toml ([tool.importlinter]) hold: engine and lab, and the lab's layers."""
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports (import-linter) is not installed: it is in the test extra, run `make setup`"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    declared = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert f"{declared} kept, 0 broken" in r.stdout, r.stdout[-3000:]


def test_the_directory_package_may_not_reach_the_node(tmp_path):
    # The directory sits below the node: a directory module importing the node breaks its contract.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    work = tmp_path / "copy"
    shutil.copytree(ROOT / "peercache", work / "peercache", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    bad = work / "peercache" / "directory" / "cache.py"
    bad.write_text(bad.read_text() + "\nfrom peercache import node  # noqa\n")
    r = subprocess.run([exe, "--no-cache"], cwd=work, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "peercache.directory.cache -> peercache.node" in r.stdout, r.stdout[-2000:]


def test_a_broken_layer_is_caught(tmp_path):
    # The same contracts over a copy in which a tool imports the analysis layer: lint-imports must fail.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    work = tmp_path / "copy"
    shutil.copytree(ROOT / "peercache", work / "peercache", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    bad = work / "peercache" / "lab" / "tools" / "iperf3.py"
    bad.write_text(bad.read_text() + "\nfrom peercache.lab.analysis import charts  # noqa\n")
    r = subprocess.run([exe, "--no-cache"], cwd=work, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "peercache.lab.tools.iperf3 -> peercache.lab.analysis" in r.stdout, r.stdout[-2000:]


def test_a_scenario_report_reaching_back_into_its_harness_is_caught(tmp_path):
    # The scenario reports sit below charts and report, which find them through the registry: a scenario
    # module importing either would be an import cycle, and breaks its contract.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    work = tmp_path / "copy"
    shutil.copytree(ROOT / "peercache", work / "peercache", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    bad = work / "peercache" / "lab" / "analysis" / "scenarios" / "gpudirect.py"
    bad.write_text(bad.read_text() + "\nfrom peercache.lab.analysis import charts  # noqa\n")
    r = subprocess.run([exe, "--no-cache"], cwd=work, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin"})
    edge = "peercache.lab.analysis.scenarios.gpudirect -> peercache.lab.analysis.charts"
    assert r.returncode != 0 and edge in r.stdout, r.stdout[-2000:]
