"""Load one model directory (ONNX + JSON only, never pickle) into an onnxruntime session + codec, and run it.

Every check fails loudly with ``ModelLoadError`` whose message names the directory (relative to the
models root) and what is wrong; the service logs it and keeps serving whatever it already had.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil
from pydantic import ValidationError
from tokenizers import Tokenizer

from retention_core.codecs.base import Row, TaskCodec
from retention_core.contract import MANIFEST_FILE, Manifest, TensorSpec
from retention_core.onnx import open_session
from retention_core.tasks import CodecOptions, TaskSpec, task_spec
from retention_core.text import pad_token_id
from service.serving import ServedModel
from service.settings import Settings

log = logging.getLogger("service")

ORT_TYPES = {"int64": "tensor(int64)", "float32": "tensor(float)"}


class ModelLoadError(Exception):
    """A model directory is broken. The message is safe to show to an operator (no absolute paths)."""


def make_codec(spec: TaskSpec, manifest: Manifest, tokenizer: Tokenizer, settings: Settings) -> TaskCodec:
    """The registered codec of this manifest's task, with the service's limits."""
    return spec.make_codec(manifest, tokenizer, CodecOptions(max_windows=settings.max_windows))


def check_specs(
    label: str, kind: str, actual: list[Any], expected: list[TensorSpec], contract: tuple[TensorSpec, ...]
) -> None:
    """The session's inputs/outputs must equal the manifest's, and the manifest the task contract."""
    want = [(s.name, s.dtype, len(s.axes)) for s in expected]
    if want != [(s.name, s.dtype, len(s.axes)) for s in contract]:
        raise ModelLoadError(
            f"{label}: manifest {kind} {[w[0] for w in want]} do not match the task contract"
        )
    got = [(a.name, a.type, len(a.shape)) for a in actual]
    if [(n, ORT_TYPES[d], r) for n, d, r in want] != got:
        raise ModelLoadError(f"{label}: ONNX graph {kind} {got} do not match the manifest {want}")


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
    """A served model with what runs it: the onnxruntime session, the tokenizer, the directory."""

    directory: Path
    session: ort.InferenceSession
    tokenizer: Tokenizer
    pad_id: int
    fingerprint: str
    output_names: list[str] = field(default_factory=list)
    warmup_seconds: float = 0.0  # latency of the last warm-up run: the batcher's first estimate
    # Resident memory the process grew by while this model's session opened and warmed up: its weights,
    # onnxruntime's buffers and arena after one run. An estimate (the allocator may reuse freed pages),
    # and models load one at a time, so the deltas do not overlap.
    memory_bytes: int = 0

    def run(
        self, rows: list[Row], rhos: list[float], length: int | None = None
    ) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray] | None]:
        """One padded ONNX run (to the longest row, or ``length`` when longer). Returns the first output
        of every row, unpadded, kept counts (B, L) and, when the graph has it, each row's survival depth
        (T_i,) unpadded (None for a directory exported without it)."""
        feeds = self.spec.feeds(rows, rhos, self.pad_id, length)
        main, counts, *optional = self.session.run(self.output_names, feeds)
        if main.ndim == 3:  # token outputs (B, T, k): drop padding per row
            outputs = [main[i, : len(row)] for i, row in enumerate(rows)]
        else:  # (B, C)
            outputs = [main[i] for i in range(len(rows))]
        depths = [optional[0][i, : len(row)] for i, row in enumerate(rows)] if optional else None
        return outputs, np.asarray(counts, dtype=np.int64), depths

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

    variant = manifest.variants.get(settings.precision) or manifest.variants.get("fp32")
    if variant is None:
        raise ModelLoadError(f"{label}: manifest lists no fp32 variant")
    model_path = directory / variant.file
    if Path(variant.file).name != variant.file or model_path.suffix != ".onnx":
        raise ModelLoadError(f"{label}: variant file must be a plain *.onnx name inside the model directory")
    if not model_path.is_file():
        raise ModelLoadError(f"{label}: missing {variant.file}")
    tokenizer_path = directory / manifest.tokenizer
    if Path(manifest.tokenizer).name != manifest.tokenizer or tokenizer_path.suffix != ".json":
        raise ModelLoadError(f"{label}: tokenizer must be a plain *.json name inside the model directory")
    if not tokenizer_path.is_file():
        raise ModelLoadError(f"{label}: missing {manifest.tokenizer}")

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:
        raise ModelLoadError(f"{label}: {manifest.tokenizer} is not a valid tokenizers file") from exc
    # Codecs pad and truncate themselves; a tokenizer.json saved with padding/truncation on would
    # otherwise pad every encoding to a fixed length.
    pad_id = pad_token_id(tokenizer)
    tokenizer.no_padding()
    tokenizer.no_truncation()

    resident_before = _resident_bytes()
    try:
        session = open_session(
            model_path,
            settings.intra_op_threads,
            settings.inter_op_threads,
            use_cuda=settings.use_cuda,
            cpu_mem_arena=settings.cpu_mem_arena,
            mem_pattern=settings.ort_mem_pattern,
        )
    except Exception as exc:
        log.error("onnxruntime could not load %s: %s", model_path, exc)
        raise ModelLoadError(f"{label}: {variant.file} could not be loaded by onnxruntime") from exc

    try:
        spec = task_spec(manifest.task)
    except KeyError as exc:
        raise ModelLoadError(f"{label}: unknown task {manifest.task!r}") from exc
    check_specs(label, "inputs", session.get_inputs(), manifest.inputs, spec.inputs)
    # survival_depth is optional: directories exported before it stop at kept_counts (explain off)
    contract = spec.output_contract(len(manifest.outputs))
    check_specs(label, "outputs", session.get_outputs(), manifest.outputs, contract)
    dim = session.get_outputs()[0].shape[-1]
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
        precision=variant.precision,
        session=session,
        tokenizer=tokenizer,
        codec=codec,
        spec=spec,
        pad_id=int(pad_id),
        fingerprint=fingerprint(directory),
        providers=session.get_providers(),
        output_names=[spec.name for spec in manifest.outputs],
    )
    if settings.warmup:
        try:
            model.warm_up()
        except Exception as exc:
            log.error("warm-up of %s failed: %s", label, exc)
            raise ModelLoadError(f"{label}: warm-up inference failed") from exc
    else:
        model.warmed_up = True
    model.memory_bytes = max(0, _resident_bytes() - resident_before)
    return model


def _resident_bytes() -> int:
    return int(psutil.Process().memory_info().rss)
