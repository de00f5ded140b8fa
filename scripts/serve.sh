#!/usr/bin/env bash
# `make serve`: build the embedding model first (the quickest default: a label-free retrofit) and serve
# it; build the other default models in the background, which the service hot-loads as each one
# finishes (RETENTION_RELOAD_INTERVAL_S). Ctrl-C stops both; an interrupted build resumes next time.
#
#   scripts/serve.sh                                   # what `make serve` runs, with the Makefile's variables
#   BACKGROUND_RECIPES= scripts/serve.sh               # only the embedding model
#   BUILD_LOG=/tmp/build.log PORT=8080 scripts/serve.sh
set -euo pipefail

PY="${BIN:-.venv/bin}/python"
MODELS_DIR="${MODELS_DIR:-models}"
RUNS_DIR="${RUNS_DIR:-runs}"
PROFILE="${PROFILE:-quick}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
FIRST_RECIPES="${FIRST_RECIPES:-models/recipes/minilm-embed.yaml}"
BACKGROUND_RECIPES="${BACKGROUND_RECIPES-models/recipes/imdb.yaml models/recipes/squad.yaml models/recipes/scitldr.yaml}"
BUILD_LOG="${BUILD_LOG:-logs/build-defaults.log}"
export RETENTION_RELOAD_INTERVAL_S="${RETENTION_RELOAD_INTERVAL_S:-5}"

# Recipe lists are space-separated on purpose (unquoted below).
# shellcheck disable=SC2086
"$PY" -m training build $FIRST_RECIPES --profile "$PROFILE" --models-dir "$MODELS_DIR" --runs-dir "$RUNS_DIR"

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
  echo "building the other default models in the background, served as each one finishes: tail -f $BUILD_LOG"
fi
"$PY" -m service --models-dir "$MODELS_DIR" --host "$HOST" --port "$PORT"
