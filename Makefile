# Two commands on a fresh machine: `make serve` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints/cpu.txt
# Hashed locks (`make lock`): the dev/training venv, the training image, the serving image (no torch).
DEV_LOCK ?= constraints/dev.lock.txt
TRAIN_LOCK ?= constraints/train.lock.txt
SERVE_LOCK ?= constraints/serve.lock.txt
PIP_VERSION ?= 26.3
# torch's CPU wheel: PyPI's Linux x86_64 torch is the multi-GB CUDA build, so the lock pins torch==X+cpu
# and pip finds it through find-links (this machine's pip.conf and PIP_FIND_LINKS name /opt/wheels) or
# the PyTorch CPU index: make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_FIND_LINKS ?= $(PIP_FIND_LINKS)
TORCH_INDEX_URL ?=
TORCH_SOURCES = $(foreach dir,$(TORCH_FIND_LINKS),--find-links $(dir))
MODELS_DIR ?= models
PROFILE ?= quick
HOST ?= 127.0.0.1
PORT ?= 8000
# The embedding product: the two-path retrofit (ρ < 1 runs a trained copy of the encoder; ≈ 27 minutes
# of training on 2 cores with the quick profile). `make serve` answers first with the frozen retrofit
# (EMBED_FIRST_RECIPE, ≈ 5 minutes) under the product's name, builds the other defaults and then the
# product in the background, and hot-swaps each in as it lands.
EMBED_RECIPE ?= models/recipes/minilm-embed.yaml
EMBED_FIRST_RECIPE ?= models/recipes/minilm-embed-frozen.yaml
EMBED_MODEL ?= minilm-embed
DEFAULT_RECIPES ?= models/recipes/imdb.yaml models/recipes/squad.yaml models/recipes/scitldr.yaml
RELOAD_INTERVAL_S ?= 5
BUILD_LOG ?= logs/build-defaults.log
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# tests/deploy/test_locks.py checks that this venv holds the dev lock's versions.
export RETENTION_LOCKED_VENV ?= $(abspath $(VENV))

.PHONY: install install-serve lock models serve test test-fast lint typecheck bench check-install image-test compose-up clean

# Every dependency from the hashed lock (exact versions, CPU torch included), then this project on its
# own, editable (--require-hashes admits no unhashed editable install). Reruns when the lock changes.
$(VENV)/.installed: pyproject.toml $(DEV_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "pip==$(PIP_VERSION)"
	$(BIN)/pip install --quiet --require-hashes $(TORCH_SOURCES) \
		$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) -r $(DEV_LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

install: $(VENV)/.installed

# Serving only: retention_core + service + clients, no torch, no training (what the serving image
# installs, from the same build context; the script checks both absences).
install-serve:
	SERVE_VENV=$(abspath $(VENV)) PYTHON=$(PYTHON) scripts/check_install.sh

# Refresh the locks from pyproject.toml and $(CONSTRAINTS) with uv (in its own venv, $(LOCK_VENV)). Pins
# already in a lock stay unless pyproject needs otherwise; `make lock UPGRADE=--upgrade` moves every
# package to its newest allowed version. The training and serving locks take the dev lock's versions,
# so all three hold the same tested versions. Resolved for CPython 3.11 on Linux x86_64 (glibc 2.28+):
# CI's, this machine's and the images' platform. uv reads no pip.conf: the torch CPU wheel comes from
# TORCH_FIND_LINKS (default PIP_FIND_LINKS); the recipe fails if the dev lock's torch is not +cpu.
UV_VERSION ?= 0.13.9
LOCK_VENV ?= .venv-lock
UV := $(LOCK_VENV)/bin/uv
UV_STAMP := $(LOCK_VENV)/.uv-$(UV_VERSION)
UPGRADE ?=
LOCK_PLATFORM := --python-version 3.11 --python-platform x86_64-manylinux_2_28
LOCK_FOR := CPython 3.11, Linux x86_64 (manylinux_2_28); make lock refreshes it
UV_COMPILE = $(UV) pip compile --quiet --generate-hashes $(LOCK_PLATFORM) --custom-compile-command "make lock" $(UPGRADE)

$(UV_STAMP):
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet "uv==$(UV_VERSION)"
	touch $@

lock: $(UV_STAMP)
	$(UV_COMPILE) $(TORCH_SOURCES) pyproject.toml --extra train --extra dev --extra ray -c $(CONSTRAINTS) \
		-o $(DEV_LOCK)
	@grep -q '^torch==.*+cpu ' $(DEV_LOCK) || { echo "$(DEV_LOCK): torch is not the CPU build;" \
		"name a directory holding its wheel: make lock TORCH_FIND_LINKS=..." >&2; exit 1; }
	$(UV_COMPILE) $(TORCH_SOURCES) pyproject.toml --extra train -c $(CONSTRAINTS) -c $(DEV_LOCK) -o $(TRAIN_LOCK)
	$(UV_COMPILE) pyproject.toml -c $(DEV_LOCK) -o $(SERVE_LOCK)
	sed -i '2a # $(LOCK_FOR). The dev/training venv (make install): base + [train,dev,ray], torch per $(CONSTRAINTS) (+cpu).' \
		$(DEV_LOCK)
	sed -i '2a # $(LOCK_FOR). The training image (Dockerfile, target train): base + [train], versions of $(DEV_LOCK).' \
		$(TRAIN_LOCK)
	sed -i '2a # $(LOCK_FOR). The serving image (Dockerfile, check-install): base only, no torch.' \
		$(SERVE_LOCK)

# Build every default model that is missing (fit with the quick profile, export, validate).
models: install
	$(BIN)/python -m training build $(EMBED_RECIPE) $(DEFAULT_RECIPES) --profile $(PROFILE) \
		--models-dir $(MODELS_DIR)

# Build the frozen embedding model if no $(EMBED_MODEL) is there and serve it as $(EMBED_MODEL); the other
# defaults, then the two-path $(EMBED_MODEL), build in the background (log: $(BUILD_LOG)) and are
# hot-loaded as each finishes. Ctrl-C stops both.
serve: install
	BIN=$(BIN) MODELS_DIR=$(MODELS_DIR) PROFILE=$(PROFILE) HOST=$(HOST) PORT=$(PORT) \
		FIRST_RECIPES="$(EMBED_FIRST_RECIPE)" FIRST_STAND_IN_FOR="$(EMBED_MODEL)" \
		BACKGROUND_RECIPES="$(DEFAULT_RECIPES) $(EMBED_RECIPE)" BUILD_LOG=$(BUILD_LOG) \
		RETENTION_RELOAD_INTERVAL_S=$(RELOAD_INTERVAL_S) scripts/serve.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

test: install lint typecheck
	$(BIN)/pytest -q --durations=15

# The unit and in-process tests only (no subprocess servers, locust, Prometheus, chromium, venv builds).
test-fast: install
	$(BIN)/pytest -q -m "not integration" --durations=15

bench: install
	$(BIN)/python -m benchmarks all

# The serving image's install steps, in a fresh virtual environment (no torch allowed).
check-install:
	scripts/check_install.sh

# The images built and run for real with podman (scripts/image_test.py; docs/deploy.md "Images built and
# run for real"): needs root, podman, runc and debootstrap (.ci/run installs them). podman-compose from
# PyPI: Debian's 1.0.3 cannot read the compose file. Timings: results/bench/image_test_{cold,warm}.json.
PODMAN_COMPOSE_VERSION ?= 1.5.0
IMAGE_TEST_TIMEOUT_S ?= 1200
image-test: install
	$(BIN)/pip install --quiet "podman-compose==$(PODMAN_COMPOSE_VERSION)"
	timeout $(IMAGE_TEST_TIMEOUT_S) $(BIN)/python scripts/image_test.py

compose-up:
	docker compose -f deploy/docker-compose.yml up --build -d

clean:
	rm -rf $(VENV) $(LOCK_VENV) .pytest_cache .mypy_cache .ruff_cache
