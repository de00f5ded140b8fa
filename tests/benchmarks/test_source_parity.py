"""``python -m experiments.source_parity --quick``: ρ = 1 of our model (torch and the exported graph) is
sentence-transformers' encoding of the same tiny random checkpoint, for each supported family's
shape (BERT; MPNet with its relative-position bias)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.source_parity import PARITY_FLOOR, main


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_rho_one_is_sentence_transformers(tmp_path: Path, family: str) -> None:
    out = tmp_path / "parity.json"
    main(["--quick", "--family", family, "--texts", "24", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["family"] == family and payload["texts"] == 24
    for runtime in ("torch", "onnxruntime"):
        assert payload["runtimes"][runtime]["min_cosine"] >= PARITY_FLOOR
    assert payload["met"] is True and payload["machine"]
