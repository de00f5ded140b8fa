"""The two-path export (issue 56): a model whose pruned branch has weights of its own is one ONNX graph
in which ρ = 1 runs the original's weights and operators only (its outputs are the original export's, bit
for bit), a batch at ρ < 1 runs the copy's pruned pass only, and a mixed batch runs both with each row
taking its own; the manifest and ``GET /models`` state what the copy costs; int8 quantizes both paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from safetensors.torch import load_file

from retention_core.contract import INT8_MODEL_FILE, MANIFEST_FILE, MODEL_FILE, WEIGHTS_FILE, Manifest
from retention_core.tasks import task_spec
from retention_torch.two_path import PRUNED_BRANCH_PREFIX
from service.backends.torch_backend import open_torch
from service.settings import Settings
from tests.service.conftest import running, settings_for
from tests.tiny import tiny_recipe
from tests.training.test_pruned_branch import PRODUCT, branched, perturb
from training.engine.model import RetentionModel
from training.export.install import export_model
from training.export.two_path import all_nodes, branch_of, branch_reads, copy_only_bytes

TASKS = ("embedding", "classification", "qa")  # a pooled, a sequence and a token head
FULL, HALF = 1.0, 0.5
TORCH_TOLERANCE = 1e-4  # the torch backend against the graph (training.export.graph.LOGIT_ATOL)
TORCH_CPU_BOUND = 1e-6  # a row in runs of other rows (tests/service/test_backend_batch_invariance.py)
MIXED_FP32_TOLERANCE = 1e-5  # a mixed batch's other graph: last-ulp differences (measured ≤ 2e-7)


def feeds(session: ort.InferenceSession, rhos: list[float], seed: int = 0) -> dict[str, np.ndarray]:
    """Ragged rows of random ids for every input the graph takes (token types and protected masks zero
    but for the QA question's first tokens)."""
    rng = np.random.default_rng(seed)
    batch, length = len(rhos), 16
    mask = np.ones((batch, length), np.int64)
    mask[1, 11:] = 0
    ids = rng.integers(5, 1000, (batch, length)).astype(np.int64) * mask
    values = {
        "input_ids": ids,
        "attention_mask": mask,
        "rho": np.array(rhos, np.float32),
        "token_type_ids": np.zeros_like(mask),
        "protected_mask": np.zeros_like(mask),
    }
    values["protected_mask"][:, :3] = 1
    return {graph_input.name: values[graph_input.name] for graph_input in session.get_inputs()}


def exported(tmp_path: Path, task: str) -> tuple[RetentionModel, Path, Path]:
    """(the two-path model, its directory, the frozen original's directory): both with int8."""
    original, model = branched(task)
    perturb(model)
    original_dir, two_path_dir = tmp_path / "original", tmp_path / "served" / "two-path"
    export_model(original, tiny_recipe(task), tokenizer_of(), original_dir, int8=True)
    export_model(model, tiny_recipe(task, name="two-path"), tokenizer_of(), two_path_dir, int8=True)
    return model, two_path_dir, original_dir


def assert_served_like_torch(
    model: RetentionModel, export_dir: Path, manifest: Manifest, batches: tuple[list[float], ...]
) -> ort.InferenceSession:
    """An embedding export's graph answers each batch of budgets as the torch model does, and the torch
    backend as the graph does; returns the graph's session."""
    session = ort.InferenceSession(str(export_dir / MODEL_FILE), providers=["CPUExecutionProvider"])
    backend = open_torch(export_dir, manifest, task_spec("embedding"), Settings())
    try:
        for rhos in batches:
            values = feeds(session, rhos)
            with torch.no_grad():
                expected = model.forward_pruned(
                    *(torch.from_numpy(values[name]) for name in ("input_ids", "attention_mask", "rho"))
                )
            graph = session.run(None, values)
            np.testing.assert_allclose(graph[0], expected.logits.numpy(), atol=1e-5)
            np.testing.assert_allclose(backend.run(values)[0], graph[0], atol=TORCH_TOLERANCE)
    finally:
        backend.close()
    return session


def tokenizer_of():
    from training.tiny import tiny_model

    return tiny_model("embedding")[1]


def outputs(directory: Path, file: str, rhos: list[float]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(directory / file), providers=["CPUExecutionProvider"])
    return session.run(None, feeds(session, rhos))


@pytest.mark.parametrize("task", TASKS)
def test_rho_1_is_the_original_export_and_rho_below_1_runs_the_copy(tmp_path: Path, task: str) -> None:
    _, two_path, original = exported(tmp_path, task)
    for file in (MODEL_FILE, INT8_MODEL_FILE):
        # ρ = 1: the original's graph, bit for bit, in fp32 and in int8
        for mine, theirs in zip(
            outputs(two_path, file, [FULL] * 3), outputs(original, file, [FULL] * 3), strict=True
        ):
            assert np.array_equal(mine, theirs), file
        # ρ < 1: the copy's weights (the outputs move), the same schedule (kept counts equal)
        mine_half, theirs_half = outputs(two_path, file, [HALF] * 3), outputs(original, file, [HALF] * 3)
        assert not np.allclose(mine_half[0], theirs_half[0], atol=1e-3), file
        assert np.array_equal(mine_half[1], theirs_half[1]), file
        # a mixed batch (the server never plans one: planner.plan_path_runs): each row its own path, the
        # same kept tokens as in a batch of its own kind; fp32 within a few ulps (the mixed pass is another
        # graph, whose kernels round differently). int8 rows are bit-exact within their own kind's batches
        # (tests/training/test_batch_invariance.py); across the branches a last-ulp fp32 difference can flip
        # an int8 rounding, so the mixed pass's int8 values are not compared.
        mixed = outputs(two_path, file, [FULL, HALF, HALF])
        dense = outputs(two_path, file, [FULL] * 3)
        assert np.array_equal(mixed[1][0], dense[1][0]) and np.array_equal(mixed[1][1:], mine_half[1][1:])
        if file == MODEL_FILE:
            np.testing.assert_allclose(mixed[0][0], dense[0][0], atol=MIXED_FP32_TOLERANCE)
            np.testing.assert_allclose(mixed[0][1:], mine_half[0][1:], atol=MIXED_FP32_TOLERANCE)


def test_the_graph_nests_both_paths_below_the_unpruned_choice_and_int8_quantizes_the_copy(
    tmp_path: Path,
) -> None:
    _, two_path, original = exported(tmp_path, "embedding")
    for file in (MODEL_FILE, INT8_MODEL_FILE):  # a one-path graph keeps every weight in its outer graph
        (choice,) = [node for node in onnx.load(str(original / file)).graph.node if node.op_type == "If"]
        assert not branch_of(choice, "else_branch").initializer
    for file, quantized in ((MODEL_FILE, False), (INT8_MODEL_FILE, True)):
        model = onnx.load(str(two_path / file))
        (outer,) = [node for node in model.graph.node if node.op_type == "If"]
        assert outer.name == "unpruned_if_every_rho_is_1"
        (inner,) = [node for node in branch_of(outer, "else_branch").node if node.op_type == "If"]
        assert inner.name == "both_paths_if_some_rho_is_1"
        copy_ops = {node.op_type for node in all_nodes(branch_of(inner, "else_branch"))}
        assert bool(copy_ops & {"MatMulInteger", "DynamicQuantizeMatMul"}) == quantized, copy_ops
        # the copy's pass alone reads none of the original encoder's weights (the perturbed copy shares
        # no weight with it; tensors equal by content are stored once: the tracer's scalars, int8's
        # all-zero zero points)
        reads = branch_reads(model)
        assert reads is not None
        weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        shared = [name for name in reads[0] & reads[1] if name in weights]
        assert all(weights[name].size <= 1 or not weights[name].any() for name in shared), shared
        # the weights only the ρ < 1 side reads live in its branch, one level above the copy's pass
        below = {init.name for init in branch_of(outer, "else_branch").initializer}
        assert below & reads[0] and not below & reads[1] and not below & set(weights)
        assert not {name for name in reads[0] - reads[1] if name in weights}  # none left outside


def test_manifest_and_models_state_what_the_copy_costs(tmp_path: Path) -> None:
    model, two_path, original = exported(tmp_path, "embedding")
    manifest = Manifest.read(two_path)
    assert model.pruned_backbone is not None
    assert manifest.pruned_branch is not None
    parameters = sum(param.numel() for param in model.pruned_backbone.parameters())
    assert manifest.pruned_branch.parameters == parameters
    fp32, int8 = manifest.pruned_branch.bytes["fp32"], manifest.pruned_branch.bytes["int8"]
    # every weight of the perturbed copy is its own; the traced graph holds them as fp32 initializers
    assert fp32 == parameters * 4
    assert 0 < int8 < fp32
    assert copy_only_bytes(onnx.load(str(original / MODEL_FILE))) == 0
    # a one-path manifest does not carry the field at all: its bytes are what they were before it existed
    assert "pruned_branch" not in json.loads((original / MANIFEST_FILE).read_text())
    # the torch backend's weights carry both paths: the copy's encoder under its own prefix
    assert manifest.torch_weights is not None and manifest.torch_weights.parity.kept_tokens_equal
    stored = load_file(str(two_path / WEIGHTS_FILE))
    copy_tensors = [name for name in stored if name.startswith(PRUNED_BRANCH_PREFIX)]
    assert sum(stored[name].numel() for name in copy_tensors) == parameters

    with running(settings_for(two_path.parent, precision="int8")) as (_, client):
        summary = client.get("/models").json()["models"][0]
        detail = client.get("/models/two-path").json()["manifest"]
        vector = client.post("/v1/embeddings", json={"input": ["a plain sentence"], "rho": 0.5})
    assert summary["pruned_branch_bytes"] == int8
    assert detail["pruned_branch"] == {"parameters": parameters, "bytes": {"fp32": fp32, "int8": int8}}
    assert vector.status_code == 200, vector.text


@pytest.mark.parametrize("task", TASKS)
def test_the_torch_backend_runs_each_row_on_its_own_path(tmp_path: Path, task: str) -> None:
    """ρ = 1 rows on the original's weights (the original export's torch outputs, bit for bit), ρ < 1 rows
    on the copy's (the two-path graph's outputs), a mixed run each row its own."""
    _, two_path, original = exported(tmp_path, task)
    backends = {
        directory: open_torch(directory, Manifest.read(directory), task_spec(task), Settings())
        for directory in (two_path, original)
    }
    try:
        session = ort.InferenceSession(str(two_path / MODEL_FILE), providers=["CPUExecutionProvider"])
        for rhos in ([FULL] * 3, [HALF] * 3, [FULL, HALF, HALF]):
            values = feeds(session, rhos)
            mine, theirs = backends[two_path].run(values), backends[original].run(values)
            graph = session.run(None, values)
            for row, rho in enumerate(rhos):
                if rho >= FULL and len(set(rhos)) == 1:
                    assert np.array_equal(mine[0][row], theirs[0][row])
                elif rho >= FULL:  # split off the mixed run: a run of other rows (torch's CPU GEMMs)
                    np.testing.assert_allclose(mine[0][row], theirs[0][row], rtol=0, atol=TORCH_CPU_BOUND)
                else:
                    assert not np.allclose(mine[0][row], theirs[0][row], atol=1e-3)
                np.testing.assert_allclose(mine[0][row], graph[0][row], atol=TORCH_TOLERANCE)
                assert np.array_equal(mine[1][row], graph[1][row])
    finally:
        for backend in backends.values():
            backend.close()


def test_the_tiny_models_agree_with_torch_in_every_branch(tmp_path: Path) -> None:
    """The export's own validation ran (uniform and mixed ρ); here the served fp32 graph against the
    torch model directly, per branch."""
    model, two_path, _ = exported(tmp_path, "embedding")
    session = ort.InferenceSession(str(two_path / MODEL_FILE), providers=["CPUExecutionProvider"])
    for rhos in ([FULL] * 3, [HALF] * 3, [FULL, 0.3, HALF]):
        values = feeds(session, rhos)
        with torch.no_grad():
            expected = model.forward_pruned(
                torch.from_numpy(values["input_ids"]),
                torch.from_numpy(values["attention_mask"]),
                torch.from_numpy(values["rho"]),
            )
        got = session.run(None, values)
        np.testing.assert_allclose(got[0], expected.logits.numpy(), atol=1e-5)
        assert np.array_equal(got[1], expected.kept_counts.numpy())


def test_a_copy_that_keeps_the_original_embeddings_stores_them_once(tmp_path: Path) -> None:
    """``copy_embeddings: original``: the copy's embedding tables stay the original's (frozen in
    training), so the graph holds them once, the manifest counts only the copy's own parameters and
    ``weights.safetensors`` leaves them out of the copy's prefix; the torch backend reads the original's
    in their place and still agrees with the graph on both paths (the export's parity check ran)."""
    original, model = branched("embedding")
    assert model.pruned_backbone is not None
    frozen_tables = {"embeddings." + name for name, _ in model.pruned_backbone.embeddings.named_parameters()}
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():  # train everything of the copy but its embeddings
        for name, param in model.pruned_backbone.named_parameters():
            if name not in frozen_tables:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    own_dir, shared_dir = tmp_path / "own" / "own", tmp_path / "shared" / "shared"
    _, perturbed_all = branched("embedding")
    perturb(perturbed_all)
    export_model(perturbed_all, tiny_recipe("embedding", name="own"), tokenizer_of(), own_dir, int8=True)
    export_model(model, tiny_recipe("embedding", name="shared"), tokenizer_of(), shared_dir, int8=True)

    manifest = Manifest.read(shared_dir)
    assert manifest.pruned_branch is not None and manifest.torch_weights is not None
    copy = dict(model.pruned_backbone.named_parameters())
    own_parameters = sum(param.numel() for name, param in copy.items() if name not in frozen_tables)
    table_parameters = sum(copy[name].numel() for name in frozen_tables)
    assert manifest.pruned_branch.parameters == own_parameters
    assert manifest.pruned_branch.bytes["fp32"] == own_parameters * 4
    own_manifest = Manifest.read(own_dir)
    assert own_manifest.pruned_branch is not None
    assert own_manifest.pruned_branch.parameters == own_parameters + table_parameters
    # the ONNX file is smaller by the tables' bytes, the torch weights too
    saved = (own_dir / MODEL_FILE).stat().st_size - (shared_dir / MODEL_FILE).stat().st_size
    assert abs(saved - table_parameters * 4) < 4096
    stored = load_file(str(shared_dir / WEIGHTS_FILE))
    assert not [name for name in stored if name.startswith(PRUNED_BRANCH_PREFIX + "embeddings.")]
    assert manifest.torch_weights.parity.kept_tokens_equal

    # served: ρ = 1 is the original export's vector, ρ < 1 the copy's, on both backends
    session = assert_served_like_torch(model, shared_dir, manifest, ([FULL] * 3, [HALF] * 3))
    dense = original.forward_unpruned(
        *(torch.from_numpy(feeds(session, [FULL] * 3)[name]) for name in ("input_ids", "attention_mask"))
    )
    np.testing.assert_allclose(
        session.run(None, feeds(session, [FULL] * 3))[0], dense.logits.detach().numpy(), atol=1e-5
    )


def test_an_mpnet_copy_on_the_original_embeddings_exports_and_serves_both_paths(tmp_path: Path) -> None:
    """The retrofit's default for any sentence-transformers model (the copy on the original's embedding
    tables) on the other encoder family: MPNet (relative-position bias, padding-aware positions). The
    manifest counts the copy's layers only, and the graph and the torch backend agree with the torch model
    on ρ = 1, ρ < 1 and mixed batches."""
    from training.tiny import tiny_model

    model, tokenizer = tiny_model("embedding", seed=3, config=PRODUCT, family="mpnet")
    model.freeze_backbone()
    copy = model.add_pruned_branch(own_embeddings=False)
    model.eval()
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():  # train the layers, as the retrofit does; the tables stay the original's
        for param in copy.layers.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    out = tmp_path / "mpnet" / "mpnet"
    export_model(model, tiny_recipe("embedding", name="mpnet"), tokenizer, out, int8=True)
    manifest = Manifest.read(out)
    assert manifest.pruned_branch is not None
    changed = sum(
        param.numel()
        for name, param in copy.named_parameters()
        if not torch.equal(param, model.backbone.state_dict()[name])
    )
    assert manifest.pruned_branch.parameters == changed == sum(p.numel() for p in copy.layers.parameters())
    assert_served_like_torch(model, out, manifest, ([FULL] * 3, [HALF] * 3, [FULL, HALF, HALF]))
