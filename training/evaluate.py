"""Quality vs ρ for learned retention and the cheap baselines, at the same kept-token budget.

Methods (classification):
- ``learned``: the trained scorers, top-M per layer (what the ONNX graph does).
- ``random``: same per-layer counts, tokens chosen uniformly at random ([CLS] kept).
- ``attention``: same counts, tokens ranked by the attention they receive in the next layer
  (PoWER-BERT / H2O style).
- ``threshold`` (ablation): the trained scorers, but every token with an open gate is kept instead of
  the scheduled top-M, so the kept count follows the scores and the budget is not enforced.
- ``first_k``: plain truncation to the first round(ρ·n) tokens (same final budget).
- ``first_k_work`` / ``head_tail_work``: truncation to the length that costs the *same encoder
  token-work* as the learned schedule (more tokens than ρ·n, since the learned model reaches ρ only
  at the last layer); head+tail keeps ¼ head and ¾ tail (Sun et al. 2019).
All methods run on the same trained weights; truncation runs the model at ρ=1 on the cut input.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from training import retention as R
from training.data import Row
from training.model import RetentionModel, Selector, attention_selector, random_selector

SELECTION_METHODS = ("learned", "random", "attention", "threshold")
TRUNCATION_METHODS = ("first_k", "first_k_work", "head_tail_work")
ALL_METHODS = SELECTION_METHODS + TRUNCATION_METHODS
DEFAULT_METHODS = tuple(m for m in ALL_METHODS if m != "threshold")  # threshold is an ablation
HEAD_SHARE = 0.25  # head+tail truncation: a quarter from the start, the rest from the end
RANDOM_SEED = 0


@dataclass
class MethodResult:
    method: str
    rho: float
    accuracy: float
    token_work: float  # mean fraction of dense encoder token-work
    num_examples: int
    seconds: float


def tokenize_rows(rows: list[Row], tokenizer, max_length: int) -> list[list[int]]:
    encoded = tokenizer([str(row["text"]) for row in rows], truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence: → input_ids (B, T), attention_mask (B, T)."""
    length = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return ids, mask


def truncated_lengths(
    num_real: torch.Tensor, rho: float, model: RetentionModel, equal_work: bool
) -> torch.Tensor:
    """Kept length per example for truncation baselines. (B,) → (B,) int64."""
    rhos = torch.full(num_real.shape, rho)
    counts = R.keep_counts(
        rhos, num_real, torch.ones_like(num_real), model.num_points, model.config.schedule_power
    )
    if not equal_work:
        return counts[:, -1]
    # Learned work = Σ_{p<P-1} counts_p + last layer; truncation at k costs (P-1)·k + the same last layer.
    return torch.clamp(torch.round(counts[:, :-1].float().mean(1)).long(), min=2)


def truncate(ids: Sequence[int], keep: int, head_share: float | None) -> list[int]:
    """Cut [CLS] … [SEP] to ``keep`` tokens, special tokens kept. head_share=None keeps the head only."""
    if keep >= len(ids):
        return list(ids)
    body, budget = list(ids[1:-1]), max(keep - 2, 0)
    if head_share is None:
        kept = body[:budget]
    else:
        head = int(budget * head_share)
        kept = body[:head] + (body[len(body) - (budget - head) :] if budget > head else [])
    return [ids[0], *kept, ids[-1]]


def _selector(method: str) -> Selector | None:
    if method in ("learned", "threshold"):
        return None
    if method == "random":
        return random_selector(torch.Generator().manual_seed(RANDOM_SEED))
    return attention_selector()


@torch.inference_mode()
def evaluate_method(
    model: RetentionModel,
    sequences: list[list[int]],
    labels: list[int],
    method: str,
    rho: float,
    batch_size: int,
    pad_id: int,
) -> MethodResult:
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # length-sorted batches
    device = next(model.parameters()).device
    correct, work, started = 0, 0.0, time.perf_counter()
    selector = _selector(method) if method in SELECTION_METHODS else None
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = [sequences[i] for i in chunk]
        num_real = torch.tensor([len(seq) for seq in batch])
        if method in TRUNCATION_METHODS:
            keep = truncated_lengths(num_real, rho, model, equal_work=method != "first_k")
            share = HEAD_SHARE if method == "head_tail_work" else None
            batch = [truncate(seq, int(k), share) for seq, k in zip(batch, keep.tolist(), strict=True)]
            batch_rho = torch.ones(len(batch))
        else:
            batch_rho = torch.full((len(batch),), rho)
        ids, mask = pad_batch(batch, pad_id)
        out = model.forward_pruned(
            ids.to(device),
            mask.to(device),
            batch_rho.to(device),
            selector=selector,
            threshold=method == "threshold",
        )
        predictions = out.logits.argmax(-1).tolist()
        correct += sum(int(p == labels[i]) for p, i in zip(predictions, chunk, strict=True))
        work += R.encoder_token_work(out.kept_counts.cpu(), num_real, model.last_layer_queries).sum().item()
    return MethodResult(
        method, rho, correct / len(order), work / len(order), len(order), time.perf_counter() - started
    )


def evaluate_classification(
    model: RetentionModel,
    tokenizer,
    rows: list[Row],
    rhos: Sequence[float],
    methods: Sequence[str],
    max_length: int,
    batch_size: int,
    progress: bool = True,
) -> list[MethodResult]:
    model = model.eval()
    sequences = tokenize_rows(rows, tokenizer, max_length)
    labels = [int(row["label"]) for row in rows]  # type: ignore[call-overload]
    results = []
    grid = [(m, r) for m in methods for r in rhos]
    for method, rho in tqdm(grid, desc="evaluate", disable=not progress):
        if method in TRUNCATION_METHODS and rho >= 1.0:
            continue  # identical to learned at ρ=1 (the dense model)
        results.append(
            evaluate_method(model, sequences, labels, method, rho, batch_size, tokenizer.pad_token_id)
        )
    return results


def markdown_table(results: list[MethodResult], metric: str = "accuracy") -> str:
    rhos = sorted({r.rho for r in results})
    methods = list(dict.fromkeys(r.method for r in results))
    lookup = {(r.method, r.rho): r for r in results}
    header = "| method | " + " | ".join(f"ρ={rho:g}" for rho in rhos) + " |"
    lines = [header, "|" + "---|" * (len(rhos) + 1)]
    for method in methods:
        cells = []
        for rho in rhos:
            result = lookup.get((method, rho))
            cells.append(f"{100 * result.accuracy:.2f} ({result.token_work:.2f})" if result else "—")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nCells: {metric} % (fraction of dense encoder token-work done).\n"


def merge_results(previous: Path, results: list[MethodResult]) -> list[MethodResult]:
    """Results of an earlier run (eval.json) plus the new ones; a new (method, ρ) replaces the old."""
    payload = json.loads(previous.read_text(encoding="utf-8"))
    merged = {(r["method"], r["rho"]): MethodResult(**r) for r in payload["results"]}
    merged.update({(r.method, r.rho): r for r in results})
    return list(merged.values())


def write_results(results: list[MethodResult], out_dir: Path, meta: dict[str, object]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "results": [asdict(r) for r in results]}
    (out_dir / "eval.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    title = f"# {meta.get('model')} — {meta.get('split')} ({meta.get('num_examples')} examples)\n\n"
    (out_dir / "eval.md").write_text(title + markdown_table(results), encoding="utf-8")


def onnx_accuracy_curve(
    onnx_path: Path,
    tokenizer,
    rows: list[Row],
    rhos: Sequence[float],
    max_length: int,
    batch_size: int,
) -> list[tuple[float, float]]:
    """Accuracy of the exported graph itself (onnxruntime) at each ρ: what the manifest reports."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    sequences = tokenize_rows(rows, tokenizer, max_length)
    labels = np.array([int(row["label"]) for row in rows])  # type: ignore[call-overload]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    curve = []
    for rho in rhos:
        predictions = np.zeros(len(rows), dtype=np.int64)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = pad_batch([sequences[i] for i in chunk], tokenizer.pad_token_id)
            feeds = {
                "input_ids": ids.numpy(),
                "attention_mask": mask.numpy(),
                "rho": np.full(len(chunk), rho, dtype=np.float32),
            }
            logits = session.run(["logits"], feeds)[0]
            predictions[chunk] = logits.argmax(-1)
        curve.append((rho, float((predictions == labels).mean())))
    return curve
