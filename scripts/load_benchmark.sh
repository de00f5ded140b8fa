#!/usr/bin/env bash
# Reproduces results/bench/load.{json,md}: our service vs a plain FastAPI + transformers pipeline serving
# the same weights (converted from the training run), same max length, same texts, on loopback.
#   scripts/load_benchmark.sh [RUN_DIR] [MODEL_NAME]
# Needs the train extra (for the checkpoint conversion and the torch baseline) and $MODELS_DIR/<MODEL_NAME>
# (default models/). OUT (default results/bench/load.json) names the result file.
set -euo pipefail
RUN_DIR=${1:-runs/imdb-minilm-quick}
MODEL=${2:-imdb-minilm}
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8000}
BASELINE_PORT=${BASELINE_PORT:-8001}
MODELS_DIR=${MODELS_DIR:-models}
OUT=${OUT:-results/bench/load.json}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1

MAX_LENGTH=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['max_length'])" "$MODELS_DIR/$MODEL/manifest.json")
$PY -m training to-hf "$RUN_DIR" --out "$WORK/hf"
$PY -m service --models-dir "$MODELS_DIR" --port "$PORT" > "$WORK/service.log" 2>&1 &
$PY -m benchmarks.baseline_server --model "$WORK/hf" --max-length "$MAX_LENGTH" --port "$BASELINE_PORT" \
    > "$WORK/baseline.log" 2>&1 &
for _ in $(seq 1 120); do
  if curl -sf "localhost:$PORT/readyz" > /dev/null && curl -sf "localhost:$BASELINE_PORT/livez" > /dev/null; then
    break
  fi
  sleep 1
done
$PY -m benchmarks.load "http://127.0.0.1:$PORT" --baseline-url "http://127.0.0.1:$BASELINE_PORT" \
    --concurrency 1 8 32 --requests 200 --max-seconds 20 --out "$OUT"
