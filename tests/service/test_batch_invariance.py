"""Under concurrent load, ``/v1/embeddings`` returns the vector a text gets alone (issue 64): the server
batches requests from many clients at many budgets into shared runs, and each text's vector is the same
bits as when it was the only request — fp32 and int8, the two-path model (ρ < 1 on the copy) and the
one-path original, through a real uvicorn server and the real ``openai`` client."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.service.conftest import served, settings_for
from tests.training.test_two_path_export import exported

RHOS = (1.0, 0.7, 0.5, 0.3)
SENTENCE = "the river bank holds water while the bank downtown holds money and both hold their names"
WORDS = SENTENCE.split(" ")
TEXTS = [" ".join(WORDS[: 3 + (7 * i) % len(WORDS)] * (1 + i % 3)) for i in range(16)]
CLIENTS, ROUNDS = 8, 3
BATCH_WAIT_MS = 30.0  # long enough that concurrent requests share runs on a busy machine


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny two-path embedding export and its frozen original, side by side, both with int8."""
    _, two_path, original = exported(tmp_path_factory.mktemp("invariance"), "embedding")
    shutil.copytree(original, two_path.parent / "original")
    return two_path.parent


@pytest.fixture(scope="module", params=["fp32", "int8"])
def url(request: pytest.FixtureRequest, models_root: Path) -> Iterator[str]:
    settings = settings_for(models_root, precision=request.param, max_batch_wait_ms=BATCH_WAIT_MS)
    with served(settings) as base:
        yield base


def embedding(client: openai.OpenAI, model: str, text: str, rho: float) -> list[float]:
    answer = client.embeddings.create(model=model, input=text, extra_body={"rho": rho})
    return list(answer.data[0].embedding)


def shared_runs(url: str) -> float:
    """How many runs of more than one row the server has made (its batch-size histogram)."""
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith("retention_batch_size_count"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("retention_batch_size_bucket") and 'le="1.0"' in line:
            count += float(line.rsplit(" ", 1)[1])
    return total - count


def test_concurrent_requests_get_the_vectors_their_texts_get_alone(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    models = [listed["name"] for listed in httpx.get(f"{url}/models", timeout=30).json()["models"]]
    assert len(models) == 2  # the two-path model and its original
    cases = [(model, text, RHOS[i % len(RHOS)]) for model in models for i, text in enumerate(TEXTS)]
    alone = {case: embedding(client, *case) for case in cases}  # one request at a time
    before = shared_runs(url)
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(ROUNDS):
            loaded = dict(zip(cases, pool.map(lambda case: embedding(client, *case), cases), strict=True))
            for case in cases:
                assert loaded[case] == alone[case], f"{case}: another vector under load"
    assert shared_runs(url) > before, "no run held more than one row: the check did not batch"
