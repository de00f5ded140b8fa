# Two commands on a fresh machine: `make serve` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints/cpu.txt
MODELS_DIR ?= models
PROFILE ?= quick
HOST ?= 127.0.0.1
PORT ?= 8000
# The embedding model comes first: a label-free retrofit, the quickest default to build (`make serve`
# answers with it while the others build in the background and hot-load).
EMBED_RECIPE ?= models/recipes/minilm-embed.yaml
DEFAULT_RECIPES ?= models/recipes/imdb.yaml models/recipes/squad.yaml models/recipes/scitldr.yaml
RELOAD_INTERVAL_S ?= 5
BUILD_LOG ?= logs/build-defaults.log
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-serve models serve test test-fast lint typecheck bench check-install image-test compose-up clean

# torch comes first, pinned by the constraints file (a looser pin pulls a multi-GB CUDA build).
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) torch
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e ".[train,dev,ray]"
	touch $@

install: $(VENV)/.installed

# Serving only: retention_core + service + clients, no torch, no training (what the serving image
# installs, from the same build context; the script checks both absences).
install-serve:
	SERVE_VENV=$(abspath $(VENV)) PYTHON=$(PYTHON) scripts/check_install.sh

# Build every default model that is missing (fit with the quick profile, export, validate).
models: install
	$(BIN)/python -m training build $(EMBED_RECIPE) $(DEFAULT_RECIPES) --profile $(PROFILE) \
		--models-dir $(MODELS_DIR)

# Build the embedding model if missing and serve it; the other defaults build in the background (log:
# $(BUILD_LOG)) and are hot-loaded as each finishes. Ctrl-C stops both.
serve: install
	BIN=$(BIN) MODELS_DIR=$(MODELS_DIR) PROFILE=$(PROFILE) HOST=$(HOST) PORT=$(PORT) \
		FIRST_RECIPES="$(EMBED_RECIPE)" BACKGROUND_RECIPES="$(DEFAULT_RECIPES)" BUILD_LOG=$(BUILD_LOG) \
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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
