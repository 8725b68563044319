# The two set-up commands are `make run` and `make test`; `make bench` is the
# side-by-side benchmark. Each installs what it needs first and is quick when
# that is already done (stamp files under .venv/).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CORES  ?= 2

# Debian packages: tools the lab wraps, rdma-core headers for the verbs
# backend, pyverbs, what the tests use (sshd, network namespaces), and the
# Soft-RoCE guest (QEMU, a static busybox, cpio and kmod for its initramfs),
# xxHash's header for the slot checksum of the native module, and libb2 (BLAKE2b)
# for the key hashes of its directory table read.
APT_PKGS := build-essential python3-dev python3-venv numactl iperf3 perftest sockperf \
            rdma-core libibverbs-dev ibverbs-utils python3-pyverbs linux-perf \
            iproute2 iputils-ping openssh-server openssh-client procps \
            qemu-system-x86 busybox-static cpio kmod libxxhash-dev libb2-dev redis-server redis-tools chromium

NATIVE_SRC := $(wildcard native/*.c native/*.h)

.PHONY: run test test-rdma test-2host test-hicache bench lab setup shell apt clean engines

# Everything goes into $(VENV) (no system site-packages): use it with `. $(VENV)/bin/activate`, or
# `make shell`. setup also registers the notebooks' Jupyter kernel ("PeerCache Lab", peercache-lab) in
# the venv, so `papermill notebooks/explore.ipynb out.ipynb` finds it.
setup: $(VENV)/.installed $(VENV)/.kernel

$(VENV)/.kernel: $(VENV)/.installed
	$(PY) -m peercache.lab.jupyter --register-kernel
	@touch $@

# A shell with the venv active (its python, snakemake, papermill, peercache-bench first on PATH);
# `exit` leaves it.
shell: setup
	@echo "a shell with $(abspath $(VENV)) active (python, snakemake, papermill, peercache-bench); exit to leave"
	@VIRTUAL_ENV="$(abspath $(VENV))" PATH="$(abspath $(VENV))/bin:$$PATH" exec "$${SHELL:-/bin/bash}" -i

apt: $(VENV)/.apt
$(VENV)/.apt: Makefile
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:" $$missing; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	  else \
	    echo "missing Debian packages (run as root, or: sudo apt-get install $$missing)"; exit 1; \
	  fi; \
	fi
	@mkdir -p $(VENV) && touch $@

$(VENV)/.installed: $(VENV)/.apt pyproject.toml setup.py $(NATIVE_SRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# Expose only the system's pyverbs (rdma-core's binding) to the venv.
	@if [ -d /usr/lib/python3/dist-packages/pyverbs ]; then \
	  mkdir -p $(VENV)/system-pyverbs && ln -sfn /usr/lib/python3/dist-packages/pyverbs $(VENV)/system-pyverbs/pyverbs && \
	  $(PY) -c 'import site,sys; open(site.getsitepackages()[0]+"/system-pyverbs.pth","w").write(sys.argv[1]+"\n")' "$$(cd $(VENV)/system-pyverbs && pwd)"; \
	fi
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[lab,test]'
	@touch $@

# The test suite, the HiCache contract against real SGLang, the RDMA stage in the Soft-RoCE
# guest, and the lab on two guests as two machines (each guest stage skipped, saying why,
# where this machine cannot run the guests). The host suite runs in TEST_WORKERS processes
# (pytest-xdist; a test file stays in one worker, so its module fixtures run once): most of its
# time is spent waiting on the processes and windows tests start, so more workers than cores pay.
# Each stage's time is printed at the end, also when one fails.
TEST_WORKERS ?= 4
test: setup
	@set -e; t0=$$(date +%s); last=$$t0; times=""; \
	stage() { now=$$(date +%s); times="$$times$$1 $$(( (now - last) / 60 )) min $$(( (now - last) % 60 )) s, "; last=$$now; }; \
	report() { echo "make test: $${times}total $$(( ($$(date +%s) - t0) / 60 )) min $$(( ($$(date +%s) - t0) % 60 )) s$$1"; }; \
	trap 'rc=$$?; [ $$rc -eq 0 ] || { stage "the failed stage"; report " (failed, rc $$rc)"; }' EXIT; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile; stage "host suite"; \
	$(MAKE) --no-print-directory test-hicache; stage "HiCache"; \
	$(MAKE) --no-print-directory test-rdma GUEST_FLAGS=--if-available; stage "RDMA guest"; \
	$(MAKE) --no-print-directory test-2host; stage "two machines"; \
	report ""

# The SGLang HiCache contract (tests/engine/hicache/test_hicache_sglang.py) in a venv of its own, so torch
# and SGLang stay out of the engine's dependencies: PyPI torch (CPU use, ~5.5 GB), SGLang
# without its dependencies plus the few modules its hicache_storage imports, the engine's
# runtime dependencies (from pyproject.toml) and a .pth to this checkout (its built native
# extension: same interpreter as $(VENV)).
SGLANG_VENV    ?= .venv-sglang
SGLANG_PY      := $(SGLANG_VENV)/bin/python
SGLANG_VERSION ?= 0.5.23
SGLANG_MODULES := orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
                  ipython aiohttp pytest pytest-timeout
$(SGLANG_VENV)/.installed: $(VENV)/.installed Makefile pyproject.toml
	@test -x $(SGLANG_PY) || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(SGLANG_VENV)
	$(SGLANG_PY) -m pip install -q --upgrade pip
	$(SGLANG_PY) -m pip install -q torch
	$(SGLANG_PY) -m pip install -q --no-deps sglang==$(SGLANG_VERSION)
	$(SGLANG_PY) -m pip install -q $(SGLANG_MODULES) \
	  $$($(SGLANG_PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
	@$(SGLANG_PY) -c 'import site, sys; open(site.getsitepackages()[0] + "/peercache-tree.pth", "w").write(sys.argv[1] + "\n")' "$(CURDIR)"
	@touch $@

test-hicache: setup $(SGLANG_VENV)/.installed
	PYTHONPATH=tests $(SGLANG_PY) -m pytest tests/engine/hicache/test_hicache_sglang.py -p no:cacheprovider --noconftest

# The other engines the `engines` scenario runs beside PeerCache, each in a venv of its own so
# they stay out of the engine's dependencies (the lab kinds mooncake_te, peercache_pypi and nixl run
# them from these paths; a point whose venv is missing is skipped, saying to run `make engines`):
# Mooncake's transfer_engine_bench (non-CUDA wheel; the native binary is linked as
# bin/transfer_engine_bench-native so the lab signals it, not the wheel's Python wrapper), the
# published PeerCache 0.8.4 (same import name as this checkout, hence its own venv), and NIXL for the
# lab's nixl kind (peercache/lab/tools/nixl_driver.py runs with this venv's python). NIXL goes in with
# --no-deps: nixl-cu12's declared dependencies are torch and numpy (~5.7 GB with torch's CUDA wheels),
# but its Python side imports torch only for tensors a caller passes (sys.modules), so numpy is all the
# driver needs; checked with 1.5.1 on a host without a GPU: nixl_agent starts with its UCX backend,
# registers DRAM, and our driver READs and verifies pages over UCX tcp (340 MB instead of 5.7 GB).
# The last line below is that check (an agent with UCX registering and releasing 1 MiB of DRAM; it leaves
# by os._exit, as the driver does: 1.5.1 crashes at exit in its bundled libnl-route's destructor).
MOONCAKE_VENV   ?= .venv-mooncake
PCPYPI_VENV     ?= .venv-peercache-pypi
PCPYPI_VERSION  ?= 0.8.4
NIXL_VENV       ?= .venv-nixl
NIXL_VERSION    ?= 1.5.1
engines: $(MOONCAKE_VENV)/.installed $(PCPYPI_VENV)/.installed $(NIXL_VENV)/.installed

$(MOONCAKE_VENV)/.installed: $(VENV)/.installed Makefile
	@test -x $(MOONCAKE_VENV)/bin/python || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(MOONCAKE_VENV)
	$(MOONCAKE_VENV)/bin/python -m pip install -q mooncake-transfer-engine-non-cuda
	@ln -sfn "$$($(MOONCAKE_VENV)/bin/python -c 'import mooncake, os; print(os.path.join(os.path.dirname(mooncake.__file__), "transfer_engine_bench"))')" \
	  $(MOONCAKE_VENV)/bin/transfer_engine_bench-native
	@$(MOONCAKE_VENV)/bin/transfer_engine_bench-native --version >/dev/null
	@touch $@

$(PCPYPI_VENV)/.installed: $(VENV)/.installed Makefile
	@test -x $(PCPYPI_VENV)/bin/python || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(PCPYPI_VENV)
	$(PCPYPI_VENV)/bin/python -m pip install -q peercache==$(PCPYPI_VERSION)
	@$(PCPYPI_VENV)/bin/peercache-bench --help >/dev/null
	@touch $@

$(NIXL_VENV)/.installed: $(VENV)/.installed Makefile
	@test -x $(NIXL_VENV)/bin/python || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(NIXL_VENV)
	$(NIXL_VENV)/bin/python -m pip install -q --no-deps nixl-cu12==$(NIXL_VERSION) numpy
	@$(NIXL_VENV)/bin/python -P -c 'import numpy as np; from nixl_cu12 import nixl_agent as A, nixl_agent_config as C; \
	  a = A("make-engines", C(backends=["UCX"])); b = np.zeros(1 << 20, np.uint8); \
	  a.deregister_memory(a.register_memory([(b.ctypes.data, b.nbytes, 0, "")], "DRAM", backends=["UCX"])); \
	  import os; os._exit(0)' >/dev/null
	@touch $@

# Every RDMA/verbs test inside a QEMU guest with Debian's kernel and real
# rxe devices on both ends of two veth pairs; a missing device fails. The files that hold them (and
# any skipped whole) are found here first, so the guest imports only those: collecting the whole
# suite took 107 s of the guest's time at x16, those files 44 s.
GUEST_TIMEOUT ?= 1200
RDMA_MARK = rdma and not slow
test-rdma: setup
	@out=$$($(PY) -m pytest --collect-only -q -m '$(RDMA_MARK)' -p no:cacheprovider) || { echo "$$out"; exit 1; }; \
	files=$$(echo "$$out" | sed -n -e 's/::.*//p' -e 's/^SKIPPED \[[0-9]*\] \([^:]*\):.*/\1/p' | sort -u); \
	echo "test-rdma: the tests marked '$(RDMA_MARK)' are in" $$files; \
	$(PY) -m peercache.lab.launch.guest --cluster-hosts 3 --timeout $(GUEST_TIMEOUT) $(GUEST_FLAGS) -- \
	  env PEERCACHE_REQUIRE_RDMA=1 $(PY) -m pytest -m '$(RDMA_MARK)' -p no:cacheprovider --durations=12 $$files

# The lab on two real kernels: two QEMU guests as two machines over SSH, RDMA across two
# wires, two NUMA nodes each (tests/lab/test_twohost.py boots them; skipped, saying why,
# where this machine cannot run them): a reduced grid of every scenario, then the faults.
# About 11 minutes here (guests 13-19 times slower than this machine). A guest's kernel livelocked
# under perf stat (its text patching under TCG: docs/testing.md), so the pair's points run without
# it; should a guest stop anyway, the stage stops the pipeline, prints where the vCPUs are, reboots
# the pair and goes on with the points already done kept; a second stall fails it.
test-2host: setup
	$(PY) -m pytest -m twohost -p no:cacheprovider -s -rs --durations=12 tests/lab/test_twohost.py

# The main job: the baseline pipeline on the built-in local testbed
# (TESTBED=experiments/testbeds/<yours>.yaml for another one; a testbed with a
# `machines` block, softroce-2host.yaml, boots its two guests around the run).
TESTBED ?= experiments/testbeds/local.yaml
run: setup engines
	$(PY) -m peercache.lab.pipeline.run --testbed $(TESTBED) --cores $(CORES)

bench: setup engines
	$(PY) -m peercache.lab.ratios

# JupyterLab on notebooks/ with the project's kernel ("PeerCache Lab", registered in the venv),
# bound to 127.0.0.1 with a token (printed); LAB_PORT=N for another port.
LAB_PORT ?= 8888
lab: setup
	$(PY) -m peercache.lab.jupyter --port $(LAB_PORT)

clean:
	rm -rf $(VENV) build *.egg-info
