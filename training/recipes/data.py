"""Datasets: gzip JSON Lines from a local data root (default ``../shared/data``), else Hugging Face.
Each task package names its own in its ``training.py`` (``DATASETS``), collected in ``REGISTRY``.

Every split is a list of ``Example`` (a plain dict in the source's layout). Splits that the source
lacks are carved deterministically by hashing a stable field (documented per dataset) so every run and
every machine sees the same rows.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from retention_core.tasks import TaskRegistry
from training.recipes.recipe import DatasetSpec

Example = dict[str, object]  # one dataset row as the source has it (not a codec ``Row``)
HOLDOUT_BUCKETS = 20  # 1 in 20 training rows (5%) becomes the validation split where none exists


@dataclass(frozen=True)
class SplitSource:
    file: str  # path under the data root
    hf_name: tuple[str, ...]  # datasets.load_dataset(*hf_name)
    hf_split: str
    keep: Callable[[Example], bool] | None = None  # deterministic filter (carved splits)
    reshape: Callable[[list[Example]], list[Example]] | None = None  # after ``keep``: e.g. unique texts


def sha1_bucket(text: str, buckets: int) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % buckets


def _bucket(row: Example, key: str) -> int:
    return sha1_bucket(str(row[key]), HOLDOUT_BUCKETS)


def holdout(key: str) -> Callable[[Example], bool]:
    return lambda row: _bucket(row, key) == 0


def not_holdout(key: str) -> Callable[[Example], bool]:
    return lambda row: _bucket(row, key) != 0


def unique_texts(field: str) -> Callable[[list[Example]], list[Example]]:
    """Rows → ``{"text": row[field]}``, each distinct text once, in file order (label-free tasks)."""

    def reshape(rows: list[Example]) -> list[Example]:
        texts = dict.fromkeys(str(row[field]) for row in rows)
        return [{"text": text} for text in texts]

    return reshape


Sources = dict[str, SplitSource]  # split ("train", "validation", "test") → where its rows come from


def local_splits(folder: str, dataset: str, splits: tuple[str, ...] = ("validation", "test")) -> Sources:
    """A dataset of local files only, one per split: ``folder/<split>.jsonl.gz`` under the data root (a
    test task's rows, written by the test)."""
    return {split: SplitSource(f"{folder}/{split}.jsonl.gz", (dataset,), split) for split in splits}


def dataset_entries(module: ModuleType) -> list[tuple[str, Sources]]:
    """A task package's ``training.py``: its ``DATASETS`` (dataset name → its splits), none if it names
    none (its recipes read a local text file)."""
    datasets: dict[str, Sources] = getattr(module, "DATASETS", {})
    return list(datasets.items())


# dataset name → its splits, from every task package on the list (retention_core.tasks.task_packages)
REGISTRY: TaskRegistry[Sources] = TaskRegistry("training", dataset_entries)


DATA_ROOT_VARIABLE = "RETENTION_DATA_ROOT"


def default_data_root() -> Path | None:
    """``$RETENTION_DATA_ROOT`` when set, else ``../shared/data`` next to the repository (or the working
    directory), when present."""
    if os.environ.get(DATA_ROOT_VARIABLE):
        return Path(os.environ[DATA_ROOT_VARIABLE])
    repo_root = Path(__file__).resolve().parents[1]
    for candidate in (repo_root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return None


def read_jsonl_gz(path: Path) -> list[Example]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_texts(path: Path, field: str) -> list[str]:
    """Texts of a local file: JSON Lines (``.jsonl`` or ``.jsonl.gz``, the text in ``field``) or plain
    text (any other suffix, one text a line). Blank texts are skipped."""
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        rows = read_jsonl_gz(path) if path.suffix == ".gz" else _read_jsonl(path)
        missing = [i for i, row in enumerate(rows) if field not in row]
        if missing:
            raise ValueError(f"{path}: row {missing[0] + 1} has no field {field!r}")
        texts = [str(row[field]) for row in rows]
    else:
        texts = path.read_text(encoding="utf-8").splitlines()
    return [text for text in texts if text.strip()]


def _read_jsonl(path: Path) -> list[Example]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def text_file_split(path: Path, field: str, split: str) -> list[Example]:
    """The distinct texts of a local file as ``{"text": …}`` rows; validation (= test) is 1 in 20 by
    sha1(text), train the rest, so every run sees the same split."""
    if not path.is_file():
        raise FileNotFoundError(f"text file {path} does not exist")
    rows = unique_texts("text")([{"text": text} for text in read_texts(path, field)])
    keep = not_holdout("text") if split == "train" else holdout("text")
    return [row for row in rows if keep(row)]


def load_split(spec: DatasetSpec, split: str) -> list[Example]:
    """Examples of one split: a local text file (``spec.path``), or a registry dataset from the local
    data root if it has the file, else from Hugging Face."""
    if spec.path is not None:
        return text_file_split(Path(spec.path), spec.text_field, split)
    sources = REGISTRY.get(spec.name)
    if sources is None:
        raise ValueError(f"unknown dataset {spec.name!r}; known: {sorted(REGISTRY)}")
    if split not in sources:
        raise ValueError(f"dataset {spec.name!r} has no split {split!r}; has {sorted(sources)}")
    source = sources[split]
    root = Path(spec.root) if spec.root else default_data_root()
    if root is not None and (root / source.file).is_file():
        rows = read_jsonl_gz(root / source.file)
    else:
        rows = _load_from_hub(source)
    kept = [row for row in rows if source.keep(row)] if source.keep else rows
    return source.reshape(kept) if source.reshape else kept


def _load_from_hub(source: SplitSource) -> list[Example]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise FileNotFoundError(
            f"no local copy of {source.file} and the `datasets` package is not installed"
        ) from exc
    return [dict(row) for row in datasets.load_dataset(*source.hf_name, split=source.hf_split)]


# Evaluation subsets and the random-k baseline are drawn with this seed, not the recipe's training
# seed, so every seed and every training stage of a recipe is measured on the same examples.
EVAL_SEED = 0


def shuffled(rows: list[Example], seed: int, limit: int | None = None) -> list[Example]:
    """A seeded shuffle (IMDb files are sorted by label), optionally truncated."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    return order[:limit] if limit is not None else order
