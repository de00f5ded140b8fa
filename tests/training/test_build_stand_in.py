"""``python -m training build --stand-in-for`` (``make serve``): a quick frozen retrofit serves under the
product's name while the two-path model trains, and the product's own build swaps it in, in the same
directory, which a running service hot-reloads. Real builds of tiny recipes (a tiny sentence-transformers
model, SQuAD-layout paragraphs): fit, export, quality curve."""

from __future__ import annotations

from pathlib import Path

import pytest

from retention_core.contract import Manifest
from tests.service.conftest import running, settings_for, wait_until
from tests.tasks.test_embedding import write_sentence_transformer
from tests.tiny import write_squad_paragraphs
from training.__main__ import built_from
from training.__main__ import main as training_main

PRODUCT = "tiny-embed"
STEPS = 2
RELOAD_INTERVAL_S = 0.1
RELOAD_TIMEOUT_S = 60.0


def write_recipes(tmp_path: Path) -> tuple[Path, Path]:
    """(the frozen retrofit's recipe, the two-path product's, which extends it) for a tiny model."""
    backbone = write_sentence_transformer(tmp_path / "st-model")
    data = write_squad_paragraphs(tmp_path / "data")
    sizes = f"batch_size: 2\nsteps: {STEPS}\nevaluation: {{validation_size: 4, rhos: [0.5, 1.0]}}\n"
    frozen = tmp_path / "frozen.yaml"
    frozen.write_text(
        f"name: {PRODUCT}-frozen\ntask: embedding\nbackbone: {backbone}\n"
        f"dataset: {{name: squad_contexts, root: {data}}}\nmax_length: 32\n{sizes}"
        "retrofit: {pooling: mean, normalize: true}\nprofiles:\n  quick: {steps: 2}\n",
        encoding="utf-8",
    )
    product = tmp_path / "product.yaml"
    product.write_text(
        f"extends: frozen.yaml\nname: {PRODUCT}\nretrofit: {{pooling: mean, normalize: true, "
        "pruned_branch: copy}\nobjective: {pruned_loss_weight: 1.0, sandwich_random_budgets: 2}\n"
        "profiles:\n  quick: {steps: 2}\n",
        encoding="utf-8",
    )
    return frozen, product


def build(recipe: Path, tmp_path: Path, *options: str) -> None:
    dirs = ["--models-dir", str(tmp_path / "models"), "--runs-dir", str(tmp_path / "runs")]
    training_main(["build", str(recipe), "--profile", "quick", *dirs, *options])


def test_a_stand_in_serves_until_the_products_own_build_swaps_it_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frozen, product = write_recipes(tmp_path)
    served = tmp_path / "models" / PRODUCT
    build(frozen, tmp_path, "--stand-in-for", PRODUCT)
    stand_in = Manifest.read(served)
    assert (stand_in.name, stand_in.pruned_branch) == (PRODUCT, None)  # served as the product
    assert built_from(served) == f"{PRODUCT}-frozen"  # and says what it is
    assert (tmp_path / "runs" / f"{PRODUCT}-frozen-quick").is_dir()  # its run is its own recipe's

    with running(settings_for(tmp_path / "models", reload_interval_s=RELOAD_INTERVAL_S)) as (_, client):
        assert client.get(f"/models/{PRODUCT}").json()["summary"]["pruned_branch_bytes"] is None
        build(product, tmp_path)  # the background build of make serve: the two-path model lands
        assert "replacing the stand-in" in capsys.readouterr().out
        wait_until(
            lambda: client.get(f"/models/{PRODUCT}").json()["summary"]["pruned_branch_bytes"] is not None,
            RELOAD_TIMEOUT_S,
            "the two-path model hot-reloaded in the stand-in's place",
        )
        assert client.post(f"/embed?model={PRODUCT}&rho=0.5", json={"text": "a river"}).status_code == 200
    swapped = Manifest.read(served)
    assert swapped.pruned_branch is not None and built_from(served) == PRODUCT

    # Either build again (the next make serve) leaves the product alone.
    build(frozen, tmp_path, "--stand-in-for", PRODUCT)
    build(product, tmp_path)
    assert capsys.readouterr().out.count(f"{PRODUCT}: present in {served}, skipping") == 2
    assert Manifest.read(served).pruned_branch is not None


def test_a_finished_run_of_another_recipe_version_is_not_exported(tmp_path: Path) -> None:
    """A run left by an earlier version of the recipe (e.g. the frozen product, before the two-path
    default) would export the wrong model under the product's name: build refuses it."""
    frozen, product = write_recipes(tmp_path)
    earlier = tmp_path / "runs" / f"{PRODUCT}-quick"  # the product's run dir, another recipe's run in it
    training_main(["fit", str(frozen), "--profile", "quick", "--run-dir", str(earlier)])
    with pytest.raises(SystemExit, match="not this version of recipe 'tiny-embed'"):
        build(product, tmp_path)
    assert not (tmp_path / "models" / PRODUCT).exists()
    with pytest.raises(SystemExit, match="one recipe"):
        training_main(["build", str(frozen), str(product), "--stand-in-for", PRODUCT])
