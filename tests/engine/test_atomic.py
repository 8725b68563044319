"""Result files are written whole or not at all (peercache.atomic): on a tiny tmpfs that fills up,
the earlier file stays as it was and the error is one line naming the path and the free space."""
import json
import os
import subprocess

import pytest

from conftest import BENCH
from peercache import atomic
from peercache.bench.serve import READY_LINE
from peercache.lab import tidy

SMALL = ["--working-set", "64", "--page-size", "16384", "--protocol", "shm"]
EARLIER = '{"earlier": "result"}\n'


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (root only: mount), unmounted on every path."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root (run the suite as root, as make test does in CI)")
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk):
    """Take every free byte of ``disk`` with a filler file."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for _ in range(1 << 14):                  # bounded: 64 MiB at most, the disk holds 64 KiB
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


def leftovers(disk):
    return sorted(p.name for p in disk.iterdir() if p.name not in ("filler", "drive.json", "result.json"))


def test_a_new_file_replaces_the_old_whole_with_the_usual_mode(tmp_path):
    path = tmp_path / "sub" / "doc.json"
    atomic.write_text(path, EARLIER)
    atomic.write_text(path, "second\n")
    assert path.read_text() == "second\n"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in path.parent.iterdir()] == ["doc.json"]        # no temporary file left


def test_an_error_while_writing_leaves_the_earlier_file(tmp_path):
    path = tmp_path / "doc.json"
    atomic.write_text(path, EARLIER)
    with pytest.raises(RuntimeError):
        with atomic.replacing(path) as tmp:
            tmp.write_text("half a docu")
            raise RuntimeError("the writer failed half way")
    assert path.read_text() == EARLIER
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_a_full_disk_keeps_the_earlier_file_and_says_where_and_how_much_is_free(tiny_disk):
    path = tiny_disk / "result.json"
    atomic.write_text(path, EARLIER)
    fill(tiny_disk)
    with pytest.raises(atomic.WriteFailed) as e:
        atomic.write_text(path, json.dumps({"rows": ["x" * 100] * 100}))
    msg = str(e.value)
    assert str(path) in msg and "No space left on device" in msg and "0 bytes free" in msg
    assert "earlier file there is kept" in msg and "\n" not in msg
    assert isinstance(e.value, OSError) and e.value.errno == 28
    assert path.read_text() == EARLIER
    assert leftovers(tiny_disk) == []


def test_the_labs_result_writer_on_a_full_disk(tiny_disk):
    path = tiny_disk / "result.json"
    meta = tidy.RunMeta(run_id="r1", testbed="t", experiment="e", scenario="s", point="p", repetition=0,
                        hosts={}, commands={}, start="2026-12-06T00:00:00Z", end="2026-12-06T00:00:01Z",
                        git_revision=None)
    tidy.write_result(path, meta, [])
    before = path.read_text()
    fill(tiny_disk)
    rows = [tidy.Row(experiment="e", scenario="s", run_id="r1", metric="bw", value=float(i), unit="GB/s")
            for i in range(200)]
    with pytest.raises(atomic.WriteFailed, match="result.json: No space left on device"):
        tidy.write_result(path, meta, rows)
    assert path.read_text() == before
    assert tidy.read_result(path)[0].run_id == "r1"
    assert leftovers(tiny_disk) == []


def test_drive_out_on_a_full_disk_is_one_line_and_keeps_the_earlier_result(procs, port, tiny_disk):
    addr = f"127.0.0.1:{port}"
    out = tiny_disk / "drive.json"
    out.write_text(EARLIER)
    fill(tiny_disk)
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    r = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
                        "--duration", "0.3", "--warmup", "0.1", "--out", str(out), "--ready-timeout", "10"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    line = [ln for ln in r.stderr.splitlines() if str(out) in ln]
    assert len(line) == 1 and "No space left on device" in line[0] and "free in" in line[0], r.stderr
    assert out.read_text() == EARLIER
    assert leftovers(tiny_disk) == []
