"""GPU destinations: clean failures without CUDA, registration fallbacks, the GPU-vs-H2D check."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import BENCH, free_port
from peercache import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "tests", "gpu", "check_gpu_shm.py")


def test_drive_gpu_without_cuda_fails_clearly():
    lib, why = gpu.probe()
    if lib is not None:
        pytest.skip(f"this host has a CUDA device through {lib}")
    addr = f"127.0.0.1:{free_port()}"
    r = subprocess.run([*BENCH, "drive", "--gpu", "--discovery-addr", addr, "--working-set", "64"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "peercache-bench drive: --gpu: no CUDA device:" in r.stderr
    assert "pip install torch" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(gpu.GpuError, match="no CUDA device"):
        gpu.GpuBuffer(4096)


def test_gpu_shm_vs_h2d_check():
    lib, why = gpu.probe()
    if lib is None:
        pytest.skip(why)
    r = subprocess.run([sys.executable, CHECK, "--rounds", "10"], capture_output=True, text=True, timeout=240,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    line = next(l for l in r.stdout.splitlines() if l.startswith("ratio gpu_shm_vs_h2d "))
    assert float(line.split()[-1]) > 0


def test_check_script_exits_2_without_cuda():
    lib, _ = gpu.probe()
    if lib is not None:
        pytest.skip(f"this host has a CUDA device through {lib}")
    r = subprocess.run([sys.executable, CHECK], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_align_and_pci_numa(tmp_path):
    assert gpu.align_up(1, gpu.GPU_PAGE) == gpu.GPU_PAGE and gpu.align_up(gpu.GPU_PAGE, gpu.GPU_PAGE) == gpu.GPU_PAGE
    d = tmp_path / "bus/pci/devices/0000:3b:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    assert gpu.pci_numa("00000000:3B:00.0", str(tmp_path)) == 1
    assert gpu.pci_numa("0000:3b:00.0", str(tmp_path)) == 1
    assert gpu.pci_numa("3b:00.0", str(tmp_path)) == 1
    assert gpu.pci_numa("0000:99:00.0", str(tmp_path)) == -1


class FakeTransport:
    def __init__(self, fail_dmabuf=False, fail_plain=False):
        self.fail_dmabuf, self.fail_plain, self.calls = fail_dmabuf, fail_plain, []

    def prepare_device(self, addr, length, fd, numa):
        self.calls.append(fd)
        if (fd >= 0 and self.fail_dmabuf) or (fd < 0 and self.fail_plain):
            raise OSError("ibv_reg_mr: Bad address")


BUF = type("Buf", (), {"ptr": 1 << 30, "nbytes": 4096, "span": gpu.GPU_PAGE, "numa": 0})()


def _peermem(tmp_path, loaded):
    if loaded:
        (tmp_path / "module" / "nvidia_peermem").mkdir(parents=True)
    return str(tmp_path)


def test_dmabuf_is_preferred(monkeypatch, tmp_path):
    r, w = os.pipe()
    monkeypatch.setattr(gpu, "dmabuf_fd", lambda p, n: r)
    t = FakeTransport()
    assert gpu.register_for_rdma(t, BUF, _peermem(tmp_path, False)) == "dma-buf"
    assert t.calls == [r]
    os.close(w)


def test_falls_back_to_peermem(monkeypatch, tmp_path):
    def no_export(p, n):
        raise gpu.GpuError("no dma-buf export: cuMemGetHandleForAddressRange returned CUresult 801")
    monkeypatch.setattr(gpu, "dmabuf_fd", no_export)
    t = FakeTransport()
    assert gpu.register_for_rdma(t, BUF, _peermem(tmp_path, True)) == "peermem"
    assert t.calls == [-1]


@pytest.mark.parametrize("peermem,fail_plain,needles", [
    (False, False, ["no dma-buf export", "nvidia-peermem is not loaded"]),
    (True, True, ["no dma-buf export", "lacks GPUDirect RDMA support"]),
])
def test_every_missing_prerequisite_is_named(monkeypatch, tmp_path, peermem, fail_plain, needles):
    monkeypatch.setattr(gpu, "dmabuf_fd", lambda p, n: (_ for _ in ()).throw(
        gpu.GpuError("no dma-buf export: CUDA driver library libcuda.so.1 cannot be loaded")))
    with pytest.raises(gpu.GpuError) as e:
        gpu.register_for_rdma(FakeTransport(fail_plain=fail_plain), BUF, _peermem(tmp_path, peermem))
    for n in needles:
        assert n in str(e.value)


def test_dmabuf_registration_failure_is_named(monkeypatch, tmp_path):
    r, w = os.pipe()
    monkeypatch.setattr(gpu, "dmabuf_fd", lambda p, n: r)
    with pytest.raises(gpu.GpuError, match="ibv_reg_dmabuf_mr failed.*nvidia-peermem is not loaded"):
        gpu.register_for_rdma(FakeTransport(fail_dmabuf=True), BUF, _peermem(tmp_path, False))
    os.close(w)


def test_dmabuf_export_without_driver_is_named():
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    with pytest.raises(gpu.GpuError, match="no dma-buf export: the CUDA driver library libcuda.so.1"):
        gpu.dmabuf_fd(1 << 30, gpu.GPU_PAGE)
