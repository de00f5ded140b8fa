#!/usr/bin/env bash
# The GPU check as one prepared device call (docs/benchmarks.md, "GPU"): python -m benchmarks.gpu (the
# serving forward written for the GPU, retention_torch, vs dense SDPA eager and as a CUDA graph: MiniLM
# and base shapes, fp32/bf16, batch 1/8/32/128 x 256/512, peak memory, kernels and host ms per forward)
# on a lent machine that reaches no package index.
# Then the service part (GPU_CHECK_SERVICE=1, the default): python -m benchmarks.gpu_service, the real
# server (torch backend, bf16) against sentence-transformers behind FastAPI on the same card, through
# real HTTP with 8 and 64 clients, in the last GPU_CHECK_SERVICE_S seconds of the budget.
#
#   scripts/gpu_check.sh prepare          # here: .gpu-check/ (git-ignored, <= 64 MiB): the wheels the
#                                         #   device image may lack (the service's too), the tokenizer,
#                                         #   SQuAD dev paragraphs, SHA256SUMS; prints
#                                         #   its size and the device call's carry
#   scripts/gpu_check.sh run              # there: check the image, install the carried wheels (no
#                                         #   network: pip --no-index --target), run the forward, then
#                                         #   the service part, inside the time budget; JSON under
#                                         #   $OUT/gpu-check/ (gpu.json, gpu_service.json)
#   scripts/gpu_check.sh run --dry-run    # the same script on this CPU with tiny sizes (also:
#                                         #   GPU_CHECK_DRY_RUN=1); tests/deploy/test_gpu_check.py
#   scripts/gpu_check.sh imports FILE     # the installed-phase check alone (what run records under
#                                         #   "installed"): every top-level module of every carried
#                                         #   distribution in $GPU_CHECK_SITE and sentence-transformers;
#                                         #   exit 1 when one fails
#
# Settings (environment): GPU_CHECK_DIR (.gpu-check), GPU_CHECK_PYTHON (3.12: the device image's Python,
# the one the binary wheels are for), GPU_CHECK_WHEELS (space-separated distributions; default below),
# PYTHON (python3; prepare: a Python with pip and this project's packages, e.g. .venv/bin/python),
# OUT (results; default ./gpu-check-out), GPU_CHECK_SITE (/tmp/gpu-check-site), GPU_CHECK_BUDGET_S
# (480: the whole run, start to end),
# GPU_CHECK_SERVICE (1; 0 leaves the service part out), GPU_CHECK_SERVICE_S (220: of the budget, kept for
# the service part), GPU_CHECK_SERVICE_ARGS (more options for benchmarks.gpu_service, e.g. --shapes minilm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECK_DIR="${GPU_CHECK_DIR:-$ROOT/.gpu-check}"
DEVICE_PYTHON="${GPU_CHECK_PYTHON:-3.12}"
PYTHON="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu-check-site}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
SERVICE="${GPU_CHECK_SERVICE:-1}"
SERVICE_S="${GPU_CHECK_SERVICE_S:-220}"
MAX_MIB=64
# What the parts import beyond torch and numpy (which the image's torch brings): our pins of the Hugging
# Face stack (the image's may be another major version), pydantic (the recipes), PyYAML. Installed whole
# into $SITE, ahead of the image's site-packages. onnxruntime (CPU; retention_ort) and onnx
# (training.export) are the image's own: their 28 MiB wheel would push the call past its 64 MiB with
# the working tree. The service part's server stack (the image has none of fastapi, starlette, uvicorn,
# pydantic-settings, python-dotenv, opentelemetry-api (fastapi imports it), sniffio (anyio imports it));
# prometheus-client, annotated-doc, httpx and httpcore it has, maybe at other versions: ours travel, a few
# hundred KiB. psutil, numpy, torch and sentence-transformers (the peer) are the image's.
DEFAULT_WHEELS="pydantic pydantic-core annotated-types typing-inspection typing-extensions pyyaml
flatbuffers protobuf packaging transformers tokenizers huggingface-hub safetensors regex
tqdm filelock fsspec httpx2 httpcore2 h11 anyio idna truststore click
fastapi starlette uvicorn pydantic-settings python-dotenv opentelemetry-api annotated-doc sniffio
prometheus-client httpx httpcore"
read -r -a WHEELS <<<"$(echo "${GPU_CHECK_WHEELS:-$DEFAULT_WHEELS}" | tr '\n' ' ')"
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)

usage() {
    sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

relative() { # a path as the run tool's carry names it: relative to the repository root
    case "$1" in
        "$ROOT"/*) echo "${1#"$ROOT"/}" ;;
        *) echo "$1" ;;
    esac
}

mib() { echo $((($1 + 1048575) / 1048576)); }

cmd_prepare() {
    rm -rf "$CHECK_DIR"
    mkdir -p "$CHECK_DIR/wheels"
    local platform_flags=() specs=() package version
    for platform in "${PLATFORMS[@]}"; do platform_flags+=(--platform "$platform"); done
    for package in "${WHEELS[@]}"; do
        version="$("$PYTHON" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$package")"
        specs+=("$package==$version")
    done
    # For the device's Python and platform, not this machine's; --no-deps: the list is the closure.
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
        --python-version "$DEVICE_PYTHON" "${platform_flags[@]}" -d "$CHECK_DIR/wheels" "${specs[@]}"
    # The tokenizer and the service part's documents, SQuAD dev paragraphs (no package, no data there).
    (cd "$ROOT" && "$PYTHON" -m benchmarks.gpu_service --write-assets "$CHECK_DIR/assets")
    local commit
    commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$PYTHON" - "$CHECK_DIR" "$DEVICE_PYTHON" "$commit" "${specs[@]}" <<'EOF'
import json, sys, time
from pathlib import Path

directory, python, commit, *specs = sys.argv[1:]
manifest = {
    "device_python": python,
    "commit": commit,
    "prepared": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "wheels": sorted(p.name for p in (Path(directory) / "wheels").glob("*.whl")),
    "requirements": specs,
}
(Path(directory) / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
EOF
    local sums
    sums="$(cd "$CHECK_DIR" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum)"
    printf '%s\n' "$sums" >"$CHECK_DIR/SHA256SUMS"
    local bytes tree
    bytes="$(du -sb "$CHECK_DIR" | cut -f1)"
    tree="$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } 2>/dev/null |
        xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1 || echo 0)"
    echo "$(relative "$CHECK_DIR"): $(mib "$bytes") MiB ($bytes bytes; the working tree: $(mib "${tree:-0}") MiB)"
    if ((bytes + ${tree:-0} > MAX_MIB * 1048576)); then
        echo "over $MAX_MIB MiB with the working tree: one device call cannot carry it (set GPU_CHECK_WHEELS to fewer)" >&2
        exit 1
    fi
    echo "carry: [\"$(relative "$CHECK_DIR")\"]"
}

# The image, as the device call finds it (phase "image") and after the install (phase "installed": the
# code path, every top-level module of every carried distribution, and sentence-transformers, the image's
# own, under the carried transformers that shadows the image's).
image_check() {
    "$PYTHON" - "$1" "$2" "$DRY_RUN" "$CHECK_DIR" "$SITE" "${WHEELS[@]}" <<'EOF'
import importlib, json, platform, sys
from importlib import metadata
from pathlib import Path

path, phase, dry_run, check_dir, site, *wheels = sys.argv[1:]
report = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
found = {"python": platform.python_version(), "executable": sys.executable}
names = ["torch", "numpy", "transformers", "tokenizers", "onnx", "onnxruntime", "onnxruntime-gpu", *wheels]
found["versions"] = {name: version(name) for name in dict.fromkeys(names)}
try:
    import torch

    found["torch_cuda"] = torch.version.cuda
    found["cuda_available"] = torch.cuda.is_available()
    found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    found["bf16"] = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else None
except Exception as exc:  # no torch at all: say so, the benchmark then fails on its own
    found["torch_error"] = f"{type(exc).__name__}: {exc}"
    found["cuda_available"] = False
def top_level(dist):
    """The importable top-level names a distribution installs (top_level.txt, else its RECORD)."""
    listed = (dist.read_text("top_level.txt") or "").split()
    if not listed:
        paths = [str(p) for p in dist.files or []]
        listed = {p.split("/")[0].removesuffix(".py") for p in paths if p.endswith(".py")}
    return sorted(n for n in listed if n.isidentifier() and not n.startswith("_"))

def origin(module):
    where = str(getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), ""))
    return "carried" if where.startswith(str(Path(site).resolve())) or where.startswith(site) else "image"

def try_import(name):
    try:
        module = importlib.import_module(name)
        return {"ok": True, "from": origin(module)}
    except Exception as exc:  # record, never raise: the device's minutes are few
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

if phase == "installed":
    failed = []
    try:  # the code path the benchmark runs, imported from $SITE and the checkout
        import benchmarks.gpu, benchmarks.gpu_forward, retention_torch.runner  # noqa: F401
        # the service part: our server's stack (carried) and the peer's (the image's)
        import benchmarks.gpu_service, service.api.app, service.backends.torch_backend, uvicorn  # noqa: F401
    except Exception as exc:
        failed.append(f"code path: {type(exc).__name__}: {exc}")
    carried = {}
    for dist in sorted(metadata.distributions(path=[site]), key=lambda d: d.metadata["Name"].lower()):
        modules = {name: try_import(name) for name in top_level(dist)}
        carried[dist.metadata["Name"]] = {"version": dist.version, "modules": modules}
        failed += [f"{name} ({dist.metadata['Name']}): {m['error']}" for name, m in modules.items() if not m["ok"]]
    found["carried_imports"] = carried
    peer = try_import("sentence_transformers")  # the image's, importing the carried transformers
    if peer["ok"]:
        import sentence_transformers, transformers

        peer.update(version=sentence_transformers.__version__, transformers=transformers.__version__,
                    transformers_from=origin(transformers))
        try:
            sentence_transformers.SentenceTransformer  # noqa: B018 (what benchmarks.st_peer builds)
        except Exception as exc:
            peer.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    if not peer["ok"]:
        failed.append(f"sentence_transformers: {peer['error']}")
    found["sentence_transformers"] = peer
    found["imports"] = "ok" if not failed else "failed: " + "; ".join(failed)
manifest = Path(check_dir) / "manifest.json"
if phase == "image" and manifest.is_file():  # binary wheels install only on the Python they are for
    wanted = json.loads(manifest.read_text())["device_python"]
    found["wheels_python"] = wanted
    found["python_matches_wheels"] = platform.python_version().startswith(wanted + ".")
report[phase] = found
report["dry_run"] = dry_run == "1"
Path(path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
print(f"{phase}: python {found['python']}, cuda {found.get('cuda_available')}, "
      + ", ".join(f"{k} {v}" for k, v in found["versions"].items() if k in names[:7]))
EOF
}

record() { # record KEY VALUE into the image check (a string)
    "$PYTHON" - "$IMAGE" "$1" "$2" <<'EOF'
import json, sys
from pathlib import Path

path, key, value = sys.argv[1:]
report = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
report[key] = value
Path(path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
EOF
}

install_wheels() {
    rm -rf "$SITE"
    mkdir -p "$SITE"
    local wheels=("$CHECK_DIR"/wheels/*.whl)
    if [[ ! -e "${wheels[0]}" ]]; then
        record install "nothing carried"
        return
    fi
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        # never the network: only the carried wheels, into $SITE (ahead of the image's site-packages)
        if "$PYTHON" -m pip install --quiet --no-index --find-links "$CHECK_DIR/wheels" --no-deps \
            --no-compile --disable-pip-version-check --target "$SITE" "${wheels[@]}"; then
            record install "pip --no-index --target: ${#wheels[@]} wheels"
        else
            record install "failed: pip install (a wheel for another Python than $("$PYTHON" -V 2>&1)?)"
        fi
    else # an image without pip: a wheel is a zip laid out for site-packages
        "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
            "$SITE" "${wheels[@]}"
        record install "no pip in the image: ${#wheels[@]} wheels unzipped"
    fi
}

# The service part (benchmarks.gpu_service) in what is left of the budget; its servers are killed by
# process group afterwards, whatever stopped it (a server in a session of its own outlives the call).
service_part() {
    local out="$1" started="$2"
    local left=$((BUDGET_S - (SECONDS - started) - 15))
    if ((left < 60)); then
        echo "service part: not run, ${left} s left of ${BUDGET_S} s" | tee -a "$out/run.log"
        return 1
    fi
    local flags=()
    [[ "$DRY_RUN" == 1 ]] && flags=(--dry-run)
    local extra=()
    read -r -a extra <<<"${GPU_CHECK_SERVICE_ARGS:-}"
    local pids="${SITE%/}.service-pids" rc=0
    rm -f "$pids"
    echo "service part: ${left} s" | tee -a "$out/run.log"
    (cd "$ROOT" && timeout --signal=INT --kill-after=15 $((left + 30)) "$PYTHON" -m benchmarks.gpu_service \
        --out "$out" --assets "$CHECK_DIR/assets" --budget-s "$left" --pid-file "$pids" "${flags[@]}" \
        "${extra[@]}") 2>&1 | tee -a "$out/run.log" || rc=$?
    if [[ -f "$pids" ]]; then
        while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done <"$pids"
        rm -f "$pids"
    fi
    return "$rc"
}

cmd_run() {
    DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
    [[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
    local started=$SECONDS
    local out="${OUT:-$ROOT/gpu-check-out}/gpu-check"
    mkdir -p "$out"
    IMAGE="$out/image.json"
    rm -f "$IMAGE"
    if [[ -f "$CHECK_DIR/SHA256SUMS" ]] && (cd "$CHECK_DIR" && sha256sum --quiet -c SHA256SUMS); then
        record carried "checksums ok: $(relative "$CHECK_DIR")"
    else
        record carried "failed: $(relative "$CHECK_DIR") missing or its checksums differ (run prepare, carry it)"
    fi
    image_check "$IMAGE" image
    install_wheels
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    if [[ -z "${GIT_COMMIT:-}" && -f "$CHECK_DIR/manifest.json" ]]; then
        GIT_COMMIT="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"])' \
            "$CHECK_DIR/manifest.json")"
        export GIT_COMMIT
    fi
    image_check "$IMAGE" installed
    local sizes=()
    [[ "$DRY_RUN" == 1 ]] && sizes=(--dry-run)
    # The time guard: benchmarks.gpu adds no cell past --budget-s; timeout is the hard stop behind it.
    # The service part's seconds are kept out of it.
    local reserve=0
    [[ "$SERVICE" == 1 ]] && reserve=$SERVICE_S
    local left=$((BUDGET_S - (SECONDS - started) - 20 - reserve))
    ((left < 30)) && left=30
    echo "budget: ${left} s for the benchmark (of ${BUDGET_S} s; ${reserve} s kept for the service part)"
    local rc=0
    (cd "$ROOT" && timeout --signal=INT --kill-after=15 $((left + 40)) "$PYTHON" -m benchmarks.gpu \
        --out "$out" "${sizes[@]}" --budget-s "$left" --image-check "$IMAGE") 2>&1 | tee "$out/run.log" || rc=$?
    [[ "$SERVICE" == 1 ]] && { service_part "$out" "$started" || rc=$((rc ? rc : 1)); }
    echo "gpu check: exit $rc after $((SECONDS - started)) s; results in $out"
    ls -l "$out"
    return "$rc"
}

# The installed phase alone, on what $SITE holds now: the carried set's imports (run by 'run' itself).
cmd_imports() {
    DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
    IMAGE="${1:?usage: gpu_check.sh imports REPORT.json}"
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    (cd "$ROOT" && image_check "$IMAGE" installed)
    "$PYTHON" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["installed"]["imports"] != "ok")' "$IMAGE"
}

case "${1:-}" in
    prepare) cmd_prepare ;;
    imports)
        shift
        cmd_imports "$@"
        ;;
    run)
        shift
        cmd_run "$@"
        ;;
    *) usage ;;
esac
