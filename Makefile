# Bob: `make run` trains on the built-in corpus; `make test` runs the tests.
# Both create the virtual environment and install what they need first: `run` only
# what running needs (CUDA's wheels only where a GPU is usable), `test` the test tools,
# the CUDA wheels (NVRTC compiles without a GPU) and PyTorch besides.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# "yes" where an NVIDIA GPU is usable (its driver's nvidia-smi or device node); `make run
# GPU=` installs without the [cuda] extra anyway, `make run GPU=yes` with it.
GPU ?= $(shell (command -v nvidia-smi || test -e /dev/nvidia0) >/dev/null 2>&1 && echo yes)
comma := ,
RUN_EXTRAS := fast,plot$(if $(GPU),$(comma)cuda)

.PHONY: setup run test lint gpu-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(RUN_EXTRAS)]'
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e '.[cuda,fast,plot,test,dask,remote,tokens]'
	# CPU PyTorch, for the tests that compare with torch.optim.AdamW only
	$(BIN)/python -m pip install -q torch==2.13.0
	# NVRTC 13.0, the [cuda] extra's floor, beside the environment: the kernels compile
	# with it too (tests/test_nvrtc_floor.py)
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/nvrtc-13.0 \
		nvidia-cuda-nvrtc==13.0.88
	touch $(TEST_STAMP)

setup: $(TEST_STAMP)

run: $(RUN_STAMP)
	$(BIN)/bob train --overwrite  # the main job, from scratch each time

lint: setup
	$(BIN)/ruff check src tests dev tools

test: setup lint
	$(BIN)/python -m pytest -q

gpu-test: setup
	$(BIN)/python -m pytest -q -m gpu

bench: setup  # the suite in dev/bench, beside the editable install's src/
	$(BIN)/bob bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
