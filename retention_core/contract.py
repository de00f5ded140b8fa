"""The model-directory contract between the exporter (writer) and the service (reader).

Torch-free on purpose: the serving process imports this module to validate ``manifest.json``.

    models/<name>/
      model.onnx          pruning baked in; inputs/outputs per task: retention_core.tasks
      model.int8.onnx     optional dynamic-int8 variant (same contract)
      tokenizer.json      Hugging Face fast tokenizer
      weights.safetensors the same model's weights for the torch backend (``TorchWeights`` below)
      manifest.json       ``Manifest`` below
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from retention_core.schedule import (
    SCHEDULE_DEFAULTS,
    LeadingShare,
    MergeDropped,
    MinKeptTokens,
    PruningInterval,
    SchedulePower,
)

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
INT8_MODEL_FILE = "model.int8.onnx"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT_VERSION = 1
DEFAULT_MAX_WINDOWS = 16  # QA / summarization windows per input, in serving and in evaluation alike


class TensorSpec(BaseModel):
    """One graph input or output: name, element type and axes (named axes are dynamic)."""

    model_config = ConfigDict(frozen=True)
    name: str
    dtype: Literal["int64", "float32"]
    axes: tuple[str, ...]
    description: str = ""


# The inputs every retention graph takes and the kept-count output every graph ends with; each task's
# full contract (``retention_core.tasks.TaskSpec.inputs / outputs``) is built from these.
BASE_INPUTS = (
    TensorSpec(name="input_ids", dtype="int64", axes=("batch", "sequence")),
    TensorSpec(name="attention_mask", dtype="int64", axes=("batch", "sequence"), description="1 = real"),
    TensorSpec(name="rho", dtype="float32", axes=("batch",), description="kept fraction at the last layer"),
)
KEPT_COUNTS = TensorSpec(
    name="kept_counts", dtype="int64", axes=("batch", "layers"), description="tokens entering each layer"
)
# Optional last output of every graph (the explorer's view, ``explain=true``): per input position, the
# number of layers it entered. Model directories exported before it existed end at kept_counts and
# still load; the service then refuses explain for them.
SURVIVAL_DEPTH = TensorSpec(
    name="survival_depth",
    dtype="int64",
    axes=("batch", "sequence"),
    description="layers each input token entered: 0 for pads, num_layers for a token never dropped",
)
OPTIONAL_OUTPUTS = (SURVIVAL_DEPTH,)


class Schedule(BaseModel):
    """How ρ becomes keep counts (``retention_core.schedule``): frac_p = ρ^(((g+1)/G)^power) for the
    group g of point p; count = round(frac_p · n_real), at least min(min_kept_tokens, n_real) (the
    kept-token floor). The settings are ``schedule.ScheduleSettings``'s, declared there once."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["power"] = "power"
    power: SchedulePower = SCHEDULE_DEFAULTS.power
    num_points: int = Field(ge=1)
    min_kept_tokens: MinKeptTokens = SCHEDULE_DEFAULTS.min_kept_tokens
    merge_dropped: MergeDropped = SCHEDULE_DEFAULTS.merge_dropped
    leading_share: LeadingShare = SCHEDULE_DEFAULTS.leading_share
    pruning_interval: PruningInterval = SCHEDULE_DEFAULTS.pruning_interval
    last_layer_queries: int | None = Field(
        default=None, description="queries the last layer computes (1 = [CLS] only); None = all"
    )


class QualityPoint(BaseModel):
    rho: float
    value: float


class QualityCurve(BaseModel):
    """The exported graph's quality at each measured ρ. Values are fractions in 0–1 (accuracy, F1, ROUGE
    F1, cosine to the dense vector, agreement with the dense model): one point of the metric is 0.01."""

    metric: str
    split: str
    num_examples: int
    runtime: str = Field(description="what produced the numbers, e.g. onnxruntime fp32")
    points: list[QualityPoint]


class SpeedCurve(BaseModel):
    """Speed-up of the exported graph over ρ = 1, measured when it was exported: median latency of one
    batch of full-length rows at ρ = 1 divided by that at each ρ, on the machine described."""

    metric: Literal["speedup_over_rho_1"] = "speedup_over_rho_1"
    runtime: str = Field(description="what ran the graph, e.g. onnxruntime fp32, and its threads")
    batch_size: int = Field(ge=1)
    sequence_length: int = Field(ge=1, description="real tokens of every row")
    repeats: int = Field(ge=1, description="timed runs per rho (the median counts)")
    machine: dict[str, object] = Field(description="retention_core.machine.describe() of the exporter")
    points: list[QualityPoint]


class Backbone(BaseModel):
    name_or_path: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int


# A pooled head's pooling, as sentence-transformers names its modes: "mean" (pooling_mode_mean_tokens),
# the mean of the final states of the tokens that reach the end; "cls" (pooling_mode_cls_token), the
# final state of [CLS] (position 0, never dropped), so the last layer computes that one query.
Pooling = Literal["mean", "cls"]


class EmbeddingInfo(BaseModel):
    """How a pooled (embedding) graph's vector is made and served: from the model's
    sentence-transformers config (``modules.json``, ``1_Pooling/config.json``, a ``Normalize`` module)."""

    pooling: Pooling = Field(
        default="mean",
        description="what the graph pools (it outputs the pooled vector either way); manifests written "
        "before CLS pooling existed have mean",
    )
    normalize: bool = Field(default=True, description="L2-normalise the vector unless a request says not")
    dimensions: int = Field(ge=1, description="length of the vector (the encoder's hidden size)")


Activation = Literal["gelu", "gelu_tanh", "relu"]  # gelu: the exact (erf) form BERT and MPNet use


class Architecture(BaseModel):
    """What the torch backend needs to run ``weights.safetensors`` besides the tensors: a post-LayerNorm
    encoder (BERT, DistilBERT, MPNet shapes), its scorers and its head."""

    model_config = ConfigDict(frozen=True)
    family: str
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    activation: Activation
    layer_norm_eps: float = Field(gt=0.0)
    # "absolute": position ids 0..T-1 (BERT); "after_padding": RoBERTa's and MPNet's, counted from
    # padding_idx + 1 over the real tokens
    positions: Literal["absolute", "after_padding"] = "absolute"
    padding_idx: int = 0
    relative_attention_buckets: int | None = Field(
        default=None, description="MPNet's relative-position bias: its number of buckets; None = none"
    )
    relative_attention_max_distance: int = 128
    scorer_size: int = Field(ge=1)
    ema_decay: float = Field(ge=0.0, lt=1.0)


class TorchParity(BaseModel):
    """How the torch backend's forward on ``weights.safetensors`` agreed with ``model.onnx`` at export."""

    cases: int = Field(ge=1, description="batches of the export's validation grid (ragged, mixed rho)")
    max_abs_diff: float = Field(description="largest difference of the main output, fp32 on the CPU")
    kept_tokens_equal: bool = Field(description="kept counts and every token's survival depth equal")


class TorchWeights(BaseModel):
    """The model's weights for the torch backend (``RETENTION_BACKEND=torch``): the same encoder, scorers
    and head as ``model.onnx``, read by ``retention_torch`` (the GPU-shaped forward)."""

    file: str = WEIGHTS_FILE
    architecture: Architecture
    bytes: int = Field(ge=0, description="size of the weights file")
    parity: TorchParity


class PrunedBranch(BaseModel):
    """A model whose ρ < 1 path runs weights of its own (a retrofit's ``--pruned-branch copy``): ρ = 1 runs
    the original's weights and operators, ρ < 1 a copy of the encoder trained to work on fewer tokens (a
    mixed batch runs both, each row taking its own). What that costs beyond the original model."""

    parameters: int = Field(
        ge=0, description="the copy's parameters (those it stores apart from the original's)"
    )
    bytes: dict[str, int] = Field(
        description="per variant: bytes of the weights only the rho < 1 path reads (the copy's)"
    )


class Variant(BaseModel):
    file: str
    precision: Literal["fp32", "int8"]
    quality: QualityCurve | None = None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format_version: int = FORMAT_VERSION
    name: str
    task: str = Field(description="a name in the task registry, retention_core.tasks")
    labels: list[str] = Field(default_factory=list)
    backbone: Backbone
    max_length: int = Field(ge=2)
    default_rho: float = Field(gt=0.0, le=1.0)
    default_rho_rule: str | None = Field(
        default=None,
        description="how the exporter chose default_rho (choose_default_rho); None for older exports",
    )
    schedule: Schedule
    tokenizer: str = TOKENIZER_FILE
    variants: dict[str, Variant]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    training: dict[str, object] = Field(default_factory=dict, description="recipe and data it was trained on")
    quality: QualityCurve | None = None
    speed: SpeedCurve | None = Field(
        default=None, description="measured speed-up vs rho (explorer page); None for older exports"
    )
    embedding: EmbeddingInfo | None = Field(default=None, description="pooled-head tasks only")
    torch_weights: TorchWeights | None = Field(
        default=None, description="weights for the torch backend; None for directories exported before it"
    )
    pruned_branch: PrunedBranch | None = Field(
        default=None,
        description="the rho < 1 path's own weights; absent for a model whose every rho runs one set",
    )
    aliases: list[str] = Field(
        default_factory=list,
        description="other names a request may use: an embedding retrofit answers to the hub id and short "
        "name of the model it was retrofitted from (model=all-mpnet-base-v2)",
    )
    versions: dict[str, str] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _without_absent_pruned_branch(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """``pruned_branch`` is written only where there is one: every one-path manifest keeps the bytes
        it had before the field existed."""
        data: dict[str, object] = handler(self)
        if data.get("pruned_branch") is None:
            data.pop("pruned_branch", None)
        return data

    @property
    def has_survival_depth(self) -> bool:
        """The graph reports per-token survival depth (exported after it existed)."""
        return any(spec.name == SURVIVAL_DEPTH.name for spec in self.outputs)

    @classmethod
    def read(cls, model_dir: Path) -> Manifest:
        return cls.model_validate_json((model_dir / MANIFEST_FILE).read_text(encoding="utf-8"))

    def write(self, model_dir: Path) -> None:
        """Replace ``manifest.json`` in one rename: a reader (a hot-reloading service) sees the old manifest
        or the new one, never a truncated or half-written file."""
        target = model_dir / MANIFEST_FILE
        temporary = model_dir / f".{MANIFEST_FILE}.{uuid.uuid4().hex[:8]}.tmp"  # same file system: rename
        # O_EXCL: never write through another file; mode 0o666 under the umask, as write_text would (a
        # service running as another user must read it; mkstemp's 0600 would hide it).
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(self.model_dump_json(indent=2) + "\n")
                handle.flush()
                os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


# A request without ρ is served at default_rho. The exporter picks the lowest measured ρ whose quality
# loss against ρ = 1 is at most DEFAULT_RHO_MAX_LOSS_POINTS points of the curve's metric. Curve values are
# fractions in 0–1 (QualityCurve), so one point is QUALITY_POINT = 0.01 of a value (1 point of accuracy:
# 0.90 → 0.89).
DEFAULT_RHO_MAX_LOSS_POINTS = 1.0
QUALITY_POINT = 0.01
DENSE_RHO = 1.0
_LOSS_SLACK = 1e-9  # float subtraction: 0.87 - 0.86 is 0.010000000000000009, still one point


def choose_default_rho(quality: QualityCurve | None) -> tuple[float, str]:
    """(default_rho, how it was chosen): the lowest measured ρ whose value is within
    ``DEFAULT_RHO_MAX_LOSS_POINTS`` points of the ρ = 1 value (a point above the tolerance between two that
    qualify does not disqualify the lower one: each ρ is judged on its own measurement). Dense (1.0) when
    no curve was measured or it has no ρ = 1 point to compare with. Pure: the service may call it too."""
    if quality is None:
        return DENSE_RHO, "no quality curve: dense (rho=1)"
    dense = [point.value for point in quality.points if math.isclose(point.rho, DENSE_RHO)]
    if not dense:
        return DENSE_RHO, f"no rho=1 point in the quality curve ({quality.split}): dense (rho=1)"
    tolerance = DEFAULT_RHO_MAX_LOSS_POINTS * QUALITY_POINT + _LOSS_SLACK
    within = [
        point.rho
        for point in quality.points
        if 0.0 < point.rho <= DENSE_RHO and dense[0] - point.value <= tolerance
    ]
    rule = (
        f"lowest measured rho within {DEFAULT_RHO_MAX_LOSS_POINTS:g} point of rho=1 "
        f"({quality.metric} on {quality.split}, {quality.num_examples} examples)"
    )
    return min(within, default=DENSE_RHO), rule
