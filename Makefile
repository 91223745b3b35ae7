# make demo  - set up .venv, build, run a 4-rank allreduce benchmark on this machine
# make test  - set up if needed, build the docs site, run the C++ unit tests and the whole pytest
#              suite, then the sanitizer tiers (test-asan, test-tsan, test-py-asan;
#              `make test SANITIZERS=` skips them)
# make docs  - build the docs site (docs/, mkdocs.yml) into build/site; any warning fails it
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CORE_SOURCES := $(shell find core -name '*.cc' -o -name '*.h' -o -name '*.cu') cmake/embed_file.cmake CMakeLists.txt pyproject.toml
PYTEST_ARGS ?=

.PHONY: all setup system-deps demo docs test test-cpp test-py test-sanitizers test-asan test-tsan \
	test-py-asan clean layering cuda-fatbin

all: setup

# System packages: GoogleTest and OpenSSL headers for the core, iproute2 and mptcpize for the
# network-namespace testbed. Installed only when missing and only as root (CI runs as root).
system-deps:
	@bash scripts/install_system_deps.sh

$(VENV)/.deps-stamp: requirements-dev.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	@touch $@

$(VENV)/.install-stamp: $(VENV)/.deps-stamp $(CORE_SOURCES)
	$(PIP) install -q --no-build-isolation -e .
	@touch $@

setup: system-deps $(VENV)/.install-stamp

build/cpp/.built: $(CORE_SOURCES) | system-deps $(VENV)/.deps-stamp
	PATH=$(abspath $(VENV))/bin:$$PATH cmake -S . -B build/cpp -G Ninja -DNEZHA_BUILD_PYTHON=OFF -DNEZHA_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build build/cpp
	@touch $@

# The knob page is written from the core's own table first; --strict turns every warning (a broken
# link or anchor, a page missing from nav) into a failure.
docs: setup
	$(PY) scripts/gen_knob_docs.py docs/knobs.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test-cpp: build/cpp/.built
	cd build/cpp && ctest --output-on-failure -j2

# The slowest tests are listed at the end: what to look at first when the CI run grows.
test-py: setup
	$(PY) -m pytest -q --durations=15 $(PYTEST_ARGS)

# Sanitizer tiers. The C++ unit tests under AddressSanitizer + UndefinedBehaviorSanitizer and,
# separately, ThreadSanitizer; the Python lifetime tests against an ASan build of nezha._core
# (scripts/asan_python.sh). Any report fails the run. Nothing CUDA is built there (-DNEZHA_CUDA=OFF):
# the sanitizers cannot see into the driver, and the lane's tests skip without a GPU anyway.
SANITIZERS ?= test-asan test-tsan test-py-asan
SAN_CMAKE = PATH=$(abspath $(VENV))/bin:$$PATH cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEZHA_CUDA=OFF
export ASAN_OPTIONS ?= detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1

# One ASan build serves both tiers: the C++ tests and the sanitized Python module.
build/asan/.built: $(CORE_SOURCES) | system-deps $(VENV)/.deps-stamp
	$(SAN_CMAKE) -B build/asan -DNEZHA_BUILD_PYTHON=ON -DNEZHA_BUILD_TESTS=ON \
	    -DNEZHA_SANITIZE=address,undefined -DPython_EXECUTABLE=$(abspath $(PY)) \
	    -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) >/dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build build/asan
	@touch $@

build/tsan/.built: $(CORE_SOURCES) | system-deps $(VENV)/.deps-stamp
	$(SAN_CMAKE) -B build/tsan -DNEZHA_BUILD_PYTHON=OFF -DNEZHA_BUILD_TESTS=ON \
	    -DNEZHA_SANITIZE=thread >/dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build build/tsan
	@touch $@

test-asan: build/asan/.built
	cd build/asan && ctest --output-on-failure -j2

test-tsan: build/tsan/.built
	cd build/tsan && ctest --output-on-failure -j2

test-py-asan: build/asan/.built | setup
	bash scripts/asan_python.sh build/asan $(PY) -m pytest -q -p no:cacheprovider \
	    tests/test_lifetime.py tests/test_api_errors.py tests/test_mismatch.py \
	    tests/test_multirail_testbed.py::test_dropped_handles_survive_a_rail_cut

test-sanitizers: $(SANITIZERS)

# The CUDA IPC lane's kernel image, built here with nvcc, for a GPU machine without a toolkit:
# scripts/device_check.sh embeds .gpu/nezha_reduce_kernels.fatbin when it finds no nvcc.
cuda-fatbin: | $(VENV)/.deps-stamp
	PATH=$(abspath $(VENV))/bin:$$PATH cmake -S . -B build/cpp -G Ninja -DNEZHA_BUILD_PYTHON=OFF -DNEZHA_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release -DNEZHA_CUDA=ON >/dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build build/cpp --target nezha_cuda_fatbin
	mkdir -p .gpu && cp build/cpp/nezha_reduce_kernels.fatbin .gpu/

# The engine's folders include each other one way (shared types <- folders <- Engine).
layering:
	python3 scripts/include_graph.py --engine-apart

test: layering docs test-cpp test-py $(SANITIZERS)

demo: setup
	$(VENV)/bin/nezharun -np 4 $(VENV)/bin/nezha-bench --op allreduce --sizes 8,1K,64K,1M,16M,64M --iters auto

clean:
	rm -rf build _skbuild *.egg-info
