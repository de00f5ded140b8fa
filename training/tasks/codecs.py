"""A task's registered codec as training and evaluation use it: ``EVERY_WINDOW`` (training learns from
every window of a long document) or ``SERVING`` (the service's limits: evaluation rows are the rows the
service would run), and codec rows as padded tensors."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch

from retention_core.codecs.base import Row, TaskCodec, pad_rows
from retention_core.contract import Manifest
from retention_core.tasks import CodecOptions, TaskSpec, task_spec
from retention_core.text import backend_tokenizer

# Training learns from every window of a long document; serving (and so evaluation) caps the windows.
EVERY_WINDOW = CodecOptions(max_windows=sys.maxsize)
SERVING = CodecOptions()


def codec_manifest(max_length: int, labels: Sequence[str] = ()) -> Manifest:
    """The manifest fields a codec reads (max_length, labels); the rest describe an exported graph."""
    return Manifest.model_construct(max_length=max_length, labels=list(labels))


# (task spec, id(tokenizer), max_length, labels, options) → (tokenizer, codec); the tokenizer is kept
# alive beside its id so the id is never reused by another tokenizer while the entry exists, and a task
# registered again (tests) gets a codec of its new spec.
_CODECS: dict[tuple[TaskSpec, int, int, tuple[str, ...], CodecOptions], tuple[Any, TaskCodec]] = {}


def task_codec(
    task: str, tokenizer: Any, max_length: int, labels: Sequence[str] = (), options: CodecOptions = SERVING
) -> Any:
    """The task's registered codec, one per (tokenizer, max_length, labels, options). ``SERVING`` is what
    a served model of this task applies (evaluation); ``EVERY_WINDOW`` keeps every window (training)."""
    spec = task_spec(task)
    key = (spec, id(tokenizer), max_length, tuple(labels), options)
    if key not in _CODECS:
        manifest = codec_manifest(max_length, labels)
        _CODECS[key] = (tokenizer, spec.make_codec(manifest, backend_tokenizer(tokenizer), options))
    return _CODECS[key][1]


def evaluation_codec(task: str, tokenizer: Any, max_length: int, labels: Sequence[str] = ()) -> Any:
    """The codec with the service's defaults: evaluation rows are the rows the service would run."""
    return task_codec(task, tokenizer, max_length, labels, SERVING)


def rows_to_tensors(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded int64 feeds keyed by graph input name (no ρ), as torch tensors (B, T)."""
    return {name: torch.from_numpy(array) for name, array in pad_rows(rows, pad_id).items()}
