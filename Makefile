# graphtrain: `make demo` and `make test` work on a new machine as root, with nothing done first.
# A second run skips what is done: Debian packages present, .venv up to date, build unchanged.

SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CTEST := $(VENV)/bin/ctest
CMAKE := $(VENV)/bin/cmake

# SANITIZE=1 builds and runs the C++ tests with AddressSanitizer and UBSan (build/asan).
SANITIZE ?= 0
DEV_BUILD := build/dev
ASAN_BUILD := build/asan
APT_PACKAGES := g++ make libgtest-dev libprotobuf-dev protobuf-compiler libopenblas-pthread-dev \
	zlib1g-dev libdnnl-dev clang-format chromium-headless-shell

VENV_STAMP := $(VENV)/.graphtrain-requirements
BUILD_STAMP := $(DEV_BUILD)/.graphtrain-installed
SOURCES := CMakeLists.txt pyproject.toml $(shell find cpp python/graphtrain -type f \
	\( -name '*.cc' -o -name '*.h' -o -name '*.py' -o -name CMakeLists.txt \) 2>/dev/null)

.PHONY: demo test build deps apt cpp-test py-test lint format format-check readme clean

demo: build
	@$(PY) examples/demo.py

test: build
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(MAKE) --no-print-directory cpp-test || status=1; \
	$(MAKE) --no-print-directory py-test || status=1; \
	exit $$status

build: $(BUILD_STAMP)

deps: apt $(VENV_STAMP)

# Debian packages: installed only when missing (dpkg -s is quick).
apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (apt-get needs it): $$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing >/dev/null; \
	fi

$(VENV_STAMP): requirements-dev.txt | apt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	DS_BUILD_OPS=0 $(PIP) install -q -r requirements-dev.txt
	@touch $@

# Editable install through scikit-build-core into a fixed build folder: ninja rebuilds only what
# changed; Python sources are used in place.
$(BUILD_STAMP): $(SOURCES) $(VENV_STAMP)
	$(PIP) install -q --no-build-isolation --no-deps -e . -Cbuild-dir=$(DEV_BUILD) \
	  -Ccmake.define.GRAPHTRAIN_BUILD_TESTS=ON
	@touch $@

cpp-test: build
ifeq ($(SANITIZE),1)
	@test -f $(ASAN_BUILD)/build.ninja || $(CMAKE) -S . -B $(ASAN_BUILD) -G Ninja \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DGRAPHTRAIN_SANITIZE=address,undefined -DGRAPHTRAIN_BUILD_PYTHON=OFF \
	  -DGRAPHTRAIN_BUILD_TESTS=ON >/dev/null
	@$(CMAKE) --build $(ASAN_BUILD) -- -j2
	$(CTEST) --test-dir $(ASAN_BUILD) --output-on-failure --no-tests=error -j2
else
	$(CTEST) --test-dir $(DEV_BUILD) --output-on-failure --no-tests=error -j2
endif

py-test: build
	$(PY) -m pytest -q python/tests

PY_DIRS := python bench examples scripts

# Formatting and lint: C++ by clang-format (.clang-format), Python by ruff (pyproject.toml).
lint: $(VENV_STAMP)
	@clang-format --dry-run --Werror $$(find cpp examples -name '*.cc' -o -name '*.h')
	@$(VENV)/bin/ruff format --check --quiet $(PY_DIRS) || \
	  { echo "Python files need formatting: run 'make format'"; exit 1; }
	@$(VENV)/bin/ruff check --quiet $(PY_DIRS)
	@echo "lint: clang-format and ruff clean"

format: $(VENV_STAMP)
	clang-format -i $$(find cpp examples -name '*.cc' -o -name '*.h')
	$(VENV)/bin/ruff format $(PY_DIRS)
	$(VENV)/bin/ruff check --fix --quiet $(PY_DIRS)

format-check: lint

# Regenerates the options table in README.md from the C++ registry.
readme: build
	$(PY) scripts/readme_options.py --write

clean:
	rm -rf build
