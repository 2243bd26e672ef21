# Bob: `make run` trains on the built-in corpus; `make test` runs the tests.
# Both create the virtual environment and install what is needed first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint gpu-test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cuda,fast,test,dask,remote]'
	# CPU PyTorch, for the tests that compare with torch.optim.AdamW only
	$(BIN)/python -m pip install -q torch==2.13.0
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/bob train --overwrite  # the main job, from scratch each time

lint: setup
	$(BIN)/ruff check src tests bench tools

test: setup lint
	$(BIN)/python -m pytest -q

gpu-test: setup
	$(BIN)/python -m pytest -q -m gpu

bench: setup
	$(BIN)/bob bench

clean:
	rm -rf $(VENV) build *.egg-info
