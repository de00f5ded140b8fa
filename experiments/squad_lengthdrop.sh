#!/usr/bin/env bash
# The QA LengthDrop study's runs, in order, each resumable (docs/experiments/2026-11-26-qa-lengthdrop.md):
# a stage with weights is skipped, one with a checkpoint resumes, then each is evaluated on the same
# 2,000 SQuAD dev questions (paired with the teacher's dense scores). Long on 2 CPU cores: run it nice'd,
# RETENTION_RUNS_DIR outside the work tree; rerun the same command after an interruption.
#   RETENTION_RUNS_DIR=/root/retention-runs nice -n 19 bash experiments/squad_lengthdrop.sh
# PRECISION=bf16 trains with bf16 autocast (1.75x faster a step on this machine's AMX cores: experiments.train_step); evaluation is fp32.
# The warmup, lengthdrop-pilot and answer-block stages' objective terms were removed from the product
# after commit 3614e43 (experiments/recipes/squad-teacher.yaml's header): rerun this at that commit,
#   git checkout 3614e43523840edc2bd7516f4b85629af797adac
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=experiments/recipes/squad-teacher.yaml
RUNS=${RETENTION_RUNS_DIR:?set RETENTION_RUNS_DIR (outside the work tree)}
OUT=${OUT:-results/experiments/qa-lengthdrop}
PY=${PYTHON:-python}
PRECISION=${PRECISION:-fp32}
LIMIT=2000

fit() {  # fit <profile>: skip a finished run, resume an interrupted one
  local run="$RUNS/squad-minilm-$1"
  if [ -f "$run/weights.safetensors" ]; then return; fi
  local resume=()
  if [ -f "$run/checkpoint.pt" ]; then resume=(--resume); fi
  HF_HUB_OFFLINE=1 "$PY" -m training fit "$RECIPE" --profile "$1" --precision "$PRECISION" "${resume[@]}"
}

evaluate() {  # evaluate <profile> <out name> <args...>: once per output directory
  local profile=$1 name=$2
  shift 2
  if [ -f "$OUT/$name/eval.json" ]; then return; fi
  HF_HUB_OFFLINE=1 "$PY" -m training evaluate "$RUNS/squad-minilm-$profile" --split test --limit "$LIMIT" \
    --out "$OUT/$name" "$@"
}

survival() {  # survival <profile>: answer survival at rho 0.5 and 0.3 (500 questions), once
  if [ -f "$OUT/$1/answer_survival.json" ]; then return; fi
  HF_HUB_OFFLINE=1 "$PY" -m experiments.answer_survival "$RUNS/squad-minilm-$1" --rhos 0.5 0.3 \
    --out "$OUT/$1/answer_survival.json"
}

rule() {  # rule <profile>: the plan's stop rule against the calibrated chain, once
  if [ -f "$OUT/$1/rule.json" ]; then return; fi
  "$PY" -m experiments.qa_pilot_rule "$OUT/$1" --out "$OUT/$1/rule.json"
}

fit teacher
evaluate teacher teacher --rhos 1.0 --methods learned
fit warmup
evaluate warmup warmup --rhos 1.0 0.5 0.3 --methods learned attention \
  --paired-reference "$OUT/teacher"
fit lengthdrop-pilot
evaluate lengthdrop-pilot lengthdrop-pilot --rhos 1.0 0.7 0.5 0.3 0.2 --methods learned attention random truncation \
  --paired-reference "$OUT/teacher"
survival lengthdrop-pilot
rule lengthdrop-pilot
fit answer-block  # step 3, the plan's fallback (its own rule, in the study)
evaluate answer-block answer-block --rhos 1.0 0.7 0.5 0.3 0.2 --methods learned attention \
  --paired-reference "$OUT/teacher"
evaluate answer-block answer-block-baselines --rhos 0.5 0.3 --methods random truncation \
  --paired-reference "$OUT/teacher"
survival answer-block
rule answer-block
# Layer exit on the same weights (the dense model stopped after the layer count nearest each ρ's
# token-work: 4 of 6 at ρ 0.5, 3 at 0.3), the cheap baseline the study had not measured.
evaluate answer-block answer-block-layer-exit --rhos 0.5 0.3 --methods layer_exit \
  --paired-reference "$OUT/teacher"
