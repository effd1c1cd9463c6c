# steadytune — two commands on a fresh machine:
#   make demo   builds .venv (if missing), then fine-tunes a tiny built-in model under supervision
#   make test   builds .venv (if missing), then runs the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Offline by default: the demo and the tests build their own tiny model and data.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint bench clean

$(VENV): $(VENV)/.installed

# torch is pinned and installed first: an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[train,dev,plot,gpu,tensorboard]"
	touch $@

demo: $(VENV)
	$(BIN)/steadytune demo

test: $(VENV)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(VENV)
	$(BIN)/ruff check src tests benchmarks

bench: $(VENV)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
