"""Pruning at every k-th point (``RetentionConfig.pruning_interval``): the grouped schedule, the pass that
skips the points inside a group (the same vectors as selecting every token there), the exported graph
(fewer selection nodes, parity with torch), the manifest and the service's cost of a row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from retention_core.contract import Manifest, Schedule
from retention_ort import open_session
from service.scheduling.cost import schedule_fraction
from tests.tiny import tiny_model, tiny_recipe
from training.__main__ import main as training_main
from training.engine import selection as S
from training.engine.encoders import backbone_from_config, load_tokenizer
from training.engine.model import RetentionConfig, RetentionModel
from training.export.graph import example_inputs, export_onnx, graph_for, validate_onnx
from training.fitting.fit import save_run
from training.tiny import TINY_TOKENIZER, tiny_config

LAYERS = 5  # groups of 2 → points 0, 2, 4 select; an odd count leaves a last group of one
LENGTH = 40


def deep_tiny(family: str, interval: int, merge: bool = True) -> RetentionModel:
    """A tiny embedding model of ``LAYERS`` layers (random weights) with the given pruning interval."""
    torch.manual_seed(0)
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    config = tiny_config(tokenizer.vocab_size, family)
    config.num_hidden_layers = LAYERS
    retention = RetentionConfig(merge_dropped=merge, leading_share=0.25, pruning_interval=interval)
    return RetentionModel(backbone_from_config(config), "embedding", None, retention).eval()


def test_interval_one_is_the_per_layer_schedule() -> None:
    rho = torch.tensor([0.3, 0.5, 1.0])
    expected = rho.unsqueeze(-1) ** ((torch.arange(1, 7) / 6.0) ** 2.0)  # (B, P)
    assert torch.equal(S.keep_fractions(rho, 6, 2.0), expected)
    assert torch.equal(S.keep_fractions(rho, 6, 2.0, interval=1), expected)


def test_groups_keep_one_fraction_and_end_at_rho() -> None:
    rho = torch.tensor([0.3])
    fractions = S.keep_fractions(rho, LAYERS, interval=2)[0]  # (P,): groups {0, 1}, {2, 3}, {4}
    third = 0.3 ** (1 / 3)
    torch.testing.assert_close(fractions, torch.tensor([third, third, third**2, third**2, 0.3]))
    assert [S.is_pruning_point(p, 2) for p in range(LAYERS)] == [True, False, True, False, True]
    counts = S.keep_counts(rho, torch.tensor([40]), torch.tensor([1]), LAYERS, interval=2)[0]
    assert counts.tolist() == [27, 27, 18, 18, 12]  # round(40·0.3^(g/3)): a skipped point keeps its group's


@pytest.mark.parametrize(("family", "merge"), [("bert", True), ("bert", False), ("mpnet", True)])
def test_skipping_a_point_equals_selecting_every_token_there(
    family: str, merge: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pilot measured (selection at every point with grouped counts) is what the pass computes
    while skipping the points inside a group."""
    model = deep_tiny(family, interval=2, merge=merge)
    example = example_inputs(3, LENGTH, model.backbone.info_vocab_size, (0.3, 0.5, 0.7), seed=3)
    inputs = (example["input_ids"], example["attention_mask"], example["rho"])
    with torch.no_grad():
        skipped = model.forward_pruned(*inputs)
        monkeypatch.setattr(S, "is_pruning_point", lambda point, interval: True)
        selected = model.forward_pruned(*inputs)
    assert torch.equal(skipped.kept_counts, selected.kept_counts)
    assert torch.equal(skipped.survival_depth, selected.survival_depth)
    torch.testing.assert_close(skipped.logits, selected.logits, atol=1e-5, rtol=0.0)


def topk_nodes(path: Path) -> int:
    """TopK nodes anywhere in the graph, the If branches included: one per selecting point."""

    def count(graph: onnx.GraphProto) -> int:
        total = 0
        for node in graph.node:
            total += node.op_type == "TopK"
            total += sum(count(attr.g) for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH)
        return total

    return count(onnx.load(str(path)).graph)


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_the_exported_graph_leaves_out_the_skipped_points_and_equals_torch(
    tmp_path: Path, family: str
) -> None:
    every, grouped = deep_tiny(family, interval=1), deep_tiny(family, interval=2)
    vocab = every.backbone.info_vocab_size
    export_onnx(every, tmp_path / "every.onnx", vocab)
    export_onnx(grouped, tmp_path / "grouped.onnx", vocab)
    report = validate_onnx(grouped, tmp_path / "grouped.onnx", vocab)  # raises on any mismatch
    assert report.cases > 0 and report.max_abs_diff <= 1e-4
    selecting = len([p for p in range(LAYERS) if S.is_pruning_point(p, 2)])
    per_point = topk_nodes(tmp_path / "every.onnx") // LAYERS
    assert per_point >= 1 and topk_nodes(tmp_path / "grouped.onnx") == per_point * selecting
    example = example_inputs(3, LENGTH, vocab, (0.3, 1.0, 0.6), seed=5)
    graph = graph_for(grouped)
    with torch.no_grad():
        expected = graph(*(example[name] for name in graph.input_names))
    feeds = {name: example[name].numpy() for name in graph.input_names}
    vectors, counts, depth = open_session(tmp_path / "grouped.onnx").run(None, feeds)
    assert np.array_equal(counts, expected[1].numpy()) and np.array_equal(depth, expected[2].numpy())
    assert float(np.max(np.abs(vectors - expected[0].numpy()))) <= 1e-5


def test_export_option_writes_the_interval_to_the_manifest(tmp_path: Path) -> None:
    model, tokenizer = tiny_model("embedding")
    model.config = dataclasses.replace(model.config, merge_dropped=True)
    run_dir = tmp_path / "run"
    save_run(model, tiny_recipe("embedding"), tokenizer, run_dir)
    training_main(["export", str(run_dir), "--out", str(tmp_path / "out"), "--no-quality"])
    assert Manifest.read(tmp_path / "out").schedule.pruning_interval == 1
    args = ["export", str(run_dir), "--out", str(tmp_path / "k2"), "--no-quality", "--pruning-interval", "2"]
    training_main(args)
    manifest = Manifest.read(tmp_path / "k2")
    assert manifest.schedule.pruning_interval == 2
    assert manifest.training["recipe"]["retention"]["pruning_interval"] == 2  # type: ignore[index]


def test_the_service_costs_a_row_with_the_grouped_schedule() -> None:
    """The admission cost model's kept fraction is the mean of the graph's grouped fractions."""
    for interval in (1, 2, 3):
        schedule = Schedule(num_points=LAYERS, pruning_interval=interval)
        for rho in (0.3, 0.6, 1.0):
            rhos = torch.tensor([rho], dtype=torch.float64)
            expected = float(S.keep_fractions(rhos, LAYERS, interval=interval).mean())
            assert schedule_fraction(schedule, rho) == pytest.approx(expected, abs=1e-12)
    assert Schedule(num_points=LAYERS).pruning_interval == 1  # directories exported before it
