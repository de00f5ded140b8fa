"""Load one model directory (ONNX or safetensors + JSON, never pickle) into a backend + codec, and run it.

Every check fails loudly with ``ModelLoadError`` whose message names the directory (relative to the
models root) and what is wrong; the service logs it and keeps serving whatever it already had. The
backend (``service.backends``: onnxruntime or torch, one setting) runs the graph; everything else here
is the same for both.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from pydantic import ValidationError
from tokenizers import Tokenizer

from retention_core.codecs.base import Row, TaskCodec
from retention_core.contract import MANIFEST_FILE, Manifest
from retention_core.tasks import CodecOptions, TaskSpec, task_spec
from retention_core.text import pad_token_id
from service.backends import Backend, ModelLoadError, open_backend
from service.backends.base import model_file
from service.serving import ServedModel
from service.settings import Settings

log = logging.getLogger("service")

__all__ = ["LoadedModel", "ModelLoadError", "fingerprint", "load_model", "make_codec"]


def make_codec(spec: TaskSpec, manifest: Manifest, tokenizer: Tokenizer, settings: Settings) -> TaskCodec:
    """The registered codec of this manifest's task, with the service's limits."""
    return spec.make_codec(manifest, tokenizer, CodecOptions(max_windows=settings.max_windows))


def fingerprint(directory: Path) -> str:
    """Changes when any file of the directory changes (name, size, mtime): reload skips unchanged models."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@dataclass(kw_only=True)
class LoadedModel(ServedModel):
    """A served model with what runs it: its backend, the tokenizer, the directory."""

    directory: Path
    backend: Backend
    tokenizer: Tokenizer
    pad_id: int
    fingerprint: str
    warmup_seconds: float = 0.0  # latency of the last warm-up run: the batcher's first estimate
    # Resident memory the process grew by while this model's session opened and warmed up: its weights,
    # onnxruntime's buffers and arena after one run. An estimate (the allocator may reuse freed pages),
    # and models load one at a time, so the deltas do not overlap.
    memory_bytes: int = 0

    def run(
        self, rows: list[Row], rhos: list[float], length: int | None = None
    ) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray] | None]:
        """One padded run (to the longest row, or ``length`` when longer) through the backend. Returns the
        first output of every row, unpadded, kept counts (B, L) and, when the graph has it, each row's
        survival depth (T_i,) unpadded (None for a directory exported without it)."""
        feeds = self.spec.feeds(rows, rhos, self.pad_id, length)
        main, counts, depth = self.backend.run(feeds)
        if main.ndim == 3:  # token outputs (B, T, k): drop padding per row
            outputs = [main[i, : len(row)] for i, row in enumerate(rows)]
        else:  # (B, C)
            outputs = [main[i] for i in range(len(rows))]
        depths = None
        if depth is not None and self.manifest.has_survival_depth:
            depths = [depth[i, : len(row)] for i, row in enumerate(rows)]
        return outputs, counts, depths

    def warm_up(self) -> None:
        ids = self.tokenizer.encode("warm up the session with a short input").ids[: self.manifest.max_length]
        row = self.spec.example_row(tuple(ids))
        for rho in (1.0, self.manifest.default_rho):
            begin = time.perf_counter()
            self.run([row, row], [rho, rho])
            self.warmup_seconds = time.perf_counter() - begin
        self.warmed_up = True


def load_model(directory: Path, settings: Settings, name: str | None = None) -> LoadedModel:
    """Read, check and warm a model directory. Raises ``ModelLoadError`` with a clear message."""
    label = directory.name
    try:
        manifest = Manifest.read(directory)
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{label}: no {MANIFEST_FILE}") from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise ModelLoadError(f"{label}: invalid {MANIFEST_FILE}: {problems}") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{label}: unreadable {MANIFEST_FILE}") from exc

    tokenizer_path = model_file(directory, manifest.tokenizer, ".json", "tokenizer")

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:
        raise ModelLoadError(f"{label}: {manifest.tokenizer} is not a valid tokenizers file") from exc
    # Codecs pad and truncate themselves; a tokenizer.json saved with padding/truncation on would
    # otherwise pad every encoding to a fixed length.
    pad_id = pad_token_id(tokenizer)
    tokenizer.no_padding()
    tokenizer.no_truncation()

    try:
        spec = task_spec(manifest.task)
    except KeyError as exc:
        raise ModelLoadError(f"{label}: unknown task {manifest.task!r}") from exc
    resident_before = _resident_bytes()
    backend = open_backend(directory, manifest, spec, settings)
    try:
        model = _checked(directory, manifest, spec, tokenizer, int(pad_id), backend, settings, name)
    except BaseException:
        backend.close()  # a directory that did not load holds no session
        raise
    model.memory_bytes = max(0, _resident_bytes() - resident_before)
    return model


def _checked(
    directory: Path,
    manifest: Manifest,
    spec: TaskSpec,
    tokenizer: Tokenizer,
    pad_id: int,
    backend: Backend,
    settings: Settings,
    name: str | None,
) -> LoadedModel:
    """The model on its opened ``backend``: its output width checked against the manifest, its codec
    built and warmed up. Raises ``ModelLoadError``."""
    label = directory.name
    dim = backend.output_width
    if spec.num_outputs is None and isinstance(dim, int) and dim != len(manifest.labels):
        raise ModelLoadError(
            f"{label}: graph has {dim} logits but the manifest {len(manifest.labels)} labels"
        )
    # /v1/embeddings promises (and checks "dimensions" against) the manifest's vector size
    vectors = manifest.embedding
    if vectors is not None and isinstance(dim, int) and dim != vectors.dimensions:
        raise ModelLoadError(
            f"{label}: graph gives {dim}-dimensional vectors but the manifest says {vectors.dimensions}"
        )

    try:
        codec = make_codec(spec, manifest, tokenizer, settings)
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{label}: the {manifest.task} codec rejected this model ({exc})") from exc
    model = LoadedModel(
        name=name or manifest.name,
        directory=directory,
        manifest=manifest,
        precision=backend.info.precision,
        backend=backend,
        tokenizer=tokenizer,
        codec=codec,
        spec=spec,
        pad_id=pad_id,
        fingerprint=fingerprint(directory),
        providers=list(backend.info.providers),
        backend_kind=backend.info.kind,
        device=backend.info.device,
        graphs=backend.info.graphs,
    )
    if settings.warmup:
        try:
            model.warm_up()
        except Exception as exc:
            log.error("warm-up of %s failed: %s", label, exc)
            raise ModelLoadError(f"{label}: warm-up inference failed") from exc
    else:
        model.warmed_up = True
    return model


def _resident_bytes() -> int:
    return int(psutil.Process().memory_info().rss)
