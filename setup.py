"""Build configuration that pyproject.toml cannot express (the native modules)."""
import os
import sysconfig
from glob import glob

from setuptools import Extension, setup

# -fvisibility=hidden: a module exports only its PyInit_ function, so the calls between its own C files
# are direct calls (not through the PLT, which a 64-byte page's read met three times per key: 9 of its
# ~38 ns in the slot read, `ratios --only pages_per_s_64b`).
CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-fno-strict-aliasing", "-fvisibility=hidden"]
NATIVE = "native"   # C sources: their own folder, not the dotted name of the built extension

# Plain C, no rdma-core: the verbs backend is its own module and optional.
native = Extension(
    "peercache._native",
    sources=sorted(p for p in glob(f"{NATIVE}/*.c") if not os.path.basename(p).startswith("verbs")),
    depends=sorted(p for p in glob(f"{NATIVE}/*.h") if not os.path.basename(p).startswith("verbs")),
    extra_compile_args=CFLAGS,
    libraries=["b2", "pthread"],   # b2: libb2 (libb2-dev), the key hash of the directory table read
)


def verbs_headers() -> str | None:
    """Directory holding infiniband/verbs.h (rdma-core / libibverbs-dev), or None."""
    dirs = [os.environ.get("PEERCACHE_VERBS_INCLUDE", ""), sysconfig.get_config_var("INCLUDEDIR") or "",
            "/usr/include", "/usr/local/include", "/opt/mellanox/include"]
    return next((d for d in dirs if d and os.path.exists(os.path.join(d, "infiniband", "verbs.h"))), None)


ext_modules = [native]
_inc = None if os.environ.get("PEERCACHE_NO_VERBS") else verbs_headers()
if _inc:
    ext_modules.append(Extension(
        "peercache._verbs",
        sources=sorted(glob(f"{NATIVE}/verbs*.c")),
        depends=sorted(glob(f"{NATIVE}/verbs*.h")) + [f"{NATIVE}/pc.h", f"{NATIVE}/clock.h"],
        include_dirs=[_inc],
        define_macros=[("_GNU_SOURCE", None)],   # pthread_rwlock_t, getrandom, move_pages
        extra_compile_args=CFLAGS,
        libraries=["ibverbs", "pthread"],
    ))
else:
    print("peercache: infiniband/verbs.h not found (or PEERCACHE_NO_VERBS set): building without the "
          "RDMA verbs backend; install libibverbs-dev (rdma-core) and rebuild for --protocol rdma")

setup(ext_modules=ext_modules)
