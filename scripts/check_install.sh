#!/usr/bin/env bash
# Performs the serving image's install steps (Dockerfile stage `serve-build`) in a fresh virtualenv,
# without a Docker engine: the same build context (the stage's COPY sources, filtered by
# .dockerignore's allowlist) and the same two pip steps (the hashed lock constraints/serve.lock.txt, then
# `--no-deps .`); then checks that the core and the service import, that neither torch nor the training
# package is importable, and that the installed versions are the lock's.
#
#   scripts/check_install.sh                # uses python3; PYTHON=/path/to/python3.11 to choose
#   KEEP=1 scripts/check_install.sh         # keep the temporary directory for inspection
#   SERVE_VENV=.venv-serve scripts/check_install.sh   # install into (and keep) this virtualenv
#   VARIANT=gpu scripts/check_install.sh    # also the GPU swap (downloads ~1.5 GB of CUDA wheels)
#
# pip's cache is used (not the Dockerfile's PIP_NO_CACHE_DIR) so repeated runs are fast; only
# the package index is needed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-install.XXXXXX")"
if [[ "${KEEP:-0}" != "1" ]]; then
  trap 'rm -rf "$WORK"' EXIT
fi
CTX="$WORK/src"
VENV="${SERVE_VENV:-$WORK/venv}"  # SERVE_VENV=dir keeps the installed venv (make install-serve)
mkdir -p "$CTX"

step() { printf '==> %s\n' "$*"; }

# 1. The build context of stage serve-build: every source of its COPY lines.
mapfile -t SOURCES < <(
  awk '
    /^FROM / { in_stage = ($0 ~ / AS serve-build$/) ; next }
    in_stage && /^COPY / && $0 !~ /--from=/ { for (i = 2; i < NF; i++) print $i }
  ' "$REPO/Dockerfile"
)
if [[ ${#SOURCES[@]} -eq 0 ]]; then
  echo "no COPY lines found in stage serve-build of $REPO/Dockerfile" >&2
  exit 1
fi
step "build context: ${SOURCES[*]}"
shopt -s nullglob
for pattern in "${SOURCES[@]}"; do
  # shellcheck disable=SC2206  # the Dockerfile's sources are globs on purpose (README*)
  matches=("$REPO"/$pattern)
  for path in "${matches[@]}"; do
    rel="${path#"$REPO"/}"
    mkdir -p "$CTX/$(dirname "$rel")"
    cp -R "$path" "$CTX/$rel"
  done
done
shopt -u nullglob
find "$CTX" \( -name __pycache__ -o -name '*.pyc' -o -name '*.egg-info' \) -prune -exec rm -rf {} +

# 2. The stage's install step.
step "fresh virtualenv with $("$PYTHON" --version 2>&1)"
"$PYTHON" -m venv "$VENV"
# As in the Dockerfile: the dependencies from the hashed lock first (their own image layer), then this
# project with --no-deps. (The grep drops pip's warnings about local index locations that this
# machine's pip.conf names.)
LOCK=constraints/serve.lock.txt
step "pip install --require-hashes -r $LOCK, then pip install --no-compile --no-deps .  (as in the Dockerfile)"
(cd "$CTX" && "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile --require-hashes -r "$LOCK" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2))
(cd "$CTX" && "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile --no-deps . \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2))

if [[ "${VARIANT:-cpu}" == "gpu" ]]; then
  ORT_GPU="$(sed -n 's/^ARG ONNXRUNTIME_GPU="\(.*\)"$/\1/p' "$REPO/Dockerfile")"
  step "VARIANT=gpu: swap onnxruntime for $ORT_GPU (as in the Dockerfile)"
  "$VENV/bin/pip" uninstall --quiet --yes onnxruntime
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile "$ORT_GPU"
  "$VENV/bin/python" -c "import onnxruntime as ort; assert 'CUDAExecutionProvider' in ort.get_available_providers(), ort.get_available_providers()"
fi

# 3. What the image promises. Run from outside the context so the installed copy is imported.
cd "$WORK"
step "import retention_core and service (and their runtime dependencies)"
"$VENV/bin/python" -c "import retention_core, service, onnxruntime, tokenizers, fastapi, uvicorn, prometheus_client; print('service from', service.__file__)"
"$VENV/bin/python" -c "import service.api.app, service.backends.onnx_backend, retention_core.tasks"
HAS_CLIENTS=0
if "$VENV/bin/python" -c "import clients.batch" 2>/dev/null; then
  HAS_CLIENTS=1
  step "clients.batch importable"
else
  step "note: the clients package is not installed (add clients* to pyproject's packages.find)"
fi
step "torch must NOT be importable"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "FAIL: torch is importable in the serving install" >&2
  exit 1
fi
step "training must NOT be importable"
if "$VENV/bin/python" -c "import training" 2>/dev/null; then
  echo "FAIL: the training package is importable in the serving install" >&2
  exit 1
fi
step "pip check"
"$VENV/bin/pip" check --disable-pip-version-check
if [[ "${VARIANT:-cpu}" != "gpu" ]]; then  # gpu: onnxruntime-gpu replaces the lock's onnxruntime
  step "installed versions are exactly those of $LOCK"
  "$VENV/bin/pip" freeze --disable-pip-version-check --exclude-editable > "$WORK/freeze.txt"
  "$VENV/bin/python" - "$CTX/$LOCK" "$WORK/freeze.txt" <<'PY'
import re, sys
def pins(path):
    found = (re.match(r"([A-Za-z0-9._-]+)==(\S+)", line) for line in open(path))
    return {re.sub(r"[-_.]+", "-", m[1]).lower(): m[2] for m in found if m}
lock, have = pins(sys.argv[1]), pins(sys.argv[2])
have = {name: v for name, v in have.items() if name in lock or name not in {"pip", "setuptools", "wheel"}}
if lock != have:
    sys.exit(f"not the lock's versions: lock only {sorted(lock.items() - have.items())}, "
             f"installed only {sorted(have.items() - lock.items())}")
PY
fi
if [[ "$HAS_CLIENTS" == "1" && -x "$VENV/bin/retention-batch" ]]; then
  step "retention-batch --help"
  "$VENV/bin/retention-batch" --help >/dev/null
fi
step "OK: serving install works without torch or training"
