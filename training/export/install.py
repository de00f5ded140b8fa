"""``export_model``: a trained model → a model directory, installed atomically.

Every export is validated against torch (``graph.validate_onnx``; the torch backend's weights by
``torch_weights.export_torch_weights``) before anything is written to the target directory. The
directory is written in a hidden sibling (``.<name>.staging-…``, which the service's scan skips),
measured there (quality curves, speed: ``export_model``'s ``measure``), given its one final manifest and
swapped into place in one rename, so the target is always either the old model or the new one, complete.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retention_core import contract as C
from training.engine.model import RetentionModel
from training.export.graph import export_onnx, validate_onnx
from training.export.int8 import quantize_int8
from training.export.manifest import (
    build_manifest,
    pruned_branch_info,
    save_serving_tokenizer,
    with_default_rho,
)
from training.export.torch_weights import export_torch_weights
from training.recipes.recipe import Recipe

# (staging directory, its manifest so far) → the manifest with what was measured on the staged graphs
Measure = Callable[[Path, C.Manifest], C.Manifest]


def export_model(
    model: RetentionModel,
    recipe: Recipe,
    tokenizer: Any,
    out_dir: Path,
    name: str | None = None,
    int8: bool = False,
    quality: C.QualityCurve | None = None,
    measure: Measure | None = None,
) -> C.Manifest:
    """Export and validate into a hidden sibling of ``out_dir``, measure it there, write its manifest
    once, then swap it into place.

    ``measure`` runs on the staging directory before the swap, not on ``out_dir`` after it: a service
    hot-reloading ``out_dir`` must never load a model twice or read a manifest rewritten in place, and a
    crash while measuring must leave the previous model (or nothing), never a model without its curve.

    The task is the model's (``model.spec``, resolved from the registry once, when the model was built):
    graph, validation and manifest all read that one ``TaskSpec``, and the recipe must name the same task.
    """
    if recipe.task != model.spec.name:
        raise ValueError(
            f"recipe {recipe.name!r} is for task {recipe.task!r}, the model for {model.spec.name!r}"
        )
    model = model.eval()
    vocab_size = model.backbone.info_vocab_size
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        export_onnx(model, staging / C.MODEL_FILE, vocab_size)
        validate_onnx(model, staging / C.MODEL_FILE, vocab_size)
        # The torch backend's forward runs one set of encoder weights: a two-path model is served by
        torch_weights = export_torch_weights(model, staging, vocab_size)
        variants = {"fp32": C.Variant(file=C.MODEL_FILE, precision="fp32")}
        if int8:
            quantize_int8(staging / C.MODEL_FILE, staging / C.INT8_MODEL_FILE)
            variants["int8"] = C.Variant(file=C.INT8_MODEL_FILE, precision="int8")
        save_serving_tokenizer(tokenizer, staging / C.TOKENIZER_FILE)
        manifest = build_manifest(model, recipe, name or recipe.name, variants, quality)
        manifest = manifest.model_copy(
            update={
                "torch_weights": torch_weights,
                "pruned_branch": (
                    None if model.pruned_backbone is None else pruned_branch_info(model, staging, variants)
                ),
            }
        )
        if measure is not None:
            manifest = with_default_rho(measure(staging, manifest))  # the measured curve decides it
        manifest.write(staging)
        C.Manifest.read(staging)  # the service's reader accepts what we wrote, before anyone can see it
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the model from other users
        install_directory(staging, out_dir)
    finally:
        if staging.exists():  # failed before the swap, or holds the replaced model after it
            shutil.rmtree(staging)
    return manifest


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing paths atomically


def exchange_paths(first: Path, second: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2``); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # not glibc ≥ 2.28 (or not Linux)
        return False
    encoded = (os.fsencode(first), os.fsencode(second))
    if renameat2(AT_FDCWD, encoded[0], AT_FDCWD, encoded[1], RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or file system without it
        return False
    raise OSError(code, os.strerror(code), str(second))


def install_directory(staging: Path, target: Path) -> None:
    """Put the finished ``staging`` directory at ``target``; afterwards ``staging`` holds the old one (if
    any). Readers of ``target`` see the old model or the new one, never a mix or nothing (except in the
    fallback, where ``target`` is missing between two renames)."""
    if not target.exists():
        os.rename(staging, target)
    elif not exchange_paths(staging, target):
        aside = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:8]}"
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except OSError:
            os.rename(aside, target)  # the old model goes back where it was
            raise
        os.rename(aside, staging)
