"""The CPU peers (benchmarks.cpu_peers) on a tiny random sentence-transformers model: every peer built
(torch, ONNX fp32 and dynamic int8, OpenVINO at the plugin's precision, forced f32 and NNCF static int8)
gives sentence-transformers' own vectors, runs as a ``timed_rounds`` call over the frontier's batches,
and the command line writes its JSON, table and machine record. The peers tested here are those the dev
lock carries (torch, onnxruntime); the OpenVINO peers need openvino and nncf (``pip install
'.[cpu-peers]'``, which installs beside the pinned torch / transformers / onnxruntime; optimum does not),
left out of the lock because nncf's dependencies (pydot) change what the GPU check's device-image import
filter sees. Their code path is what produced results/experiments/cpu-peers/; without the packages it
names the missing one (tested below)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cpu_peers
from benchmarks.harness import timed_rounds
from benchmarks.retrieval_parts import cosine_distribution
from benchmarks.timed_documents import batched
from tests.tasks.test_embedding import TEXTS, write_sentence_transformer

BATCH = 2
# fp32 runtimes differ from torch only in summation order; a bf16 plugin or int8 graph of a tiny random
# model loses more, but not this much (measured ≥ 0.9999 on AVX-512 VNNI; the bound leaves room for
# other kernels)
FP32_COSINE, REDUCED_COSINE = 1 - 1e-5, 0.99
OPTIONAL = ("openvino", "nncf", "sentence_transformers", "torch")
LOCKED_PEERS = (cpu_peers.ST_TORCH, cpu_peers.ONNX, cpu_peers.ONNX_INT8)  # no optional package needed


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sentence_transformer(tmp_path_factory.mktemp("st") / "model")


@pytest.fixture(scope="module")
def peers(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, cpu_peers.Peer]:
    workdir = tmp_path_factory.mktemp("peers")
    return cpu_peers.build_peers(model, workdir, LOCKED_PEERS, 1, TEXTS[::-1], preset="avx2")


def rows_of(model: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return cpu_peers.token_rows(tokenizer, TEXTS, cpu_peers.st_max_length(model))


def test_the_preset_is_the_fastest_the_cpu_flags_allow() -> None:
    assert cpu_peers.dynamic_preset({"avx2", "avx512f", "avx512_vnni"}) == "avx512_vnni"
    assert cpu_peers.dynamic_preset({"avx2", "avx512f"}) == "avx512"
    assert cpu_peers.dynamic_preset({"avx2", "fma"}) == "avx2"
    assert cpu_peers.dynamic_preset(set()) == cpu_peers.FALLBACK_PRESET


def test_every_peer_gives_sentence_transformers_vectors(
    model: Path, peers: dict[str, cpu_peers.Peer]
) -> None:
    names = {cpu_peers.REFERENCE, *LOCKED_PEERS} - {cpu_peers.ONNX_INT8} | {"onnx-int8-avx2"}
    assert set(peers) == names
    reference = cpu_peers.st_vectors(model, TEXTS, BATCH)
    rows = rows_of(model)
    for name, peer in peers.items():
        cosine = cosine_distribution(cpu_peers.peer_vectors(peer.encode, rows, BATCH), reference)
        bound = FP32_COSINE if peer.precision in ("fp32", "f32") else REDUCED_COSINE
        assert cosine["min"] >= bound, (name, peer.precision, cosine)
    assert peers["onnx-int8-avx2"].precision == "int8"


def test_each_peer_is_one_timed_call_over_the_frontiers_batches(
    model: Path, peers: dict[str, cpu_peers.Peer]
) -> None:
    rows = rows_of(model)
    runs = cpu_peers.peer_runs(peers, rows, BATCH)
    sizes = [len(feeds["input_ids"]) for feeds in batched(rows, BATCH)]
    for name, run in runs.items():
        assert [len(out) for out in run()] == sizes, name  # type: ignore[attr-defined]
    rounds = timed_rounds(runs, repeats=2, iterations=1, max_seconds=60.0)
    assert {name: len(seconds) for name, seconds in rounds.items()} == dict.fromkeys(runs, 2)


def test_a_peer_without_its_package_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    with pytest.raises(cpu_peers.MissingPeerPackage, match="'openvino'"):
        cpu_peers.openvino_ir(tmp_path / "peer.onnx", tmp_path / "peer.xml")
    monkeypatch.setitem(sys.modules, "nncf", None)
    with pytest.raises(cpu_peers.MissingPeerPackage, match="'nncf'"):
        cpu_peers.require("nncf", cpu_peers.OPENVINO_INT8)


def test_the_module_imports_without_the_optional_packages() -> None:
    code = f"import sys, benchmarks.cpu_peers; print(sorted(set({OPTIONAL!r}) & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def write_squad(path: Path, paragraphs: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for i, context in enumerate(paragraphs):
            handle.write(
                json.dumps({"id": str(i), "question": f"what about {i}?", "context": context}) + "\n"
            )
    return path


def cli(model: Path, tmp_path: Path, train: list[str], *peers: str) -> dict[str, object]:
    dev = write_squad(tmp_path / "dev.jsonl.gz", TEXTS[:4])
    calibration = write_squad(tmp_path / "train.jsonl.gz", train)
    argv = ["--out", str(tmp_path / "out"), "--model", str(model), "--data", str(dev)]
    argv += ["--calibration", str(calibration), "--documents", "4", "--batch", str(BATCH), "--repeats", "2"]
    return cpu_peers.main([*argv, "--threads", "1", "--peers", *peers])


def test_the_command_line_times_the_peers_against_the_fused_graph(model: Path, tmp_path: Path) -> None:
    payload = cli(model, tmp_path, TEXTS[4:], cpu_peers.ONNX, cpu_peers.ONNX_INT8)
    results = {row["peer"]: row for row in payload["results"]}  # type: ignore[attr-defined]
    assert set(results) == {cpu_peers.REFERENCE, cpu_peers.ONNX, f"onnx-int8-{cpu_peers.this_cpu_preset()}"}
    assert results[cpu_peers.REFERENCE]["speedup_vs_reference"] == 1.0
    assert all(row["cosine_to_st_fp32"]["min"] >= REDUCED_COSINE for row in results.values())
    written = json.loads((tmp_path / "out" / cpu_peers.OUT_NAME).read_text(encoding="utf-8"))
    assert written["machine"]["cpu_class"] and "cpu_flags" in written["machine"]
    assert "| ort-fused |" in (tmp_path / "out" / cpu_peers.OUT_NAME).with_suffix(".md").read_text()


def test_calibration_on_the_timed_documents_is_refused(model: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="calibration paragraphs are dev documents"):
        cli(model, tmp_path, TEXTS[:2], cpu_peers.OPENVINO_INT8)
    assert not (tmp_path / "out").exists()
