# syntax=docker/dockerfile:1
#
# Adaptive Retention images (see docs/deploy.md).
#
#   docker build -t adaptive-retention:cpu .                                  # serving, CPU (default target)
#   docker build -t adaptive-retention:gpu --build-arg VARIANT=gpu .          # serving, onnxruntime-gpu
#   docker build -t adaptive-retention:gpu-torch --target serve-gpu .         # serving, torch CUDA backend
#   docker build -t adaptive-retention-train --target train .                 # builds models (torch)
#
# The serving image has no torch: it installs the base dependencies of pyproject.toml only, at the exact
# versions and hashes of constraints/serve.lock.txt (scripts/check_install.sh performs the same install
# steps in a fresh virtualenv, in CI). The training image installs constraints/train.lock.txt. `make lock`
# refreshes both.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ------------------------------------------------------------------------------------------- base
FROM ${PYTHON_IMAGE} AS base
# DL3064 flags TOKENIZERS_PARALLELISM for its name; it is a thread setting, not a secret.
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# One unprivileged user for every image; /models is owned by it, so a fresh named volume mounted
# there is writable by the model builder and readable by the service.
RUN groupadd --system --gid 10001 retention \
    && useradd --system --uid 10001 --gid retention --home-dir /app --create-home --shell /usr/sbin/nologin retention \
    && mkdir -p /models \
    && chown retention:retention /models

# ------------------------------------------------------------------------------ serving: install
FROM base AS serve-build
# cpu: onnxruntime from the base dependencies. gpu: swap it for onnxruntime-gpu with the CUDA and
# cuDNN runtime wheels (the host needs an NVIDIA driver and the NVIDIA container toolkit).
ARG VARIANT=cpu
ARG ONNXRUNTIME_GPU="onnxruntime-gpu[cuda,cudnn]==1.31.1"
WORKDIR /src
# The core (retention_core), the task packages, the service and the batch client; never training/ (scripts/check_install.sh
# asserts `import training` fails in this install).
# The dependencies get a layer of their own, from the hashed lock (rebuilt only when the lock changes): a
# source change then reinstalls just this project. VARIANT=gpu swaps onnxruntime for onnxruntime-gpu here
# (pinned by version in ONNXRUNTIME_GPU, not locked: its CUDA wheels are not in the lock).
COPY constraints/serve.lock.txt ./constraints/
# DL3013: the GPU package is pinned in ONNXRUNTIME_GPU; the others' versions and hashes are in the lock.
# hadolint ignore=DL3013
RUN python -m venv /opt/venv \
    && pip install --no-compile --require-hashes -r constraints/serve.lock.txt \
    && if [ "$VARIANT" = "gpu" ]; then \
         pip uninstall --yes onnxruntime && pip install --no-compile "$ONNXRUNTIME_GPU"; \
       elif [ "$VARIANT" != "cpu" ]; then \
         echo "VARIANT must be cpu or gpu, got $VARIANT" >&2 && exit 1; \
       fi
COPY pyproject.toml README* ./
COPY retention_core ./retention_core
# onnxruntime sessions, opened one way (the service's ONNX Runtime backend)
COPY retention_ort ./retention_ort
# the task packages (retention_core.tasks.SHIPPED_TASKS): their spec, codec and face parts serve; never
# their training and learn parts, which import training (absent here)
COPY retention_tasks ./retention_tasks
COPY service ./service
COPY clients ./clients
RUN pip install --no-compile --no-deps . \
    && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the serving image" >&2 && exit 1; fi
# The installed copy, not the sources in /src.
WORKDIR /
RUN python -c "import retention_core, retention_ort, service, onnxruntime, tokenizers" \
    && if python -c "import training" 2>/dev/null; then echo "training must not be in the serving image" >&2 && exit 1; fi

# ------------------------------------------------------------------------------ serving: runtime
FROM base AS serve
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="adaptive-retention" \
      org.opencontainers.image.description="Adaptive Retention serving (onnxruntime, no torch): ${VARIANT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=serve-build /opt/venv /opt/venv
ENV RETENTION_MODELS_DIR=/models
WORKDIR /app
USER 10001:10001
EXPOSE 8000
VOLUME ["/models"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=2)"]
CMD ["python", "-m", "service", "--models-dir", "/models", "--host", "0.0.0.0", "--port", "8000"]

# ------------------------------------------------------------------- serving on a GPU: torch backend
# The CPU serving install plus CUDA torch and safetensors, the service's torch backend (RETENTION_BACKEND=
# torch: weights.safetensors through retention_torch, bf16, one CUDA graph per shape plan). torch and its
# CUDA wheels come from the PyTorch index, pinned by version in TORCH_GPU (not locked: the locks hold the
# CPU build); CUDA_INDEX picks the CUDA line (cu130: CUDA 13, a driver that supports it; cu128 for CUDA 12).
# The host needs the NVIDIA driver and the NVIDIA Container Toolkit. Built here, never in CI (no GPU, and
# the CUDA wheels are ~3 GB): docs/deploy.md, "GPU".
FROM serve-build AS serve-gpu-build
ARG CUDA_INDEX=https://download.pytorch.org/whl/cu130
ARG TORCH_GPU="torch==2.11.0"
ARG SAFETENSORS="safetensors==0.8.0"
WORKDIR /src
COPY retention_torch ./retention_torch
# DL3013: both are pinned by version in their build arguments.
# hadolint ignore=DL3013
RUN pip install --no-compile --index-url "$CUDA_INDEX" --extra-index-url https://pypi.org/simple \
         "$TORCH_GPU" "$SAFETENSORS" \
    && pip install --no-compile --no-deps --force-reinstall .
WORKDIR /
RUN python -c "import retention_core, retention_torch, service.backends.torch_backend, safetensors, torch" \
    && if python -c "import training" 2>/dev/null; then echo "training must not be in the serving image" >&2 && exit 1; fi

FROM base AS serve-gpu
LABEL org.opencontainers.image.title="adaptive-retention" \
      org.opencontainers.image.description="Adaptive Retention serving on a GPU (torch backend, CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=serve-gpu-build /opt/venv /opt/venv
ENV RETENTION_MODELS_DIR=/models \
    RETENTION_BACKEND=torch \
    RETENTION_TORCH_DEVICE=auto \
    RETENTION_TORCH_DTYPE=auto
WORKDIR /app
USER 10001:10001
EXPOSE 8000
VOLUME ["/models"]
# A longer start: torch and CUDA load, each model warms up (its CUDA graphs are captured on first use).
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=2)"]
CMD ["python", "-m", "service", "--models-dir", "/models", "--host", "0.0.0.0", "--port", "8000"]

# ------------------------------------------------------------------------ training / model builder
# Builds the default models that are missing into /models, then exits (a one-shot job).
# Data: mount the dataset root at /shared/data (training looks for ../shared/data from /app).
FROM base AS train
# The base and [train] dependencies from the hashed lock, in a layer of their own as in serve-build.
# torch's CPU build (the lock pins torch==X+cpu) comes from the PyTorch index (PyPI's Linux x86_64 torch
# is the multi-GB CUDA build); the rest from PyPI (pip takes only files whose hash the lock names).
# Where that index is unreachable, mount a directory holding the CPU wheel at build time and name it:
#   --build-arg TORCH_FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL=https://pypi.org/simple
# (podman build -v /path/to/wheels:/wheels:ro; scripts/image_test.py does this).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=""
ENV HF_HUB_OFFLINE=1
WORKDIR /app
COPY constraints ./constraints
RUN python -m venv /opt/venv \
    && pip install --no-compile ${TORCH_FIND_LINKS:+--find-links "$TORCH_FIND_LINKS"} \
         --index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple \
         --require-hashes -r constraints/train.lock.txt
COPY pyproject.toml README* ./
COPY retention_core ./retention_core
COPY retention_ort ./retention_ort
COPY retention_tasks ./retention_tasks
# the torch forward the export checks weights.safetensors with (training.export)
COPY retention_torch ./retention_torch
COPY training ./training
COPY models/recipes ./models/recipes
RUN pip install --no-compile --no-deps . \
    && mkdir -p /app/runs \
    && chown retention:retention /app/runs
USER 10001:10001
VOLUME ["/models", "/app/runs"]
ENTRYPOINT ["python", "-m", "training"]
CMD ["build", "models/recipes/imdb.yaml", "--profile", "quick", "--models-dir", "/models"]

# The default target: the CPU serving image.
FROM serve
