"""What a model directory says of itself: its manifest (backbone, schedule, variants, quality, the
embedding's pooling, aliases, versions, a two-path model's copy), and the tokenizer it serves with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import torch

from retention_core import contract as C
from training.engine.encoders import SOURCE_MODEL_IDS
from training.engine.model import RetentionModel, manifest_schedule
from training.export.graph import OPSET
from training.export.two_path import copy_only_bytes
from training.recipes.recipe import Recipe


def save_serving_tokenizer(tokenizer: Any, path: Path) -> None:
    """tokenizer.json without padding/truncation: the service pads per batch and truncates by policy."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(path))


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "opset": str(OPSET),
    }


def embedding_info(model: RetentionModel, recipe: Recipe) -> C.EmbeddingInfo | None:
    """A pooled head's vector: the model's pooling (mean, or [CLS]) of the final states, normalised by
    default unless the retrofitted model's sentence-transformers config has no Normalize module."""
    if model.spec.head != "pooled":
        return None
    normalize = recipe.retrofit.normalize if recipe.retrofit is not None else True
    return C.EmbeddingInfo(
        pooling=model.config.pooling, normalize=normalize, dimensions=model.backbone.info.hidden_size
    )


def source_model_names(backbone: str) -> list[str]:
    """The names users know an embedding retrofit's source model by: its hub id and short name."""
    hub_id = SOURCE_MODEL_IDS.get(backbone)
    return [] if hub_id is None else [hub_id, hub_id.split("/")[-1]]


def build_manifest(
    model: RetentionModel,
    recipe: Recipe,
    name: str,
    variants: dict[str, C.Variant],
    quality: C.QualityCurve | None,
) -> C.Manifest:
    info = model.backbone.info
    task = model.spec
    default_rho, default_rho_rule = C.choose_default_rho(quality)  # recipe.rho.default no longer decides
    return C.Manifest(
        name=name,
        task=task.name,
        labels=list(recipe.labels),
        backbone=C.Backbone(
            name_or_path=recipe.backbone,
            family=info.family,
            num_layers=info.num_layers,
            hidden_size=info.hidden_size,
            num_heads=info.num_heads,
            intermediate_size=info.intermediate_size,
        ),
        max_length=min(recipe.max_length, info.max_positions),
        default_rho=default_rho,
        default_rho_rule=default_rho_rule,
        schedule=manifest_schedule(model),
        variants=variants,
        inputs=list(task.inputs),
        outputs=list(task.exported_outputs),
        training={"recipe": json.loads(recipe.model_dump_json()), "dataset": recipe.dataset.name},
        quality=quality,
        embedding=embedding_info(model, recipe),
        aliases=source_model_names(recipe.backbone) if task.head == "pooled" else [],
        versions=versions(),
    )


def pruned_branch_info(
    model: RetentionModel, staging: Path, variants: dict[str, C.Variant]
) -> C.PrunedBranch:
    """What a two-path model costs beyond its original: the copy's parameters, and per variant the bytes
    of the weights only the copy's pass reads (``copy_only_bytes``)."""
    assert model.pruned_backbone is not None
    originals = dict(model.backbone.named_parameters())
    return C.PrunedBranch(
        parameters=sum(  # a tensor the copy keeps as the original's is stored once: not the copy's
            param.numel()
            for name, param in model.pruned_backbone.named_parameters()
            if not torch.equal(param, originals[name])
        ),
        bytes={
            name: copy_only_bytes(onnx.load(str(staging / variant.file)))
            for name, variant in variants.items()
        },
    )


def with_default_rho(manifest: C.Manifest) -> C.Manifest:
    """``manifest`` with default_rho (and the rule's text) chosen from its fp32 quality curve."""
    default_rho, rule = C.choose_default_rho(manifest.quality)
    return manifest.model_copy(update={"default_rho": default_rho, "default_rho_rule": rule})
