# make demo  - set up .venv, build, run a 4-rank allreduce benchmark on this machine
# make test  - set up if needed, run the C++ unit tests and the whole pytest suite
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CORE_SOURCES := $(shell find core -name '*.cc' -o -name '*.h') CMakeLists.txt pyproject.toml
PYTEST_ARGS ?=

.PHONY: all setup system-deps demo test test-cpp test-py clean

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

test-cpp: build/cpp/.built
	cd build/cpp && ctest --output-on-failure -j2

test-py: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

test: test-cpp test-py

demo: setup
	$(VENV)/bin/nezharun -np 4 $(VENV)/bin/nezha-bench --op allreduce --sizes 8,1K,64K,1M,16M,64M --iters auto

clean:
	rm -rf build _skbuild *.egg-info
