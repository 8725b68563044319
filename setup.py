"""Build configuration that pyproject.toml cannot express (the native module)."""
from glob import glob

from setuptools import Extension, setup

# Plain C, no rdma-core: the verbs backend is its own module and optional.
native = Extension(
    "peercache._native",
    sources=sorted(glob("peercache/_native/*.c")),
    depends=sorted(glob("peercache/_native/*.h")),
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-fno-strict-aliasing"],
    libraries=["pthread"],
)

setup(ext_modules=[native])
