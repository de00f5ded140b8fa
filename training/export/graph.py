"""The served graph, traced and checked against torch.

``export_onnx`` traces the pruned pass and the unpruned one (ρ = 1: the dense model's operators and
nothing else) with the TorchScript exporter and joins them under ``If`` choices
(``training.export.two_path``). The graph of every task is the same wrapper (``RetentionGraph``): the task's
registered inputs (``retention_core.tasks``) become ``forward_pruned`` arguments by name.
``validate_onnx`` compares onnxruntime with torch on a grid of batch sizes, ragged lengths and ρ values
and raises ``ExportValidationError`` on any mismatch, before anything is written to a model directory.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from retention_core.tasks import TaskSpec
from retention_ort import open_session
from training.engine.model import BranchPaths, RetentionModel
from training.export.two_path import (
    with_both_paths_branch,
    with_unpruned_branch,
    with_weights_beside_their_pass,
)

OPSET = 17
LOGIT_ATOL = 1e-4  # ORT matches torch to ~1e-6 in fp32; 1e-4 leaves room for kernel differences
VALIDATION_BATCH_SIZES = (1, 3)
VALIDATION_LENGTHS = (4, 9, 33)
VALIDATION_RHOS = (0.1, 0.3, 0.5, 1.0)
VALIDATION_SEED = 1234


class ExportValidationError(RuntimeError):
    """The exported graph disagrees with torch."""


# Graph inputs that are not positional ``forward_pruned`` arguments → (keyword, conversion).
PRUNED_KEYWORDS = {
    "protected_mask": ("protected", lambda tensor: tensor.bool()),  # int64 over the wire, bool inside
    "token_type_ids": ("token_type_ids", lambda tensor: tensor),
}
PRUNED_POSITIONAL = ("input_ids", "attention_mask", "rho")


class RetentionGraph(nn.Module):
    """The exported graph of any task: its inputs, in the task's order → (main output, kept_counts (B, P),
    survival_depth (B, T)).

    Token heads (QA, summarization) have Drop-and-Restore baked in: every token's last state is
    scattered back before the head.
    """

    def __init__(
        self,
        model: RetentionModel,
        input_names: Sequence[str],
        unpruned: bool = False,
        paths: BranchPaths = "by_batch",
    ) -> None:
        super().__init__()
        unknown = set(input_names) - set(PRUNED_POSITIONAL) - set(PRUNED_KEYWORDS)
        if unknown:
            raise ValueError(
                f"task {model.task!r}: no forward_pruned argument for graph inputs {sorted(unknown)}"
            )
        self.model = model
        self.input_names = tuple(input_names)
        self.unpruned = unpruned  # the all-ρ ≥ 1 branch: forward_unpruned (ρ and protected unused)
        self.paths = paths  # a two-path model's choice of path(s) (``RetentionModel.forward_pruned``)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        named = dict(zip(self.input_names, inputs, strict=True))
        if self.unpruned:
            out = self.model.forward_unpruned(
                named["input_ids"], named["attention_mask"], named.get("token_type_ids")
            )
            return out.logits, out.kept_counts, out.survival_depth
        keywords = {
            keyword: convert(named[name])
            for name, (keyword, convert) in PRUNED_KEYWORDS.items()
            if name in named
        }
        out = self.model.forward_pruned(
            *(named[name] for name in PRUNED_POSITIONAL), **keywords, paths=self.paths
        )
        return out.logits, out.kept_counts, out.survival_depth


def graph_for(
    model: RetentionModel, unpruned: bool = False, paths: BranchPaths = "by_batch"
) -> RetentionGraph:
    """The graph of the model's task (``model.spec``, the registry entry it was built from)."""
    # eval() on the wrapper: the exporter restores the wrapper's mode on every child afterwards.
    return RetentionGraph(model, [spec.name for spec in model.spec.inputs], unpruned, paths).eval()


def dynamic_axes(task: TaskSpec) -> dict[str, dict[int, str]]:
    """The named (non-numeric) axes of the task's graph inputs and exported outputs, per tensor."""
    specs = (*task.inputs, *task.exported_outputs)
    return {spec.name: {i: axis for i, axis in enumerate(spec.axes) if not axis.isdigit()} for spec in specs}


def export_onnx(model: RetentionModel, path: Path, vocab_size: int) -> None:
    """The served graph: ``If`` every row asks ρ ≥ 1, the unpruned branch (the dense model's operators
    and nothing else), else the pruned pass; each traced with the TorchScript exporter (it keeps the
    data-dependent TopK k as a tensor) and joined by ``with_unpruned_branch``.

    A model whose pruned branch has weights of its own (``pruned_backbone``) gets one more choice below
    the first: ``If`` some row asks ρ ≥ 1 (a mixed batch), both paths over every row, each row taking
    its own (``with_both_paths_branch``), else the copy's pruned pass alone. So ρ = 1 runs the original's
    weights and operators only, and a batch at ρ < 1 pays for the copy's pruned pass only; the weights
    only that side reads live in its branch (``with_weights_beside_their_pass``)."""
    model = model.eval()
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        pruned, unpruned = Path(tmp) / "pruned.onnx", Path(tmp) / "unpruned.onnx"
        trace_onnx(graph_for(model, paths="pruned"), pruned, vocab_size)
        trace_onnx(graph_for(model, unpruned=True), unpruned, vocab_size)
        below = onnx.load(str(pruned))
        if model.pruned_backbone is not None:
            both = Path(tmp) / "both.onnx"
            trace_onnx(graph_for(model, paths="both"), both, vocab_size)
            below = with_both_paths_branch(below, onnx.load(str(both)))
        joined = with_unpruned_branch(below, onnx.load(str(unpruned)))
    onnx.save(with_weights_beside_their_pass(joined), str(path))


def trace_onnx(graph: RetentionGraph, path: Path, vocab_size: int) -> None:
    task = graph.model.spec
    example = example_inputs(batch=2, length=8, vocab_size=vocab_size, rhos=(0.5, 1.0), seed=0)
    with torch.no_grad():
        torch.onnx.export(
            graph,
            tuple(example[spec.name] for spec in task.inputs),
            str(path),
            input_names=[spec.name for spec in task.inputs],
            output_names=[spec.name for spec in task.exported_outputs],
            dynamic_axes=dynamic_axes(task),
            opset_version=OPSET,
            dynamo=False,
        )


def example_inputs(
    batch: int, length: int, vocab_size: int, rhos: Sequence[float], seed: int
) -> dict[str, torch.Tensor]:
    """Ragged right-padded inputs: row i has length - i·stride real tokens (at least 2). Every graph
    input any task declares, by name; a task's graph takes the ones its ``TaskSpec.inputs`` names. The
    trace, the validation grid, the speed rows (``training.export.speed``) and the dense baseline
    (``training.export.dense_graph``) all start from these."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, length), generator=generator)  # (B, T)
    attention_mask = torch.ones(batch, length, dtype=torch.long)  # (B, T)
    for row in range(batch):
        real = max(2, length - row * max(1, length // (batch + 1)))
        attention_mask[row, real:] = 0
        input_ids[row, real:] = 0
    rho = torch.tensor([rhos[i % len(rhos)] for i in range(batch)], dtype=torch.float32)  # (B,)
    # QA-style pair: the first third of each row (at least [CLS]) is the protected question segment.
    positions = torch.arange(length).unsqueeze(0)  # (1, T)
    question = positions < max(1, length // 3)  # (1, T)
    token_type_ids = (~question).to(torch.long).expand(batch, -1) * attention_mask  # (B, T)
    protected_mask = question.to(torch.long).expand(batch, -1) * attention_mask  # (B, T)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "rho": rho,
        "token_type_ids": token_type_ids.contiguous(),
        "protected_mask": protected_mask.contiguous(),
    }


@dataclass(frozen=True)
class ParityReport:
    cases: int
    max_abs_diff: float


def validate_onnx(model: RetentionModel, onnx_path: Path, vocab_size: int) -> ParityReport:
    """Compare ORT with torch on the grid; raise on mismatch of logits, kept counts or survival depth."""
    graph = graph_for(model)
    session = open_session(onnx_path)
    worst, cases = 0.0, 0
    rho_sets = [(rho,) for rho in VALIDATION_RHOS] + [VALIDATION_RHOS]  # uniform and mixed budgets
    for batch, length, rhos in itertools.product(VALIDATION_BATCH_SIZES, VALIDATION_LENGTHS, rho_sets):
        example = example_inputs(batch, length, vocab_size, rhos, seed=VALIDATION_SEED + cases)
        with torch.no_grad():
            expected = graph(*(example[name] for name in graph.input_names))
        feeds = {name: example[name].numpy() for name in graph.input_names}
        logits, counts, depth = session.run(None, feeds)
        where = f"batch={batch} length={length} rho={rhos}"
        check_exact("kept counts", counts, expected[1], where)
        check_exact("survival depth", depth, expected[2], where)
        diff = float(np.max(np.abs(logits - expected[0].numpy())))
        if diff > LOGIT_ATOL:
            raise ExportValidationError(f"logits differ by {diff:.2e} > {LOGIT_ATOL:.0e} at {where}")
        worst, cases = max(worst, diff), cases + 1
    return ParityReport(cases=cases, max_abs_diff=worst)


def check_exact(what: str, onnx_value: np.ndarray, torch_value: torch.Tensor, where: str) -> None:
    """Integer outputs must match torch exactly."""
    if not np.array_equal(onnx_value, torch_value.numpy()):
        raise ExportValidationError(
            f"{what} differ at {where}: onnx={onnx_value.tolist()} torch={torch_value.tolist()}"
        )
