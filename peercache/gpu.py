"""GPU receive buffers (``drive --gpu``): allocation through PyTorch or CuPy, GPUDirect registration.

With rdma the buffer is registered for GPUDirect RDMA: by dma-buf
(``cuMemGetHandleForAddressRange`` + ``ibv_reg_dmabuf_mr``) when the stack
allows, else as a plain MR of the device address, which works when
nvidia-peermem is loaded. With tcp and shm the pages land in pinned host
memory and are copied to the GPU. Every failure names the missing piece.
"""
from __future__ import annotations

import ctypes
import importlib
import os

import numpy as np

from .errors import PeerCacheError

#: dma-buf export and GPUDirect mappings work on whole GPU pages.
GPU_PAGE = 2 << 20
#: CUmemRangeHandleType CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD.
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
CUDA_ERROR_NOT_SUPPORTED = 801
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


class GpuError(PeerCacheError):
    """A GPU prerequisite is missing."""


def align_up(n: int, a: int) -> int:
    """``n`` rounded up to a multiple of ``a``."""
    return (n + a - 1) // a * a


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def probe() -> tuple[str | None, str]:
    """(``"torch"`` or ``"cupy"``, ``""``) when a CUDA device is usable, else (None, why not)."""
    torch = _import("torch")
    if torch is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return "torch", ""
        why = "PyTorch is installed but sees no CUDA device (torch.cuda.is_available() is False)"
    else:
        why = "PyTorch is not importable"
    cupy = _import("cupy")
    if cupy is not None:
        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return "cupy", ""
            why += "; CuPy sees no CUDA device"
        except Exception as e:  # CUDARuntimeError when the driver is missing
            why += f"; CuPy cannot reach a CUDA device ({e})"
    else:
        why += " and CuPy is not importable"
    return None, (f"--gpu: no CUDA device: {why}; install PyTorch (pip install torch) or CuPy "
                  "(pip install cupy-cuda12x) on a host with an NVIDIA GPU and driver (check nvidia-smi)")


def require() -> str:
    """The GPU library to use, or GpuError naming what is missing."""
    lib, why = probe()
    if lib is None:
        raise GpuError(why)
    return lib


def pci_numa(bus_id: str, root: str = "/sys") -> int:
    """NUMA node of a PCI device such as ``0000:3B:00.0`` (-1 unknown)."""
    bus = bus_id.lower()
    if bus.count(":") == 1:
        bus = "0000:" + bus
    # CUDA reports an 8-digit domain; sysfs uses 4.
    if len(bus.split(":")[0]) == 8:
        bus = bus[4:]
    try:
        with open(os.path.join(root, "bus", "pci", "devices", bus, "numa_node")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return -1


class GpuBuffer:
    """``nbytes`` of GPU memory at a GPU-page-aligned address, plus helpers to move bytes."""

    def __init__(self, nbytes: int, device: int = 0):
        self.lib = require()
        self.device = device
        self.nbytes = nbytes
        span = align_up(nbytes, GPU_PAGE)
        if self.lib == "torch":
            import torch   # optional: the GPU stack found by require(), torch or CuPy
            self._mod = torch
            self._dev = torch.device(f"cuda:{device}")
            self._raw = torch.empty(span + GPU_PAGE, dtype=torch.uint8, device=self._dev)
            base = self._raw.data_ptr()
            props = torch.cuda.get_device_properties(device)
            bus = getattr(props, "pci_bus_id", None)
            if bus is None and hasattr(props, "pci_domain_id"):
                bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        else:
            import cupy    # optional, as torch above
            self._mod = cupy
            with cupy.cuda.Device(device):
                self._raw = cupy.empty(span + GPU_PAGE, dtype=cupy.uint8)
            base = self._raw.data.ptr
            bus = cupy.cuda.Device(device).pci_bus_id
        self.ptr = align_up(base, GPU_PAGE)
        self.offset = self.ptr - base
        self.span = span
        self.numa = pci_numa(bus) if isinstance(bus, str) else -1

    def view(self, start: int, n: int):
        """A tensor/array over ``n`` bytes at ``start``."""
        return self._raw[self.offset + start: self.offset + start + n]

    def dest(self):
        """A buffer-protocol object at the GPU address, for the native rdma path only.

        The CPU never touches it: only its address and length are used, and the
        NIC writes there. Handing it to tcp or shm would fault.
        """
        return (ctypes.c_ubyte * self.nbytes).from_address(self.ptr)

    def pinned(self, nbytes: int) -> np.ndarray:
        """A NumPy array in pinned (page-locked) host memory."""
        if self.lib == "torch":
            t = self._mod.empty(nbytes, dtype=self._mod.uint8, pin_memory=True)
            self._keep = getattr(self, "_keep", []) + [t]
            return t.numpy()
        import cupyx       # optional, with CuPy
        return cupyx.empty_pinned(nbytes, dtype=np.uint8)

    def upload(self, host: np.ndarray, start: int) -> None:
        """Copy pinned host bytes to the GPU at ``start`` and wait for the copy."""
        n = host.nbytes
        if self.lib == "torch":
            src = self._mod.from_numpy(host)
            self.view(start, n).copy_(src, non_blocking=True)
            self._mod.cuda.synchronize(self._dev)
        else:
            self.view(start, n).set(host)
            self._mod.cuda.Device(self.device).synchronize()

    def download(self, start: int, n: int) -> np.ndarray:
        """Copy ``n`` bytes at ``start`` to a host NumPy array."""
        v = self.view(start, n)
        return v.cpu().numpy() if self.lib == "torch" else self._mod.asnumpy(v)

    def synchronize(self) -> None:
        if self.lib == "torch":
            self._mod.cuda.synchronize(self._dev)
        else:
            self._mod.cuda.Device(self.device).synchronize()


def dmabuf_fd(ptr: int, nbytes: int) -> int:
    """A dma-buf fd exporting GPU memory [ptr, ptr+nbytes), or GpuError saying why not."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpuError(f"no dma-buf export: the CUDA driver library libcuda.so.1 cannot be loaded ({e})")
    fn = getattr(cuda, "cuMemGetHandleForAddressRange", None)
    if fn is None:
        raise GpuError("no dma-buf export: this CUDA driver lacks cuMemGetHandleForAddressRange "
                       "(needs driver 515+ and CUDA 11.7+)")
    fd = ctypes.c_int(-1)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong]
    rc = fn(ctypes.byref(fd), ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes),
            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
    if rc != 0:
        hint = (" (the driver does not support dma-buf here: it needs the open GPU kernel modules or "
                "a kernel with dma-buf support)" if rc == CUDA_ERROR_NOT_SUPPORTED else "")
        raise GpuError(f"no dma-buf export: cuMemGetHandleForAddressRange returned CUresult {rc}{hint}")
    return fd.value


def peermem_loaded(root: str = "/sys") -> bool:
    """Whether nvidia-peermem (or the older nv_peer_mem) is loaded."""
    return any(os.path.isdir(os.path.join(root, "module", m)) for m in PEERMEM_MODULES)


def register_for_rdma(transport, buf: GpuBuffer, root: str = "/sys") -> str:
    """Register ``buf`` on every rail of ``transport``: ``"dma-buf"`` or ``"peermem"``, else GpuError."""
    reasons = []
    try:
        fd = dmabuf_fd(buf.ptr, buf.span)
        try:
            transport.prepare_device(buf.ptr, buf.nbytes, fd, buf.numa)
            return "dma-buf"
        except OSError as e:
            reasons.append(f"ibv_reg_dmabuf_mr failed: {e}")
        finally:
            os.close(fd)   # the MR holds its own reference to the dma-buf
    except GpuError as e:
        reasons.append(str(e))
    if not peermem_loaded(root):
        reasons.append("nvidia-peermem is not loaded (modprobe nvidia-peermem), so a plain MR of GPU "
                       "memory is not possible either")
    else:
        try:
            transport.prepare_device(buf.ptr, buf.nbytes, -1, buf.numa)
            return "peermem"
        except OSError as e:
            reasons.append(f"plain MR of GPU memory failed although nvidia-peermem is loaded ({e}): the "
                           "NIC or its driver lacks GPUDirect RDMA support")
    raise GpuError("--gpu with --protocol rdma: cannot register GPU memory for GPUDirect RDMA: "
                   + "; ".join(reasons))
