"""The torch backend's weights: the names ``weights.safetensors`` stores them under, and loading them.

The export (``training.export.torch_weights.torch_state``) writes an encoder's tensors under these names
whatever the Hugging Face family called them; QKV is stored packed ((3d, d) = [Q; K; V]) so a layer
projects the three in one GEMM. Loading casts the encoder to the serving dtype (bf16 on a GPU) and keeps the
scorers in fp32: their scores order the tokens, where bf16's 8 bits of mantissa would reorder ties.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from retention_core.contract import Architecture

LAYER_TENSORS = (
    "qkv.weight",  # (3d, d)
    "qkv.bias",  # (3d,)
    "out.weight",  # (d, d)
    "out.bias",
    "attn_norm.weight",
    "attn_norm.bias",
    "ffn_in.weight",  # (f, d)
    "ffn_in.bias",
    "ffn_out.weight",  # (d, f)
    "ffn_out.bias",
    "ffn_norm.weight",
    "ffn_norm.bias",
)
SCORER_TENSORS = ("W.weight", "W.bias", "U.weight", "v.weight", "v.bias")
EMBEDDING_TENSORS = ("word", "position", "norm.weight", "norm.bias")
TOKEN_TYPE = "embeddings.token_type"  # absent for families without segment embeddings (MPNet)
RELATIVE_BIAS = "relative_attention_bias"  # (buckets, H): MPNet only
# The head's tensors by head kind; a pooled head (embeddings) has none.
HEAD_TENSORS = {
    "sequence": ("head.dense.weight", "head.dense.bias", "head.out.weight", "head.out.bias"),
    "token": ("head.out.weight", "head.out.bias"),
    "pooled": (),
}


def required_names(architecture: Architecture, head: str) -> list[str]:
    """Every tensor name a model of ``architecture`` with a ``head`` head must have."""
    names = [f"embeddings.{name}" for name in EMBEDDING_TENSORS]
    for layer in range(architecture.num_layers):
        names += [f"layers.{layer}.{name}" for name in LAYER_TENSORS]
        names += [f"scorers.{layer}.{name}" for name in SCORER_TENSORS]
    if architecture.relative_attention_buckets is not None:
        names.append(RELATIVE_BIAS)
    return [*names, *HEAD_TENSORS[head]]


@dataclass(frozen=True)
class LayerWeights:
    qkv: tuple[torch.Tensor, torch.Tensor]  # (3d, d), (3d,)
    out: tuple[torch.Tensor, torch.Tensor]  # (d, d), (d,)
    attn_norm: tuple[torch.Tensor, torch.Tensor]  # (d,), (d,)
    ffn_in: tuple[torch.Tensor, torch.Tensor]  # (f, d), (f,)
    ffn_out: tuple[torch.Tensor, torch.Tensor]  # (d, f), (d,)
    ffn_norm: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ScorerWeights:
    """s_t = vᵀ tanh(W h_t + U m_{t-1}) + b (``training.engine.selection.RetentionScorer``), fp32."""

    W: tuple[torch.Tensor, torch.Tensor]  # (r, d), (r,)
    U: torch.Tensor  # (r, d)
    v: tuple[torch.Tensor, torch.Tensor]  # (1, r), (1,)


@dataclass(frozen=True)
class ModelWeights:
    architecture: Architecture
    head: str  # "sequence" | "token" | "pooled"
    word: torch.Tensor  # (V, d)
    position: torch.Tensor  # (max positions, d)
    token_type: torch.Tensor | None  # (types, d)
    embed_norm: tuple[torch.Tensor, torch.Tensor]
    layers: tuple[LayerWeights, ...]
    scorers: tuple[ScorerWeights, ...]
    relative_bias: torch.Tensor | None  # (buckets, H), fp32
    head_tensors: dict[str, torch.Tensor]

    @property
    def dtype(self) -> torch.dtype:
        return self.word.dtype

    @property
    def device(self) -> torch.device:
        return self.word.device

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held (on its device)."""
        tensors = [self.word, self.position, *self.embed_norm, *self.head_tensors.values()]
        tensors += [t for t in (self.token_type, self.relative_bias) if t is not None]
        for layer in self.layers:
            for pair in (layer.qkv, layer.out, layer.attn_norm, layer.ffn_in, layer.ffn_out, layer.ffn_norm):
                tensors += list(pair)
        for scorer in self.scorers:
            tensors += [*scorer.W, scorer.U, *scorer.v]
        return sum(t.numel() * t.element_size() for t in tensors)


class WeightsError(ValueError):
    """The weights file does not hold what the architecture needs (the message names what is missing)."""


def from_state(
    state: dict[str, torch.Tensor],
    architecture: Architecture,
    head: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ModelWeights:
    """Arrange a flat name → tensor state (``weights.safetensors``) for the forward: the encoder and the
    head in ``dtype`` on ``device``, the scorers and the relative-position table in fp32."""
    missing = [name for name in required_names(architecture, head) if name not in state]
    if missing:
        raise WeightsError(f"weights lack {len(missing)} tensors, e.g. {missing[:3]}")

    def encoder(name: str) -> torch.Tensor:
        return state[name].to(device=device, dtype=dtype).contiguous()

    def fp32(name: str) -> torch.Tensor:
        return state[name].to(device=device, dtype=torch.float32).contiguous()

    def pair(
        prefix: str, convert: Callable[[str], torch.Tensor] = encoder
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return convert(f"{prefix}.weight"), convert(f"{prefix}.bias")

    layers = tuple(
        LayerWeights(
            *(
                pair(f"layers.{i}.{part}")
                for part in ("qkv", "out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm")
            )
        )
        for i in range(architecture.num_layers)
    )
    scorers = tuple(
        ScorerWeights(
            pair(f"scorers.{i}.W", fp32), fp32(f"scorers.{i}.U.weight"), pair(f"scorers.{i}.v", fp32)
        )
        for i in range(architecture.num_layers)
    )
    relative = architecture.relative_attention_buckets is not None
    return ModelWeights(
        architecture=architecture,
        head=head,
        word=encoder("embeddings.word"),
        position=encoder("embeddings.position"),
        token_type=encoder(TOKEN_TYPE) if TOKEN_TYPE in state else None,
        embed_norm=pair("embeddings.norm"),
        layers=layers,
        scorers=scorers,
        relative_bias=fp32(RELATIVE_BIAS) if relative else None,
        head_tensors={name: encoder(name) for name in HEAD_TENSORS[head]},
    )


def load(
    path: Path,
    architecture: Architecture,
    head: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ModelWeights:
    """Read ``weights.safetensors`` (no pickle) and arrange it (``from_state``)."""
    from safetensors.torch import load_file

    return from_state(load_file(str(path)), architecture, head, device, dtype)
