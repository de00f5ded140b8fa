#!/usr/bin/env bash
# The embedding model's quality–speed evidence, end to end (docs/benchmarks.md "Quality–speed frontier"):
# retrieval quality in fp32 (torch) and int8 (the exported graph in onnxruntime) on three sets, then the
# frontier of each set timed on this machine. Usage:
#
#   scripts/embedding_frontier.sh <embedding run dir> [quality|speed|all]
#
# Results go to results/<run dir name>-retrieval*/ and results/bench/frontier*-<set>.json (MiniLM's keep
# their first names). SETS, RHOS, LIMIT_DOCUMENTS and LONG_LENGTH (BBC's tokens: 512, or the model's
# maximum) narrow a run on a small machine; METHODS (fp32 baselines beside learned: truncation, attention, random), LAYER_EXITS
# (default 3 4 5 of MiniLM's 6 layers); SEQ_LENS: the fixed-length frontier's lengths (default 256);
# CPU_PEERS: the CPU runtimes timed in the same rounds (benchmarks.frontier --cpu-peers, e.g.
# "st-torch onnx onnx-int8 openvino openvino-f32 openvino-int8-static"; OpenVINO's need '.[cpu-peers]').
#
# quality: benchmarks.retrieval (fp32: learned, truncation and layer exit; int8: learned and truncation) → results/
# speed:   benchmarks.frontier per set (needs quality's files; run it on a quiet machine) → results/bench/
# Timings depend on the machine's load: the speed stage runs nothing else beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: scripts/embedding_frontier.sh <embedding run dir> [quality|speed|all]}
STAGE=${2:-all}
NAME=$(basename "$RUN")
TAG=${NAME%-full}; [ "$TAG" = minilm-embed ] && TAG="" || TAG="-$TAG"  # MiniLM's files keep their names
LONG=${LONG_LENGTH:-512}
PY=${PYTHON:-.venv/bin/python}
CACHE=${RETRIEVAL_CACHE:-${HOME}/.cache/retention-retrieval}
RHOS=${RHOS:-"1 0.9 0.8 0.7 0.6 0.5 0.4 0.3 0.2"}  # truncation needs ≥ 6 lengths for the equal-nDCG curve
# set → (extra retrieval arguments, results directory suffix, frontier token length)
# BBC: the first 600 articles (≈ 400 words each, at 512 tokens: a full search of 2,225 takes ~1 h here)
LIMIT=${LIMIT_DOCUMENTS:+--limit-documents $LIMIT_DOCUMENTS}  # SQuAD and SciTLDR: the first N documents
# selection settings instead of the run's (retrieval and frontier), e.g. "--leading-share 0.25 --min-kept-tokens 32"
SCHEDULE=${SCHEDULE:-}
declare -A EXTRA=([squad]="$LIMIT" [scitldr]="--dataset scitldr $LIMIT" [bbc]="--dataset bbc --max-length $LONG --limit-documents 600")
declare -A SUFFIX=([squad]="" [scitldr]="-scitldr" [bbc]="-bbc$LONG")
declare -A LENGTH=([squad]=256 [scitldr]=256 [bbc]=$LONG)
declare -A TIMED=([squad]=64 [scitldr]=64 [bbc]=24)  # real documents per timed call

quality() {
  for set in ${SETS:-squad scitldr bbc}; do
    # shellcheck disable=SC2086
    $PY -m benchmarks.retrieval "$RUN" --out "results/$NAME-retrieval${SUFFIX[$set]}" \
      ${EXTRA[$set]} --cache-dir "$CACHE" --query-rhos --methods ${METHODS:-learned truncation} \
      --rhos $RHOS $SCHEDULE $( [ "$set" = bbc ] || echo --layer-exits ${LAYER_EXITS:-3 4 5} )
    # shellcheck disable=SC2086
    $PY -m benchmarks.retrieval "$RUN" --out "results/$NAME-retrieval${SUFFIX[$set]}-int8" \
      ${EXTRA[$set]} --cache-dir "$CACHE" --query-rhos --methods learned truncation --rhos $RHOS \
      --graph onnx-int8 $SCHEDULE
  done
}

speed() {
  # fixed length: random-word documents of exactly 256 tokens, batch 8 (quality: SQuAD); SETS=… skips it
  if [ -z "${SETS:-}" ]; then
    for len in ${SEQ_LENS:-256}; do
      local at=""; [ "$len" = 256 ] || at="-$len"
      $PY -m benchmarks.frontier --run-dir "$RUN" --retrieval results/$NAME-retrieval/retrieval.json \
        --retrieval-int8 results/$NAME-retrieval-int8/retrieval.json --seq-len "$len" $SCHEDULE \
        --out "results/bench/frontier$TAG$at.json" --plot "docs/plots/frontier$TAG$at.png"
    done
  fi
  for set in ${SETS:-squad scitldr bbc}; do
    local quality="results/$NAME-retrieval${SUFFIX[$set]}"
    # shellcheck disable=SC2086
    $PY -m benchmarks.frontier --run-dir "$RUN" --retrieval "$quality/retrieval.json" \
      --retrieval-int8 "$quality-int8/retrieval.json" --documents "$set" --seq-len "${LENGTH[$set]}" $SCHEDULE \
      --document-count "${TIMED[$set]}" --repeats 5 --iterations 1 ${CPU_PEERS:+--cpu-peers $CPU_PEERS} \
      --out "results/bench/frontier$TAG-$set.json" --plot "docs/plots/frontier$TAG-$set.png"
  done
}

case "$STAGE" in
  quality) quality ;;
  speed) speed ;;
  all) quality && speed ;;
  *) echo "stage: quality, speed or all" >&2; exit 2 ;;
esac
