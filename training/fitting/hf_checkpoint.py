"""Hugging Face sequence classifiers ↔ our classification model, both ways.

Our classification head (``training.engine.heads.ClassificationHead``: tanh(dense([CLS])) → out) is exactly
BERT's pooler + classifier and RoBERTa's classification head, so a ``BertForSequenceClassification`` (or
RoBERTa-family) checkpoint maps onto a ``RetentionModel`` weight for weight, and back:

- ``load_sequence_head``: a retrofit's student starts from the user's checkpoint; ``load_backbone``
  already reads its encoder (``AutoModel`` drops the task head), this reads the head.
- ``write_hf_classifier`` (``python -m training to-hf <run> --out <dir>``): a trained BERT run as a
  plain ``BertForSequenceClassification`` directory — the load benchmark's baseline, and the "user's
  model" a classification retrofit starts from (the IMDb retrofit comparison).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.engine.encoders import resolve_backbone_path
from training.engine.model import RetentionModel
from training.recipes.recipe import Recipe

CLASSIFIER_SUFFIX = "ForSequenceClassification"
# Per model family: the modules that hold (our head.dense, our head.out), as dotted names in the HF model.
# Only families whose head is tanh(dense([CLS])) → out; DistilBERT (ReLU) and ELECTRA (GELU) are not.
HEAD_MODULES: dict[str, tuple[str, str]] = {
    "bert": ("bert.pooler.dense", "classifier"),
    "roberta": ("classifier.dense", "classifier.out_proj"),
    "xlm-roberta": ("classifier.dense", "classifier.out_proj"),
    "camembert": ("classifier.dense", "classifier.out_proj"),
}
UNSUPPORTED_PROBLEMS = ("regression", "multi_label_classification")
# Tokenizers without a length limit report this sentinel (transformers' VERY_LARGE_INTEGER is ~1e30).
NO_TOKENIZER_LIMIT = 1_000_000


@dataclass(frozen=True)
class ClassifierCheckpoint:
    """What a retrofit reads from a user's sequence classifier: its labels (in id order) and how many
    tokens it reads."""

    labels: tuple[str, ...]
    max_length: int


def _is_local(path: str) -> bool:
    return Path(path).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1"


def read_classifier_checkpoint(model: str) -> ClassifierCheckpoint:
    """Labels and max length of a single-label sequence classifier (a local dir or hub id); refuses
    checkpoints whose head ours cannot reproduce."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_backbone_path(model)
    config = AutoConfig.from_pretrained(path, local_files_only=_is_local(path))
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith(CLASSIFIER_SUFFIX) for name in architectures):
        raise ValueError(
            f"{model} is not a sequence classifier (architectures {architectures or 'unknown'}): a "
            f"classification retrofit needs a *{CLASSIFIER_SUFFIX} checkpoint"
        )
    if config.model_type not in HEAD_MODULES:
        raise ValueError(
            f"{model}: a {config.model_type} classification head is not supported; supported families: "
            f"{sorted(HEAD_MODULES)}"
        )
    if getattr(config, "problem_type", None) in UNSUPPORTED_PROBLEMS or config.num_labels < 2:
        raise ValueError(f"{model}: only single-label classification (softmax over ≥ 2 labels) is supported")
    labels = tuple(str(config.id2label[index]) for index in range(config.num_labels))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=_is_local(path), use_fast=True)
    limits = [int(config.max_position_embeddings)]
    if 0 < tokenizer.model_max_length < NO_TOKENIZER_LIMIT:
        limits.append(int(tokenizer.model_max_length))
    return ClassifierCheckpoint(labels, min(limits))


def load_sequence_head(model: RetentionModel, checkpoint: str) -> None:
    """Copy the checkpoint's classification head into ``model.head`` (dense → tanh → out)."""
    from transformers import AutoModelForSequenceClassification

    path = resolve_backbone_path(checkpoint)
    hf, info = AutoModelForSequenceClassification.from_pretrained(
        path, local_files_only=_is_local(path), output_loading_info=True
    )
    family = hf.config.model_type
    if family not in HEAD_MODULES:
        raise ValueError(f"{checkpoint}: a {family} classification head is not supported")
    dense_name, out_name = HEAD_MODULES[family]
    missing = [key for key in info["missing_keys"] if key.startswith((dense_name, out_name))]
    if missing:
        raise ValueError(f"{checkpoint} has no trained classification head (missing {missing})")
    head: Any = model.head
    with torch.no_grad():
        head.dense.load_state_dict(_float_state(hf.get_submodule(dense_name)))
        head.out.load_state_dict(_float_state(hf.get_submodule(out_name)))


def _float_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's weights in fp32, as the backbone is loaded (whatever dtype the checkpoint stores)."""
    return {name: tensor.float() for name, tensor in module.state_dict().items()}


def write_hf_classifier(model: RetentionModel, recipe: Recipe, tokenizer: Any, out: Path) -> Path:
    """A trained BERT classification model as a ``BertForSequenceClassification`` directory (config
    with id2label, model.safetensors, tokenizer files). The scorers are dropped: it is the dense model."""
    from transformers import BertConfig, BertForSequenceClassification

    if model.task != "classification" or model.backbone.info.family != "bert":
        raise ValueError("only BERT-family classification runs convert to BertForSequenceClassification")
    config = BertConfig.from_dict(model.backbone.config.to_dict())
    config.num_labels = len(recipe.labels)
    config.id2label = dict(enumerate(recipe.labels))
    config.label2id = {label: i for i, label in enumerate(recipe.labels)}
    config.architectures = [BertForSequenceClassification.__name__]
    hf = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        hf.bert.embeddings.load_state_dict(model.backbone.embeddings.state_dict(), strict=False)
        for target, view in zip(hf.bert.encoder.layer, model.backbone.views, strict=True):
            target.attention.self.query.load_state_dict(view.query.state_dict())
            target.attention.self.key.load_state_dict(view.key.state_dict())
            target.attention.self.value.load_state_dict(view.value.state_dict())
            target.attention.output.dense.load_state_dict(view.attn_out.state_dict())
            target.attention.output.LayerNorm.load_state_dict(view.attn_norm.state_dict())
            target.intermediate.dense.load_state_dict(view.ffn_in.state_dict())
            target.output.dense.load_state_dict(view.ffn_out.state_dict())
            target.output.LayerNorm.load_state_dict(view.ffn_norm.state_dict())
        head: Any = model.head
        hf.bert.pooler.dense.load_state_dict(head.dense.state_dict())
        hf.classifier.load_state_dict(head.out.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
