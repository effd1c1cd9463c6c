# steadytune — two commands on a fresh machine:
#   make demo   builds .venv (if missing), then fine-tunes a tiny built-in model under supervision
#   make test   builds .venv (if missing), then runs the whole test suite on parallel workers
#               (make test TEST_WORKERS=0 runs it serially)
# and one for servers: make image   builds the container image (docs/docker.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Offline by default: the demo and the tests build their own tiny model and data.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
PYTEST_ARGS ?=
# The suite runs on parallel workers (pytest-xdist), one per core up to 4; tests marked serial share one
# worker and run one at a time (--dist loadgroup). TEST_WORKERS=0 runs everything in this process, serially.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; [ "$$n" -lt 2 ] && n=0; echo $$n)
XDIST := -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadgroup)

.PHONY: demo test test-fast fuzz lint bench gpu-check gpu-check-dry gpu-wheels image clean

$(VENV): $(VENV)/.installed

# torch is pinned and installed first: an unpinned torch would pull a multi-GB CUDA build.
# The installs go through tests/pip_install.py: uv (installed into the venv first, by pip), or pip with
# STEADYTUNE_INSTALLER=pip. uv installs the same packages as pip in a fraction of its time (docs/testing.md).
INSTALL := $(BIN)/python tests/pip_install.py $(BIN)/python
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	if [ "$$STEADYTUNE_INSTALLER" != pip ]; then $(BIN)/python -m pip install --quiet uv; fi
	$(INSTALL) "torch==2.13.0"
	$(INSTALL) -e ".[train,dev,plot,gpu,tensorboard,ray]"
	touch $@

demo: $(VENV)
	$(BIN)/steadytune demo

# Every supervisor, worker and CLI the tests start imports steadytune from src/; where PYTHONDONTWRITEBYTECODE
# is set, as on the CI machine, each would compile those modules again (0.26 CPU-s a supervisor). compileall
# writes their bytecode once, whatever that variable says, and passes over what is up to date (docs/testing.md).
BYTECODE := $(BIN)/python -m compileall -q src tests

test: $(VENV)
	$(BYTECODE)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: $(VENV)
	$(BYTECODE)
	$(BIN)/python -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The fuzzing harness (tests/fuzz, which make test runs with a bounded number of cases per reader),
# FUZZ_FACTOR times as many cases, serially, with the cases run per reader printed (docs/testing.md).
FUZZ_FACTOR ?= 20
fuzz: $(VENV)
	STEADYTUNE_FUZZ_FACTOR=$(FUZZ_FACTOR) $(BIN)/python -m pytest -n 0 -q tests/fuzz --hypothesis-show-statistics $(PYTEST_ARGS)

lint: $(VENV)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m mypy

# Helpers (_*.py) are not benchmarks; gpu_check.py needs a GPU and has its own targets.
bench: $(VENV)
	for b in benchmarks/*.py; do \
	  case $$b in */_*|*/gpu_check.py) continue;; esac; \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; \
	done

# Every CUDA path on a real GPU, < 8 minutes (benchmarks/README.md). On a machine without this
# .venv: python3 benchmarks/gpu_check.py --wheels gpu-wheels --out gpu-check
gpu-check: $(VENV)
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

gpu-check-dry: $(VENV)
	$(BIN)/python benchmarks/gpu_check.py --dry-run --out gpu-check-dry

# Set PYVER to the GPU machine's Python (python3 -V there); WITH_BNB=1 adds bitsandbytes (large).
gpu-wheels: $(VENV)
	PYTHON=$(BIN)/python benchmarks/gpu_wheels.sh gpu-wheels

# The container image (Dockerfile). CONTAINER=podman works too; IMAGE_ARGS passes --build-arg ... (docs/docker.md).
CONTAINER  ?= docker
IMAGE      ?= steadytune:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' src/steadytune/__init__.py)
IMAGE_ARGS ?=
# podman writes OCI images by default, which drop HEALTHCHECK; the docker format keeps it.
image:
	$(CONTAINER) build $(if $(findstring podman,$(CONTAINER)),--format docker) -t $(IMAGE) $(IMAGE_ARGS) .

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
