"""Turn the committed raw JSON under ``results/`` into ``docs/benchmarks.md`` and PNG plots: only numbers
from those files, each table naming its JSON; the reference run of each task first, then every other run
a committed recipe reproduces (``results/experiments/`` is written up in ``docs/experiments/`` instead).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness import figure, label_axes, markdown_table
from retention_core.machine import recorded_cpu_class

if TYPE_CHECKING:
    from training.tasks.registry import TaskEvaluation

RESULTS = Path("results")
DOCS = Path("docs")
# A study that moved from benchmarks/ to experiments/ after its committed results recorded a command.
MOVED_STUDIES = ("retrofit_comparison",)
MOVED = {f"benchmarks.{name}": f"experiments.{name}" for name in MOVED_STUDIES}
# The long-document study's command was ``benchmarks.retrieval … --long-context`` before it had its own.
LONG_CONTEXT_MOVED = {"benchmarks.retrieval ": "experiments.retrieval_long ", " --long-context": ""}


def _moved(text: str, moved: dict[str, str] = MOVED) -> str:
    """``text`` with the commands of moved studies naming the module (and options) as they are now."""
    for old, new in moved.items():
        text = text.replace(old, new)
    return text


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _machine_line(payload: dict[str, Any]) -> str:
    """The machine a figure was measured on; beside the CPU's name its class (the instruction sets that
    decide int8 and bf16 speed), "unrecorded" for results measured before machine records held it."""
    machine = payload.get("machine") or payload.get("meta", {}).get("machine", {})
    if "cpu" in machine:
        machine = {**machine, "cpu class": recorded_cpu_class(machine)}
    keys = ("cpu", "cpu class", "cores", "onnxruntime", "torch", "commit")
    return ", ".join(f"{k}: {machine[k]}" for k in keys if k in machine)


def speed_section(payload: dict[str, Any], source: Path) -> list[str]:
    from benchmarks.encoder_speed import markdown

    return [
        "## Encoder speed (ONNX Runtime, CPU)",
        "",
        f"Source: `{source}` — {_machine_line(payload)}.",
        f"Command: `{payload.get('command', '')}` ({payload.get('wall_seconds', '?')} s).",
        "",
        "Speed-up = median over repeats of (dense time / variant time) measured in the same round;",
        "min–max is the spread of those paired ratios.",
        "",
        markdown(payload),
    ]


def memory_section(payload: dict[str, Any], source: Path) -> list[str]:
    from benchmarks.memory import markdown

    return [
        "## Peak memory",
        "",
        f"Source: `{source}` — {_machine_line(payload)}; batch {payload['batch']} × "
        f"{payload['seq_len']} tokens, CPU arena {'on' if payload['arena'] else 'off'}.",
        "",
        markdown(payload),
    ]


# The run each task's reported numbers come from (README, docs/tasks.md), in page order.
REFERENCE_RUNS = {
    "IMDb": "imdb-minilm-full",
    "SST-2": "sst2-minilm-full",
    "SciTLDR-A": "scitldr-minilm-distill-full",
    "BBC News": "bbc-minilm-full",
    "SQuAD v1.1": "squad-minilm-calibrated",
}
ABLATION_VARIANTS = {
    "sst2-minilm-quick": "Hard-Concrete + dual ascent (the method)",
    "sst2-minilm-sigmoid-gates-quick": "no Hard-Concrete (sigmoid gates)",
    "sst2-minilm-fixed-lambda-quick": "fixed λ = 0.01 (no dual ascent)",
}


def task_evaluation(payload: dict[str, Any]) -> TaskEvaluation:
    """How the task of an eval.json is evaluated (its table, metrics, headline), from the training
    registry: a task registered anywhere, a test included, gets its section with no table here. An
    eval.json written before reports named their task is classification's."""
    from training.tasks.registry import training_task

    return training_task(payload.get("task", "classification")).evaluation


def quality_section(payload: dict[str, Any], source: Path, title: str = "Quality vs ρ") -> list[str]:
    from training.evaluation.reporting import paired_table

    meta = payload["meta"]
    table = task_evaluation(payload).table(payload) + paired_table(payload)
    return [
        # The directory names the result: a run made under an earlier recipe keeps its own name.
        f"### {title} — {source.parent.name} ({meta['model']}, {meta['profile']} recipe), {meta['split']}",
        "",
        f"Source: `{source}`; {meta['num_examples']} examples ({meta.get('subset', '')}). "
        f"Command: `{meta.get('command', '')}`.",
        "",
        table,
    ]


def quality_points(payload: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """method → sorted (ρ, headline metric in %) for any task's eval.json (the headline: its task's,
    from the registry)."""
    metric = task_evaluation(payload).headline
    results = payload["results"]
    if isinstance(results, dict):  # the codec loop's {method: {ρ: cell}}, metrics in percent
        return {
            method: sorted((float(rho), values[metric]) for rho, values in by_rho.items())
            for method, by_rho in results.items()
        }
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in results:  # classification's list of cells, metrics in 0-1
        curves.setdefault(r["method"], []).append((r["rho"], 100 * r[metric]))
    return {method: sorted(points) for method, points in curves.items()}


def ablation_section(results_dir: Path) -> list[str]:
    """Learned retention of each SST-2 training variant, plus threshold pruning, side by side."""
    rows: list[tuple[str, dict[float, tuple[float, float]]]] = []
    for run, label in ABLATION_VARIANTS.items():
        payload = _load(results_dir / run / "eval.json")
        if payload is None:
            continue
        for method, name in (("learned", label), ("threshold", "threshold pruning (no top-M budget)")):
            cells = {
                r["rho"]: (r["accuracy"], r["token_work"])
                for r in payload["results"]
                if r["method"] == method
            }
            if cells:
                rows.append((name, cells))
    if len(rows) < 2:
        return []
    rhos = sorted({rho for _, cells in rows for rho in cells})
    table = [
        (name, *(f"{100 * cells[r][0]:.2f} ({cells[r][1]:.2f})" if r in cells else "—" for r in rhos))
        for name, cells in rows
    ]
    return [
        "### SST-2 ablations (validation, 600 training steps each)",
        "",
        "Sources: `results/sst2-minilm*-quick/eval.json`. Cells: accuracy % (fraction of dense token-work).",
        "",
        *markdown_table(("variant", *(f"ρ={rho:g}" for rho in rhos)), table),
        "",
    ]


def plot_quality(payload: dict[str, Any], path: Path) -> None:
    with figure(path, figsize=(6, 4)) as ax:
        for method, points in quality_points(payload).items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        ax.set_title(f"{payload['meta']['model']} — {payload['meta']['split']}")
        metric = task_evaluation(payload).headline
        label_axes(ax, "ρ (fraction of real tokens kept at the last layer)", f"{metric} (%)", legend_size=8)


def plot_speed(payload: dict[str, Any], path: Path) -> None:
    results = payload["results"]
    cells = sorted({(r["seq_len"], r["batch"]) for r in results})
    longest = cells[-1][0]
    fp32_longest = [r for r in results if r["rho"] and r["seq_len"] == longest and r["precision"] == "fp32"]
    theory = sorted({(r["rho"], r["theoretical_flop_ratio"]) for r in fp32_longest})
    with figure(path, figsize=(6, 4)) as ax:
        for seq_len, batch in cells:
            rows = [r for r in results if (r["seq_len"], r["batch"]) == (seq_len, batch) and r["rho"]]
            for precision in ("fp32", "int8"):
                chosen = sorted(
                    (r["rho"], r["speedup_vs_dense"]) for r in rows if r["precision"] == precision
                )
                if chosen:
                    name = f"measured {precision}, {seq_len} tok, batch {batch}"
                    ax.plot([c[0] for c in chosen], [c[1] for c in chosen], marker="o", label=name)
        name = f"theoretical FLOP ratio ({longest} tok)"
        ax.plot([t[0] for t in theory], [t[1] for t in theory], "k--", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        label_axes(ax, "ρ", "speed-up over dense ONNX fp32", legend_size=7)


def plot_memory(payload: dict[str, Any], path: Path) -> None:
    results = payload["results"]
    names = [r["variant"] if r["rho"] is None else f"ρ={r['rho']:g}" for r in results]
    with figure(path, figsize=(6, 4)) as ax:
        ax.bar(names, [r["peak_bytes"] / 2**20 for r in results], label="peak RSS")
        ax.bar(names, [r["activation_bytes"] / 2**20 for r in results], label="activation (peak − before)")
        ax.set_ylabel("MiB")
        ax.set_title(f"peak memory, batch {payload['batch']} × {payload['seq_len']} tokens")
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.legend(fontsize=8)


def plot_load(payload: dict[str, Any], path: Path) -> None:
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in payload["results"]:
        name = "FastAPI + transformers" if r["target"] == "baseline" else f"service ρ={r['rho']}"
        series.setdefault(name, []).append((r["concurrency"], r["throughput_rps"], r["p99_ms"]))
    with figure(path, 1, 2, figsize=(10, 4)) as (left, right):
        for name, points in series.items():
            points.sort()
            left.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
            right.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=name)
        for ax, label in ((left, "throughput (req/s)"), (right, "p99 latency (ms)")):
            ax.set_xscale("log", base=2)
            label_axes(ax, "concurrent clients", label, legend_size=7 if ax is left else None)


def plot_budget(log_path: Path, path: Path) -> None:
    """Training log: expected kept fraction vs the batch's target ρ, and λ of every pruning point
    (two-sided budgets take negative λ, so the largest one alone would hide them)."""
    entries = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line]
    steps = [e["step"] for e in entries]
    with figure(path, 2, 1, figsize=(6, 5), sharex=True) as (top, bottom):
        top.plot(steps, [e["target_fraction"] for e in entries], label="target ρ (batch mean)")
        top.plot(steps, [e["kept_fraction"] for e in entries], label="expected kept fraction")
        label_axes(top, None, "fraction of real tokens", legend_size=8)
        for point in range(len(entries[0]["lam"])):
            bottom.plot(steps, [e["lam"][point] for e in entries], label=f"λ point {point}")
        bottom.axhline(0.0, color="black", linewidth=0.5)
        bottom.legend(fontsize=7, ncol=3)
        label_axes(bottom, "step", "λ per pruning point", legend_size=None)


def load_section(load_md: Path, plots: Path) -> list[str]:
    """One load run (``scripts/load_benchmark.sh``): its markdown table, model, command and plot."""
    payload, plot = _load(load_md.with_suffix(".json")) or {}, None
    if payload.get("results"):
        plot = f"latency_vs_{load_md.stem}.png"
        plot_load(payload, plots / plot)
    command = payload.get("command", "scripts/load_benchmark.sh")
    title = f"Service under load ({load_md.stem})"
    return markdown_section(load_md, title, plot, plots, command, "throughput and p99 vs load")


def run_section(eval_path: Path, plots: Path, title: str = "Quality vs ρ") -> list[str]:
    """One run: its quality table and plot, and its budget plot when the training log is committed."""
    payload = _load(eval_path)
    if payload is None or "meta" not in payload:
        return []
    lines = quality_section(payload, eval_path, title)
    plot_name = f"quality_{eval_path.parent.name}.png"
    plot_quality(payload, plots / plot_name)
    lines += [f"![quality vs ρ](plots/{plot_name})", ""]
    train_log = eval_path.parent / "train_log.jsonl"
    if train_log.is_file():
        budget_name = f"budget_{eval_path.parent.name}.png"
        plot_budget(train_log, plots / budget_name)
        image = f"![budget](plots/{budget_name})"
        lines += [f"Budget tracking during training (`{train_log}`):", "", image, ""]
    return lines


def reference_sections(results_dir: Path, plots: Path) -> list[str]:
    body = [
        line
        for task, run in REFERENCE_RUNS.items()
        for line in run_section(results_dir / run / "eval.json", plots, task)
    ]
    if not body:
        return []
    return [
        "## Reference runs",
        "",
        "The run behind each task's reported numbers (README, [tasks.md](tasks.md)): the full profile of its",
        "recipe in `models/recipes/` (SQuAD: the `calibrated` stage of `squad.yaml`; SciTLDR-A:",
        "`ablations/scitldr-distill.yaml`, `scitldr.yaml` under the name the run was made with).",
        "",
        *body,
    ]


# Benchmarks that write their own markdown table beside their JSON: (file stem, section title, plot).
MARKDOWN_BENCHMARKS = (
    ("embed_speed", "Embedding throughput vs the fused dense peer and sentence-transformers", None),
    ("cpu_service", "Embeddings service vs sentence-transformers behind FastAPI (CPU)", None),
    ("gpu_service", "Embeddings service vs sentence-transformers behind FastAPI (GPU)", None),
    ("overload", "rho=auto under overload (open-loop arrivals)", "overload.png"),
    ("overload_rounds", "rho=auto at 10x capacity, repeated rounds", None),
    ("overload_pinned", "rho=auto under overload, load generator on its own core", "overload_pinned.png"),
    ("overload_pinned_rounds", "rho=auto at 10x, load generator on its own core, repeated rounds", None),
    ("qa_default", "The QA model `make serve` builds, over HTTP", None),
)


def markdown_section(
    md_path: Path, title: str, plot: str | None, plots: Path, command: str | None = None, alt: str = ""
) -> list[str]:
    """A benchmark's own markdown table (its title line dropped) with its source, machine, ``command``
    when given, and plot (``alt``: its text, default the title)."""
    body = _moved(md_path.read_text(encoding="utf-8").split("\n", 1)[1])
    payload = _load(md_path.with_suffix(".json")) or {}
    source = f"Source: `{md_path.with_suffix('.json')}`"
    if payload.get("machine"):
        source += f" — {_machine_line(payload)}"
    source += "." if command is None else f". Command: `{command}`."
    lines = [f"## {title}", "", source, body, ""]
    if plot is not None and (plots / plot).is_file():
        lines += [f"![{alt or title}](plots/{plot})", ""]
    return lines


def system_sections(results_dir: Path, plots: Path) -> list[str]:
    """Encoder speed, peak memory and the service under load."""
    lines: list[str] = []
    speed_path = results_dir / "bench" / "encoder_speed.json"
    if (speed := _load(speed_path)) is not None:
        lines += speed_section(speed, speed_path)
        plot_speed(speed, plots / "speedup_vs_rho.png")
        lines += ["![speed-up vs ρ](plots/speedup_vs_rho.png)", ""]
    memory_path = results_dir / "bench" / "memory.json"
    if (memory := _load(memory_path)) is not None:
        lines += memory_section(memory, memory_path)
        plot_memory(memory, plots / "memory_vs_rho.png")
        lines += ["![peak memory vs ρ](plots/memory_vs_rho.png)", ""]
    for load_md in sorted((results_dir / "bench").glob("load*.md")):
        lines += load_section(load_md, plots)
    for stem, title, plot in MARKDOWN_BENCHMARKS:
        if (md_path := results_dir / "bench" / f"{stem}.md").is_file():
            lines += markdown_section(md_path, title, plot, plots)
    return lines


def ablation_sections(results_dir: Path, plots: Path) -> list[str]:
    """Every other run a committed recipe reproduces: ablations, pilots, earlier training stages."""
    reference = set(REFERENCE_RUNS.values())
    runs = [path for path in sorted(results_dir.glob("*/eval.json")) if path.parent.name not in reference]
    body = ablation_section(results_dir)
    for eval_path in runs:
        body += run_section(eval_path, plots)
    if not body:
        return []
    return [
        "## Ablations and pilots",
        "",
        "Runs of `experiments/recipes/ablations/`, the quick profiles they compare with, and the earlier",
        "stages of the SQuAD reference chain. What each tested and what it showed:",
        "[experiments/](experiments/).",
        "",
        *body,
    ]


def retrieval_sections(results_dir: Path) -> list[str]:
    """Every ``results/*/retrieval.json`` (``python -m benchmarks.retrieval``): its table and targets; then
    every ``long_context.json`` (the study ``experiments.retrieval_long``) with the table it wrote beside."""
    from benchmarks import retrieval

    body: list[str] = []
    paths = sorted(results_dir.glob("*/retrieval.json")) + sorted(results_dir.glob("*/long_context.json"))
    for path in paths:
        payload = _load(path)
        if payload is None:
            continue
        if path.name == "long_context.json":
            table = _moved(path.with_suffix(".md").read_text(encoding="utf-8"), LONG_CONTEXT_MOVED)
        else:
            table = retrieval.markdown(payload)
        title, rest = table.split("\n", 1)
        body += [f"##{title} ({path.parent.name})", "", f"Source: `{path}` — {_machine_line(payload)}.", rest]
    if not body:
        return []
    return [
        "## Retrieval with learned retention (embeddings)",
        "",
        "Search over text the embedding retrofit never trained on (SQuAD v1.1 dev question → paragraph;",
        "SciTLDR-A test TLDR → abstract): learned retention against random-k, attention-received top-k",
        "and first-k truncation at equal encoder token-work, with the targets settled before measuring.",
        "",
        *body,
    ]


FRONTIER_TITLE = "Quality–speed frontier (embeddings)"
FRONTIER_PLOT = "frontier.png"
FRONTIER_COMMAND = (
    "scripts/embedding_frontier.sh runs/minilm-embed-full   # python -m benchmarks.retrieval (fp32, int8),\n"
    "                                                      # then python -m benchmarks.frontier per set"
)
# (results/bench stem, subsection title, plot): the fixed-length run first, then each set's real documents
FRONTIER_RUNS = (
    ("frontier", "Fixed length: random words, 256 tokens each, batch 8 (quality: SQuAD)", FRONTIER_PLOT),
    ("frontier-squad", "SQuAD paragraphs at their own lengths", "frontier-squad.png"),
    ("frontier-scitldr", "SciTLDR abstracts at their own lengths", "frontier-scitldr.png"),
    ("frontier-bbc", "BBC News articles at their own lengths, up to 512 tokens", "frontier-bbc.png"),
    ("frontier-mpnet-embed", "all-mpnet-base-v2: random words, 256 tokens each", "frontier-mpnet-embed.png"),
    (
        "frontier-mpnet-embed-384",
        "all-mpnet-base-v2: random words, 384 tokens each",
        "frontier-mpnet-embed-384.png",
    ),
    ("frontier-mpnet-embed-squad", "all-mpnet-base-v2: SQuAD paragraphs", "frontier-mpnet-embed-squad.png"),
)


def frontier_section(results_dir: Path, plots: Path) -> list[str]:
    """How to choose a knob: ``python -m benchmarks.frontier``'s tables and plots, once committed."""
    intro = [
        "Documents/s on one CPU against retrieval nDCG@10, for every knob a user can turn: learned ρ,",
        "first-k truncation, layer exit, int8 (dense, with ρ, with truncation), against the faster of the",
        "fused dense ONNX peer and torch SDPA in the same run; the last column is each learned point's",
        "documents/s over its precision's truncation curve at the same nDCG@10. Measured with",
        "",
        "```",
        FRONTIER_COMMAND,
        "```",
        "",
        "`--cpu-peers st-torch onnx onnx-int8 openvino openvino-f32 openvino-int8-static` (any of",
        "them) adds the CPU runtimes a user would run instead (`benchmarks.cpu_peers`) as `cpu-peer`",
        "rows, timed in the same rounds; their quality is the cosine of their vectors to the fused",
        "fp32 peer's (their nDCG@10 is not measured).",
        "",
    ]
    sections = []
    for stem, title, plot in FRONTIER_RUNS:
        md_path = results_dir / "bench" / f"{stem}.md"
        if not md_path.is_file():
            continue
        heading, blank, *rest = markdown_section(md_path, title, plot, plots)
        sections += [f"#{heading}", blank, *rest]
    if not sections:
        placeholder = "The numbers come from the committed `results/bench/frontier*.json` (not measured yet)."
        return [f"## {FRONTIER_TITLE}", "", *intro, placeholder, ""]
    return [f"## {FRONTIER_TITLE}", "", *intro, *sections]


GPU_TITLE = "GPU"
GPU_INTRO = """\
`python -m benchmarks.gpu --out <dir>` measures the GPU path (`--dry-run`: the same code paths on the
CPU in seconds, labelled `cpu dry run`; `tests/benchmarks/test_gpu_benchmark.py`). On a lent device it
runs as **one prepared call**, [`scripts/gpu_check.sh`](../scripts/gpu_check.sh), first the forward
([`benchmarks/gpu_forward.py`](../benchmarks/gpu_forward.py)): what the torch backend serves
with (`retention_torch`: static shape plans, SDPA, one CUDA graph per plan; the product's embedding
selection) against Hugging Face's encoder with dense SDPA, eager and captured as a CUDA graph, same
random weights, MiniLM (384 × 6) and base (768 × 12) shapes, fp32 (TF32 off) and bf16, batch 1 / 8 / 32
/ 128 × 256 / 512 tokens, ρ 1 / 0.7 / 0.5 / 0.3 each eager and graphed: sequences/s, the ratio to the
faster dense variant of the same precision, the token-work limit 1 / work and the share of it reached,
peak device memory, and at 8 × 256 the CUDA kernels and host waits per forward. The numbers below are
the older parts' (`torch`: the exported graph's torch forward vs dense SDPA, `git show
670730a:benchmarks/gpu.py`; `fit`: `minilm-embed.yaml`'s quick profile on CUDA against the device's CPU,
seconds per step, now the study `python -m experiments.gpu_fit`). Then, in the last
`GPU_CHECK_SERVICE_S` (220) seconds, the service part
([`benchmarks/gpu_service.py`](../benchmarks/gpu_service.py)): the real server (`python -m service`, torch
backend, bf16, CUDA graphs) against sentence-transformers `encode` (bf16) behind a batching FastAPI
server ([`benchmarks/st_peer.py`](../benchmarks/st_peer.py)) on the same card, same random weights,
`/v1/embeddings` through real HTTP with 8 and 64 clients, SQuAD dev paragraphs at their own lengths (1–4
per request), ρ 1 / 0.5 / 0.3 / auto: requests/s, p50/p99, device memory, the batches each formed.

**Standing order: whenever a device is lent, run the prepared check first (call 1 below) and commit
its results**, before anything else spends the device's minutes.

1. Here, in the checkout the device call sends (the carried folder is git-ignored, 27 MiB, 40 MiB with
   the working tree; the script fails past 64 MiB with the tree and prints the `carry` list):

   ```
   PYTHON=.venv/bin/python scripts/gpu_check.sh prepare   # .gpu-check/: wheels for the device's Python 3.12
                                                          # (pydantic, transformers, fastapi & co; the
                                                          # image's own onnxruntime), tokenizer,
                                                          # SQuAD dev paragraphs, SHA256SUMS
   ```

2. Call 1, the torch-CUDA check (the `run` tool; ≤ 8 minutes: a time guard stops adding cells):

   ```
   run(command="bash scripts/gpu_check.sh run", carry=[".gpu-check"], timeout_s=540)
   ```

   It checks the carried folder's checksums and the image (Python, `torch.cuda.is_available()`, the
   GPU, torch / numpy / transformers / onnx / onnxruntime versions), installs the carried wheels with
   `pip install --no-index --find-links .gpu-check/wheels --target /tmp/gpu-check-site` (never the
   network; an image without pip gets them unzipped), imports the code path, then runs
   `python -m benchmarks.gpu --budget-s …`, then `python -m benchmarks.gpu_service --budget-s …`
   (`GPU_CHECK_SERVICE=0` leaves it out).
   Everything lands in `$OUT/gpu-check/`: `image.json` (the image check), `gpu.json` (the cells,
   the image check, the versions and every distribution the run imported), `gpu.md`,
   `gpu_service.json` and `.md`, `run.log`. Copy the JSON and markdown files to `results/bench/`,
   rerun `python -m benchmarks report`, commit, and give the machine back. `scripts/gpu_check.sh run
   --dry-run` (or `GPU_CHECK_DRY_RUN=1`) is the same script on this CPU with tiny sizes
   (`tests/deploy/test_gpu_check.py`).

3. The ONNX Runtime CUDA provider is not measured: onnxruntime-gpu (~240 MiB) exceeds one call's
   carry and would travel in pieces over several back-to-back calls (`scripts/gpu_wheel.sh download` /
   `split` here, `join` there); its part is in `git show 670730a:benchmarks/gpu.py`.

"""


def gpu_section(results_dir: Path, plots: Path) -> list[str]:
    """How to measure the GPU path on a lent device (``scripts/gpu_check.sh``, one prepared call), and its
    table once committed as ``results/bench/gpu.json``."""
    intro = GPU_INTRO.splitlines()
    md_path = results_dir / "bench" / "gpu.md"
    if not md_path.is_file():
        return [f"## {GPU_TITLE}", "", *intro, "Not measured yet: pending a device.", ""]
    title, blank, *rest = markdown_section(md_path, GPU_TITLE, None, plots)
    return [title, blank, *intro, *rest]


def retrofit_sections(results_dir: Path) -> list[str]:
    """Every ``results/*/comparison.json`` (the study ``python -m experiments.retrofit_comparison``) with
    the table it wrote beside."""
    body: list[str] = []
    for path in sorted(results_dir.glob("*/comparison.json")):
        payload = _load(path)
        if payload is None:
            continue
        command = _moved(payload.get("command", ""))
        table = path.with_suffix(".md").read_text(encoding="utf-8")
        body += [f"Source: `{path}` — {_machine_line(payload)}; `{command}`.", "", table]
    if not body:
        return []
    return [
        "## Retrofit vs joint training (classification)",
        "",
        "A plain dense classifier plays the user's model; retention is retrofitted onto it label-free",
        "(frozen backbone, KL to its logits on unlabeled train text) and compared with the model trained",
        "jointly with retention from the start, on the same test examples.",
        "",
        *body,
    ]


def build_report(results_dir: Path = RESULTS, docs_dir: Path = DOCS) -> Path:
    plots = docs_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks report` from the raw JSON under `results/`.",
        "Every figure below is copied from those files; rerun the command named with each table.",
        "Runs of superseded recipes and abandoned training stages are not shown: they are under",
        "`results/experiments/` and written up in [experiments/](experiments/).",
        "",
    ]
    lines += reference_sections(results_dir, plots)
    lines += system_sections(results_dir, plots)
    lines += gpu_section(results_dir, plots)
    lines += ablation_sections(results_dir, plots)
    lines += retrieval_sections(results_dir)
    lines += frontier_section(results_dir, plots)
    lines += retrofit_sections(results_dir)
    out = docs_dir / "benchmarks.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
