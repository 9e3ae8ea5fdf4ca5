# kubetrain: `make run` runs the whole pipeline on this machine, `make test` runs the tests.
# Both set up .venv first: torch pinned to the CPU build torch==2.13.0 first, then DeepSpeed
# built against it (an sdist: --no-build-isolation, else its build pulls a CUDA torch), then
# '.[dev]' (which pulls '.[train]': torch, numpy, scikit-learn, safetensors, matplotlib,
# '.[deepspeed]' and '.[ray]': ray[default,train]==2.60.0 for --launcher ray / --backend rayjob). DeepSpeed's CPU shared-memory op is built once here (g++ and ninja, ~30 s),
# into .venv/torch_extensions with the venv's ninja (conftest.py points the tests at both).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
DEEPSPEED ?= deepspeed>=0.19,<0.20
STAMP := $(VENV)/.kubetrain-installed

.PHONY: setup run test lint format compile clean e2e-cluster bench

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check '$(TORCH)' ninja
	$(BIN)/pip install --quiet --disable-pip-version-check --no-build-isolation '$(DEEPSPEED)'
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	PATH=$(abspath $(BIN)):$$PATH TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions \
		$(BIN)/python -c 'from deepspeed.accelerator import get_accelerator as a; \
		b = a().create_op_builder("ShareMemCommBuilder"); b and b.load(verbose=False)'
	touch $(STAMP)

run: setup
	$(BIN)/kubetrain run

# Three pytest-xdist workers on two cores: most tests wait on processes they start
# (torchrun, mpirun, the local runner's steps), and the cores were ~55% busy with two (user +
# sys 16.5 of 2 x 15 min). Fresh clone, 2026-11-28: 14.0 min with three, against 14.7 min with
# two before DeepSpeed's tests came; after issue 31 (real Ray clusters) 17.2 min with three,
# 18.7 with four. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3

test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

compile: setup
	$(BIN)/kubetrain compile --output-dir .

# Benchmarks against real baselines (issue 6); writes bench/results.md and bench/results.json.
# `$(BIN)/python -m bench --quick` runs each figure once with tiny sizes.
bench: setup
	$(BIN)/python -m bench

# build/ too: setuptools stages a wheel in build/lib and never removes a file deleted from the
# sources there, so a wheel built over an old build/ would still ship it.
clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info build dist

# Opt-in: the steps against the real cluster in $KUBECONFIG (see README, "On a real cluster").
e2e-cluster: setup
	KUBETRAIN_E2E_CLUSTER=1 $(BIN)/python -m pytest -v tests/e2e_cluster
