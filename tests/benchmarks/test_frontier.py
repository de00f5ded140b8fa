"""The quality–speed frontier in quick mode, end to end (real ORT sessions, real torch): every family
timed (the two-path graph of a pruned branch with weights of its own too, and the CPU peers of
benchmarks.cpu_peers that the dev lock carries), the reference the faster dense variant, and the quality
joined exactly as the retrieval files say."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from benchmarks import cpu_peers, frontier, report
from benchmarks.retrieval_parts import file_sha1
from training.fitting.fit import WEIGHTS_FILE
from training.tiny import TINY_LAYERS

LEARNED_RHOS = ("0.7", "0.5")
TRUNCATION_WORK = {"0.7": 0.8, "0.5": 0.6}  # more token-work than ρ: the schedule keeps more early on
LAYER_EXITS = ("1",)
KEPT_TOKEN_FLOOR = 4
# the CPU peers whose packages the dev lock carries (OpenVINO's are optional, see test_cpu_peers.py)
LOCKED_PEERS = (cpu_peers.ST_TORCH, cpu_peers.ONNX, cpu_peers.ONNX_INT8)
# tiny random model: an fp32 runtime differs from the fused fp32 graph only in summation order; dynamic
# int8 and torch lose more, but not this much
FP32_COSINE, PEER_COSINE = 0.999, 0.99


def retrieval_cell(ndcg: float, work: float, paired: bool = True) -> dict[str, Any]:
    """A retrieval.json cell with the fields the frontier reads (and none of the others)."""
    cell: dict[str, Any] = {"ndcg@10": ndcg, "document_token_work": work}
    if paired:
        cell["ndcg_vs_dense"] = {"difference": round(ndcg - 80.0, 2), "se": 0.4}
    return cell


def synthetic_retrieval(offset: float = 0.0) -> dict[str, Any]:
    """A tiny retrieval.json: dense, learned, truncation and layer-exit cells (``offset`` moves every
    nDCG, so two files cannot be confused)."""
    results: dict[str, Any] = {
        "dense": {"1": retrieval_cell(80.0 + offset, 1.0, paired=False)},
        "learned": {
            rho: retrieval_cell(79.0 - i + offset, 0.6 - i / 10) for i, rho in enumerate(LEARNED_RHOS)
        },
        "truncation": {
            rho: retrieval_cell(75.0 - i + offset, work)
            for i, (rho, work) in enumerate(TRUNCATION_WORK.items())
        },
        "layer-exit": {k: retrieval_cell(70.0 + offset, int(k) / TINY_LAYERS) for k in LAYER_EXITS},
    }
    for rho in LEARNED_RHOS:
        results["learned"][rho]["ndcg_vs_truncation"] = {"difference": 4.0, "se": 0.5}
    return {"model": "tiny", "dataset": "synthetic", "queries": 3, "documents": 4, "results": results}


def write(path: Path, payload: dict[str, Any]) -> Path:
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def test_quick_frontier_times_every_family_and_joins_the_files_quality(tmp_path: Path) -> None:
    fp32, int8 = synthetic_retrieval(), synthetic_retrieval(offset=-2.0)
    copy, copy_int8 = synthetic_retrieval(offset=0.5), synthetic_retrieval(offset=-1.0)
    fp32["min_kept_tokens"] = KEPT_TOKEN_FLOOR  # as a retrieval run with --min-kept-tokens records it
    out = tmp_path / "frontier.json"
    frontier.main(
        [
            "--quick",
            "--retrieval",
            str(write(tmp_path / "retrieval.json", fp32)),
            "--retrieval-int8",
            str(write(tmp_path / "retrieval-int8.json", int8)),
            "--pruned-branch-retrieval",
            str(write(tmp_path / "copy.json", copy)),
            "--pruned-branch-retrieval-int8",
            str(write(tmp_path / "copy-int8.json", copy_int8)),
            "--out",
            str(out),
        ]
    )
    payload = json.loads(out.read_text())
    rows = {row["variant"]: row for row in payload["results"]}
    # every family but the CPU peers, which only --cpu-peers adds
    assert {row["family"] for row in rows.values()} == set(frontier.FAMILIES) - {frontier.CPU_PEER_FAMILY}
    assert payload["settings"]["cpu_peers"] == [] and payload["cpu_peer_setup"] is None
    assert set(rows) == {
        "peer-fused",
        "torch-sdpa",
        "peer-fused-int8",
        "layer-exit-1",
        *(f"{family}@{rho}" for family in ("truncation", "int8-truncation") for rho in TRUNCATION_WORK),
        *(
            f"{graph}@{rho}"
            for graph in ("ours-onnx", "ours-onnx-int8", "copy-onnx", "copy-onnx-int8")
            for rho in ("1", *LEARNED_RHOS)
        ),
    }
    assert all(row["documents_per_second"] > 0 for row in rows.values())
    # int8 truncation: the int8 file's truncation cells, timed on the int8 peer
    assert (
        rows["int8-truncation@0.5"]["quality"]["ndcg_at_10"]
        == int8["results"]["truncation"]["0.5"]["ndcg@10"]
    )
    # speed at equal quality: every learned point against its precision's truncation curve, where it lies
    # inside that curve (learned ρ 0.7 scores 79, between truncation's 75 and dense's 80); the copy's
    # families against the same curves (int8: int8 truncation, from the int8 peer)
    fp32_curve = {"peer-fused": 80.0, "truncation@0.7": 75.0, "truncation@0.5": 74.0}
    int8_curve = {"peer-fused-int8": 78.0, "int8-truncation@0.7": 73.0, "int8-truncation@0.5": 72.0}
    for variant, curve, ndcg_there in (
        ("ours-onnx@0.7", fp32_curve, 79.0),
        ("copy-onnx@0.7", fp32_curve, 79.5),
        ("copy-onnx-int8@0.7", int8_curve, 78.0),
    ):
        rival = [(ndcg, rows[name]["documents_per_second"]) for name, ndcg in curve.items()]
        expected = rows[variant]["documents_per_second"] / frontier.interpolated_speed(rival, ndcg_there)
        assert rows[variant]["speedup_vs_truncation_at_equal_ndcg"] == pytest.approx(expected), variant
    table = out.with_suffix(".md").read_text()
    assert "docs/s vs truncation at equal nDCG" in table and "copy.json" in table

    reference = payload["reference"]["variant"]
    candidates = payload["reference"]["candidates"]
    assert set(candidates) == {"peer-fused", "torch-sdpa"}
    assert candidates[reference] == max(candidates.values()) == rows[reference]["documents_per_second"]
    assert_speedups_are_the_measured_times(rows, reference, payload["settings"]["documents_per_call"])

    def joined(variant: str) -> dict[str, Any]:
        return rows[variant]["quality"]

    graphs = {"ours-onnx": fp32, "ours-onnx-int8": int8, "copy-onnx": copy, "copy-onnx-int8": copy_int8}
    for prefix, source in graphs.items():
        results = source["results"]
        assert joined(f"{prefix}@1")["ndcg_at_10"] == results["dense"]["1"]["ndcg@10"]
        for rho in LEARNED_RHOS:
            cell, quality = results["learned"][rho], joined(f"{prefix}@{rho}")
            assert quality["ndcg_at_10"] == cell["ndcg@10"]
            assert quality["ndcg_vs_dense"] == cell["ndcg_vs_dense"]
            assert quality["ndcg_vs_truncation"] == cell["ndcg_vs_truncation"]
    assert joined("peer-fused-int8")["ndcg_at_10"] == int8["results"]["dense"]["1"]["ndcg@10"]
    assert joined("torch-sdpa")["ndcg_at_10"] == fp32["results"]["dense"]["1"]["ndcg@10"]
    for rho, work in TRUNCATION_WORK.items():
        row = rows[f"truncation@{rho}"]
        assert row["quality"]["ndcg_at_10"] == fp32["results"]["truncation"][rho]["ndcg@10"]
        assert row["tokens"] == round(work * frontier.QUICK_SEQ_LEN)  # no half ties at these values
    assert joined("layer-exit-1")["ndcg_at_10"] == fp32["results"]["layer-exit"]["1"]["ndcg@10"]
    assert rows["layer-exit-1"]["layers"] == 1

    assert payload["our_schedule"]["min_kept_tokens"] == KEPT_TOKEN_FLOOR  # the graph whose quality it is
    assert payload["machine"]["cores"] >= 1
    assert payload["command"].startswith("python -m benchmarks.frontier --quick")
    assert out.with_suffix(".md").read_text().startswith("# Quality–speed frontier (embeddings)")
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert_report_shows(out)


def assert_speedups_are_the_measured_times(rows: dict[str, Any], reference: str, documents: int) -> None:
    """Each row's rate is its own median time, and its speed-up (the median of per-round ratios to the
    reference) lies in its per-round range, which also holds the ratio of the two median times: a
    speed-up taken against another variant, or inverted, falls outside it."""
    for name, row in rows.items():
        assert row["documents_per_second"] == pytest.approx(documents / row["seconds_per_batch"])
        low, high = row["speedup_min"] * (1 - 1e-9), row["speedup_max"] * (1 + 1e-9)
        assert low <= row["speedup_vs_reference"] <= high, name
        assert low <= rows[reference]["seconds_per_batch"] / row["seconds_per_batch"] <= high, name


def assert_report_shows(out: Path) -> None:
    """docs/benchmarks.md's section: the command and a placeholder, then the committed table and plot."""
    results, plots = out.parent / "results", out.parent / "plots"
    (results / "bench").mkdir(parents=True)
    plots.mkdir()
    placeholder = "\n".join(report.frontier_section(results, plots))
    assert "python -m benchmarks.frontier" in placeholder and "(not measured yet)" in placeholder
    for suffix in (".json", ".md"):
        shutil.copy(out.with_suffix(suffix), results / "bench" / f"frontier{suffix}")
    shutil.copy(out.with_suffix(".png"), plots / report.FRONTIER_PLOT)
    section = "\n".join(report.frontier_section(results, plots))
    assert section.startswith("## Quality–speed frontier (embeddings)")
    assert "| dense | peer-fused |" in section and f"(plots/{report.FRONTIER_PLOT})" in section


def test_cpu_peers_are_timed_in_the_same_rounds_with_their_cosine_and_no_ndcg(tmp_path: Path) -> None:
    """--cpu-peers: each peer a row of its own family, timed in the frontier's rounds against its
    reference, its quality the cosine to the fused fp32 peer's vectors; nothing nDCG-based for it."""
    out = tmp_path / "frontier.json"
    retrieval_file = write(tmp_path / "retrieval.json", synthetic_retrieval())
    payload = frontier.main(
        ["--quick", "--retrieval", str(retrieval_file), "--out", str(out), "--cpu-peers", *LOCKED_PEERS]
    )
    rows = {row["variant"]: row for row in payload["results"]}
    peers = {name: row for name, row in rows.items() if row["family"] == frontier.CPU_PEER_FAMILY}
    int8_peer = f"{cpu_peers.ONNX_INT8}-{cpu_peers.this_cpu_preset()}"
    assert set(peers) == {cpu_peers.ST_TORCH, cpu_peers.ONNX, int8_peer}  # ort-fused is peer-fused: once
    assert payload["settings"]["cpu_peers"] == list(LOCKED_PEERS)
    assert all(row["documents_per_second"] > 0 for row in peers.values())
    # the same rounds: as many as the reference ran, and paired with it round by round
    settings, reference = payload["settings"], payload["reference"]["variant"]
    assert all(row["rounds"] == settings["rounds_run"] == frontier.QUICK_REPEATS for row in peers.values())
    assert_speedups_are_the_measured_times(rows, reference, settings["documents_per_call"])

    assert (peers[cpu_peers.ONNX]["precision"], peers[int8_peer]["precision"]) == ("fp32", "int8")
    assert peers[cpu_peers.ONNX]["cosine_to_dense_fp32"]["min"] > FP32_COSINE
    for name, row in peers.items():
        cosine = row["cosine_to_dense_fp32"]
        assert PEER_COSINE < cosine["min"] <= cosine["mean"] <= 1 + 1e-6, name
        assert row["quality"] == asdict(frontier.UNMEASURED), name
        assert row["speedup_vs_truncation_at_equal_ndcg"] is None, name
    assert not set(peers) & set(frontier.equal_quality_speedups(payload["results"]))

    setup = payload["cpu_peer_setup"]
    assert setup["calibration"] is None and set(setup["libraries"]) == set(cpu_peers.PEER_LIBRARIES)
    table = out.with_suffix(".md").read_text()
    assert "| cpu-peer | onnx | onnxruntime, default optimisations |" in table
    peer_lines = [line for line in table.splitlines() if line.startswith("| cpu-peer |")]
    assert len(peer_lines) == len(peers)
    assert all(line.endswith("| not measured | — | — | — |") for line in peer_lines)
    assert "sentence-transformers" in table and "OpenVINO int8 calibration: not used" in table
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_a_cpu_peer_without_its_package_stops_the_run_before_anything_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package check comes first: not even the retrieval file (absent here) is read."""
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    out = tmp_path / "frontier.json"
    arguments = ["--quick", "--retrieval", str(tmp_path / "absent.json"), "--out", str(out)]
    with pytest.raises(cpu_peers.MissingPeerPackage, match="'openvino'"):
        frontier.main([*arguments, "--cpu-peers", cpu_peers.ONNX, cpu_peers.OPENVINO])
    assert not out.exists()


def test_real_documents_are_timed_at_their_own_lengths(tmp_path: Path) -> None:
    """--documents: every variant embeds the same real documents (length-sorted batches, each at its own
    length, truncation cutting each document to its share), not random words of one length."""
    from tests.benchmarks.test_retrieval import squad_file

    out = tmp_path / "frontier.json"
    retrieval_file = write(tmp_path / "retrieval.json", synthetic_retrieval())
    arguments = ["--quick", "--retrieval", str(retrieval_file), "--out", str(out)]
    schedule = ["--leading-share", "0.5", "--min-kept-tokens", str(KEPT_TOKEN_FLOOR + 1)]
    frontier.main(
        [
            *arguments,
            *schedule,
            "--documents",
            "squad",
            "--document-count",
            "3",
            "--data",
            str(squad_file(tmp_path)),
        ]
    )
    payload = json.loads(out.read_text())
    settings = payload["settings"]
    # the schedule options reach the graph exported (its model's config) and are recorded as given
    assert settings["leading_share"] == payload["our_schedule"]["leading_share"] == 0.5
    assert settings["min_kept_tokens"] == payload["our_schedule"]["min_kept_tokens"] == KEPT_TOKEN_FLOOR + 1
    assert (
        settings["documents_per_call"] == 3
        and "squad documents at their own lengths" in settings["documents"]
    )
    assert 5 < settings["mean_document_tokens"] <= frontier.QUICK_SEQ_LEN
    assert all(row["documents_per_second"] > 0 for row in payload["results"])


def test_schedule_options_change_the_kept_counts_of_our_model(tmp_path: Path) -> None:
    """--leading-share / --min-kept-tokens go through training.fitting.fit.with_schedule into the model whose
    graph the frontier exports: its keep counts change (here the floor), the run's own without them."""
    import torch

    from benchmarks.embedding_graphs import DEFAULT_RECIPE, our_model, tiny_checkpoint

    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    own = our_model(None, DEFAULT_RECIPE, checkpoint)
    chosen = our_model(None, DEFAULT_RECIPE, checkpoint, {"leading_share": 0.5, "min_kept_tokens": 64})
    assert (chosen.config.leading_share, chosen.config.min_kept_tokens) == (0.5, 64)
    assert own.config.min_kept_tokens < 64  # the recipe's own floor
    lengths = torch.tensor([96])

    def counts(model: Any) -> list[int]:
        return model.keep_counts(torch.tensor([0.1]), lengths, torch.ones_like(lengths))[0].tolist()

    assert min(counts(chosen)) >= 64 > min(counts(own))


def test_interpolated_speed_is_linear_between_the_bracketing_points_and_none_outside() -> None:
    curve = [(70.0, 100.0), (80.0, 50.0), (75.0, 80.0)]
    assert frontier.interpolated_speed(curve, 77.5) == pytest.approx(65.0)
    assert frontier.interpolated_speed(curve, 70.0) == pytest.approx(100.0)
    assert (
        frontier.interpolated_speed(curve, 81.0) is None and frontier.interpolated_speed(curve, 60.0) is None
    )


def test_int8_quality_is_not_measured_without_an_int8_retrieval_file() -> None:
    points = frontier.frontier_points(synthetic_retrieval(), None, frontier.SEQ_LEN, TINY_LAYERS)
    int8 = [point for point in points if point.precision == "int8"]
    assert {point.family for point in int8} == {"int8-dense", "int8-learned"}  # no copy without its file
    assert all(point.quality == frontier.UNMEASURED for point in int8)
    assert all(point.quality.ndcg_at_10 is not None for point in points if point.precision == "fp32")


def test_a_layer_exit_deeper_than_the_model_is_refused() -> None:
    payload = synthetic_retrieval()
    payload["results"]["layer-exit"] = {str(TINY_LAYERS + 1): retrieval_cell(70.0, 1.0)}
    with pytest.raises(SystemExit, match="layers"):
        frontier.frontier_points(payload, None, frontier.SEQ_LEN, TINY_LAYERS)


def test_a_retrieval_file_of_other_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / WEIGHTS_FILE).write_bytes(b"these weights")
    frontier.check_same_run(tmp_path, {"run_weights_sha1": file_sha1(tmp_path / WEIGHTS_FILE)})
    frontier.check_same_run(tmp_path, {})  # files written before the fingerprint: nothing to check
    with pytest.raises(SystemExit, match="other weights"):
        frontier.check_same_run(tmp_path, {"run_weights_sha1": "0" * 40})
