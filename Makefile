# One venv under .venv; every target is idempotent.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
DATA    ?= ./comprl_data

.PHONY: setup run test test-fast bench chromium clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools<81" wheel
	# The CPU wheel of torch first: a bare `torch` would pull a multi-GB CUDA build.
	$(BIN)/pip install -q $(TORCH)
	# [real] builds llama.cpp's server from source (llama-cpp-python: no Linux wheel on PyPI): measured 7m20s on
	# this 2-core machine under load, once; pip's wheel cache serves it after that. Portable CPU flags: a
	# -march=native build (AMX, AVX-512) crashed on every multi-token prompt here.
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX=OFF -DGGML_AVX512=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(BIN)/pip install -q -e ".[dev,real,ray]"
	touch $(STAMP)

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/comprl app --demo --data-dir $(DATA)

chromium:
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "chromium not installed: browser tests will be skipped"

test: setup chromium
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests

# The fast tier: everything but the tests marked `slow` (end-to-end runs, model builds; pyproject.toml says the bar).
test-fast: setup chromium
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow" tests

bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV)
