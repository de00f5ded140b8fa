#!/usr/bin/env bash
# `make serve`: build the first model (the quickest default: the frozen embedding retrofit, ≈ 5 minutes
# on 2 cores) and serve it under the embedding product's name (FIRST_STAND_IN_FOR); build the other
# default models in the background, which the service hot-loads as each one finishes
# (RETENTION_RELOAD_INTERVAL_S). The last of them is the embedding product itself, the two-path model
# (≈ 27 minutes): its export swaps it into the stand-in's directory in one rename and the service
# reloads it in place. Ctrl-C stops both; an interrupted build resumes next time.
#
#   scripts/serve.sh                                   # what `make serve` runs, with the Makefile's variables
#   BACKGROUND_RECIPES= scripts/serve.sh               # only the first (frozen) embedding model
#   BUILD_LOG=/tmp/build.log PORT=8080 scripts/serve.sh
set -euo pipefail

PY="${BIN:-.venv/bin}/python"
MODELS_DIR="${MODELS_DIR:-models}"
RUNS_DIR="${RUNS_DIR:-runs}"
PROFILE="${PROFILE:-quick}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
FIRST_RECIPES="${FIRST_RECIPES:-models/recipes/minilm-embed-frozen.yaml}"
# The first recipe's model serves under this name until that name's own recipe (in BACKGROUND_RECIPES)
# replaces it; empty: it serves under its own name.
FIRST_STAND_IN_FOR="${FIRST_STAND_IN_FOR-minilm-embed}"
# Shortest first: every endpoint answers before the embedding model is upgraded.
BACKGROUND_RECIPES="${BACKGROUND_RECIPES-models/recipes/imdb.yaml models/recipes/squad.yaml models/recipes/scitldr.yaml models/recipes/minilm-embed.yaml}"
BUILD_LOG="${BUILD_LOG:-logs/build-defaults.log}"
export RETENTION_RELOAD_INTERVAL_S="${RETENTION_RELOAD_INTERVAL_S:-5}"

stand_in=()
if [[ -n "$FIRST_STAND_IN_FOR" ]]; then
  stand_in=(--stand-in-for "$FIRST_STAND_IN_FOR")
fi
# Recipe lists are space-separated on purpose (unquoted below).
# shellcheck disable=SC2086
"$PY" -m training build $FIRST_RECIPES "${stand_in[@]}" --profile "$PROFILE" --models-dir "$MODELS_DIR" \
  --runs-dir "$RUNS_DIR"

builder=""
stop_builder() {
  # Started in the background by a non-interactive shell, the builder ignores Ctrl-C: stop it here.
  if [[ -n "$builder" ]] && kill -0 "$builder" 2>/dev/null; then
    kill -TERM "$builder" 2>/dev/null || true
    wait "$builder" 2>/dev/null || true
    echo "background build stopped; the next make serve resumes it (log: $BUILD_LOG)"
  fi
}
trap stop_builder EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n "$BACKGROUND_RECIPES" ]]; then
  mkdir -p "$(dirname "$BUILD_LOG")"
  # shellcheck disable=SC2086
  nice -n 10 "$PY" -m training build $BACKGROUND_RECIPES --profile "$PROFILE" --models-dir "$MODELS_DIR" \
    --runs-dir "$RUNS_DIR" >"$BUILD_LOG" 2>&1 &
  builder=$!
  echo "building the other default models in the background, each served as it lands (the two-path" \
    "embedding model last, swapped in for the first one): tail -f $BUILD_LOG"
fi
"$PY" -m service --models-dir "$MODELS_DIR" --host "$HOST" --port "$PORT"
