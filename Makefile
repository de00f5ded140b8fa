# Two commands on a fresh machine: `make serve` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints/cpu.txt
MODELS_DIR ?= models
PROFILE ?= quick
HOST ?= 127.0.0.1
PORT ?= 8000
DEFAULT_RECIPES ?= models/recipes/imdb.yaml models/recipes/squad.yaml models/recipes/scitldr.yaml
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-serve models serve test lint typecheck bench check-install compose-up clean

# torch comes first, pinned by the constraints file (a looser pin pulls a multi-GB CUDA build).
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) torch
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e ".[train,dev]"
	touch $@

install: $(VENV)/.installed

# Serving only: retention_core + service + clients, no torch, no training (what the serving image
# installs, from the same build context; the script checks both absences).
install-serve:
	SERVE_VENV=$(abspath $(VENV)) PYTHON=$(PYTHON) scripts/check_install.sh

# Build every default model that is missing (fit with the quick profile, export, validate).
models: install
	$(BIN)/python -m training build $(DEFAULT_RECIPES) --profile $(PROFILE) --models-dir $(MODELS_DIR)

serve: models
	$(BIN)/python -m service --models-dir $(MODELS_DIR) --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

test: install lint typecheck
	$(BIN)/pytest -q

bench: install
	$(BIN)/python -m benchmarks all

# The serving image's install steps, in a fresh virtual environment (no torch allowed).
check-install:
	scripts/check_install.sh

compose-up:
	docker compose -f deploy/docker-compose.yml up --build -d

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
