#!/usr/bin/env bash
# onnxruntime-gpu for a lent GPU machine that reaches no package index (docs/benchmarks.md, "GPU").
# Its wheel (~240 MiB) is larger than what one device call carries (64 MiB with the working tree, ~6 MiB),
# so it travels in pieces, one per call while the machine stays warm, and is joined there.
#
#   scripts/gpu_wheel.sh download   # here: the wheel → .gpu/download/, and the small wheels the
#                                   #   device image lacks (pydantic and its needs) → .gpu/wheels/
#   scripts/gpu_wheel.sh split      # here: .gpu/pieces/<wheel>.part-NN (≤ PIECE_MIB each) + .sha256,
#                                   #   and the carry list of each device call
#   scripts/gpu_wheel.sh join       # there: join, check the checksum, pip install every wheel into
#                                   #   $SITE (then: export PYTHONPATH=$SITE)
#
# Settings (environment): GPU_DIR (default .gpu, git-ignored), PIECE_MIB (50), ORT_GPU_VERSION (default:
# the newest onnxruntime-gpu not newer than this venv's onnxruntime), DEVICE_PYTHON (3.12, the device
# image's), PYTHON (python3; here: a Python with pip and onnxruntime), SITE (/tmp/site).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_DIR="${GPU_DIR:-$ROOT/.gpu}"
# 64 MiB a call, less the working tree (~6 MiB) and the first call's .gpu/wheels and .gpu/assets (~5 MiB).
PIECE_MIB="${PIECE_MIB:-50}"
DEVICE_PYTHON="${DEVICE_PYTHON:-3.12}"
PYTHON="${PYTHON:-python3}"
SITE="${SITE:-/tmp/site}"
# What the project imports that the device image (torch, transformers, onnx, numpy, … ) does not hold.
SMALL_PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)

usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

# pip download for the device's Python and platform, not this machine's.
device_download() {
    local dest="$1"
    shift
    local platform_flags=()
    for platform in "${PLATFORMS[@]}"; do platform_flags+=(--platform "$platform"); done
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
        --python-version "$DEVICE_PYTHON" "${platform_flags[@]}" -d "$dest" "$@"
}

installed_version() {
    "$PYTHON" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1"
}

cmd_download() {
    local spec
    if [[ -n "${ORT_GPU_VERSION:-}" ]]; then
        spec="onnxruntime-gpu==$ORT_GPU_VERSION"
    else
        # The GPU build of a release is published after the CPU one: take the newest not newer.
        spec="onnxruntime-gpu<=$(installed_version onnxruntime)"
    fi
    device_download "$GPU_DIR/download" "$spec"
    local small=()
    for package in "${SMALL_PACKAGES[@]}"; do small+=("$package==$(installed_version "$package")"); done
    device_download "$GPU_DIR/wheels" "${small[@]}"
    ls -l "$GPU_DIR/download" "$GPU_DIR/wheels"
}

cmd_split() {
    local wheel="${1:-}"
    if [[ -z "$wheel" ]]; then
        local downloaded=("$GPU_DIR"/download/*.whl)
        [[ ${#downloaded[@]} -eq 1 && -e "${downloaded[0]}" ]] || {
            echo "need exactly one wheel in $GPU_DIR/download (run download), or name it" >&2
            exit 1
        }
        wheel="${downloaded[0]}"
    fi
    local name pieces="$GPU_DIR/pieces"
    name="$(basename "$wheel")"
    rm -rf "$pieces"
    mkdir -p "$pieces"
    (cd "$(dirname "$wheel")" && sha256sum "$name") >"$pieces/$name.sha256"
    split --bytes="${PIECE_MIB}M" --numeric-suffixes --suffix-length=2 "$wheel" "$pieces/$name.part-"
    local relative="${GPU_DIR#"$ROOT"/}" call=1
    for piece in "$pieces/$name".part-*; do
        local carry="\"$relative/pieces/$(basename "$piece")\""
        if [[ $call -eq 1 ]]; then  # the small things travel once, with the first piece
            carry="\"$relative/wheels\", \"$relative/assets\", \"$relative/pieces/$name.sha256\", $carry"
        fi
        echo "device call $call carries: [$carry]"
        call=$((call + 1))
    done
}

cmd_join() {
    local joined="$GPU_DIR/joined" found=0
    mkdir -p "$joined"
    for checksum in "$GPU_DIR"/pieces/*.sha256; do
        [[ -e "$checksum" ]] || break
        local name
        name="$(basename "$checksum" .sha256)"
        # Two-digit suffixes: the shell's sorted glob is the split order.
        cat "$GPU_DIR/pieces/$name".part-* >"$joined/$name"
        (cd "$joined" && sha256sum --check --quiet "$checksum") || {
            echo "$name: checksum mismatch (a piece missing or not carried?)" >&2
            exit 1
        }
        found=1
    done
    [[ $found -eq 1 ]] || { echo "no pieces in $GPU_DIR/pieces" >&2; exit 1; }
    local wheels=("$joined"/*.whl)
    if compgen -G "$GPU_DIR/wheels/*.whl" >/dev/null; then wheels+=("$GPU_DIR"/wheels/*.whl); fi
    # --target, not the image's environment: $SITE on PYTHONPATH shadows its CPU onnxruntime.
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"
    echo "installed ${#wheels[@]} wheel(s) into $SITE: export PYTHONPATH=$SITE"
}

case "${1:-}" in
    download) cmd_download ;;
    split) cmd_split "${2:-}" ;;
    join) cmd_join ;;
    *) usage ;;
esac
