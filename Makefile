# Two commands set up and run everything on a fresh machine: `make quickstart` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# GPU users may point TORCH_SPEC at another build, e.g.
#   make quickstart TORCH_SPEC="torch==2.13.0 --index-url <CUDA wheel index>"   (README, "GPU")
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# Test workers (pytest-xdist): one per core, at most 4 (each test process loads torch and runs
# its own threads). The SLURM tests share one cluster (`xdist_group`), and the longest waits
# (the fresh-venv install, SLURM's time limit) are collected first (tests/conftest.py), so they
# overlap with the rest. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadgroup

.PHONY: quickstart test test-fast test-stored-numbers venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python requirements.txt requirements-dev.txt pyproject.toml
	$(BIN)/pip install $(TORCH_SPEC)
	$(BIN)/pip install -r requirements-dev.txt
	# DADApy is a test-only reference; --no-deps keeps its numpy<2/jax pins out (requirements-dev.txt).
	$(BIN)/pip install --no-deps dadapy==0.3.4
	# IsoScore and CKA references for tests/metrics: --no-deps so pip never touches torch.
	$(BIN)/pip install --no-deps isoscore==2.0.1 ckatorch==1.0.3 reptrix==0.1.0
	# The Shape of Learning authors' code, the reference for metrics.twonn_authors (tests only).
	$(BIN)/pip install --no-deps llm-microscope==0.0.7
	touch $@

venv: $(VENV)/.installed

quickstart: venv
	$(BIN)/python train.py experiment=quickstart

test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# The edit-test loop: lint and every test but the `slow` ones (end-to-end trainings and
# command-line runs, the fresh-venv install) and SLURM's. `make test` runs them all.
test-fast: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow and not slurm"

# The tests that compare with numbers stored in the repo, again with torch's portable (no SIMD)
# kernels, which round differently from the AVX/NEON ones: such a test must hold on any CPU, not
# only on the one that wrote the numbers. .ci/run runs this after `make test`.
test-stored-numbers: venv
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -m stored_numbers -q

clean:
	rm -rf $(VENV) outputs multirun
