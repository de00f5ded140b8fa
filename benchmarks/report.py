"""Turn the committed raw JSON under ``results/`` into ``docs/benchmarks.md`` and PNG plots.

Only numbers found in those files appear in the report; each table names the JSON it came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path("results")
DOCS = Path("docs")
PLOTS = DOCS / "plots"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _machine_line(payload: dict[str, Any]) -> str:
    machine = payload.get("machine") or payload.get("meta", {}).get("machine", {})
    keys = ("cpu", "cores", "onnxruntime", "torch", "commit")
    return ", ".join(f"{k}: {machine[k]}" for k in keys if k in machine)


def speed_section(payload: dict[str, Any], source: Path) -> list[str]:
    from benchmarks.encoder_speed import markdown

    lines = [
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
    return lines


def memory_section(payload: dict[str, Any], source: Path) -> list[str]:
    lines = [
        "## Peak memory",
        "",
        f"Source: `{source}` — {_machine_line(payload)}; batch {payload['batch']} × "
        f"{payload['seq_len']} tokens, CPU arena {'on' if payload['arena'] else 'off'}.",
        "",
        "| variant | ρ | peak RSS (MiB) | vs dense | activation (MiB) | vs dense |",
        "|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        activation_ratio = f"{r['activation_vs_dense']:.2f}×" if r["activation_vs_dense"] is not None else "—"
        rho = r["rho"] if r["rho"] is not None else "—"
        lines.append(
            f"| {r['variant']} | {rho} | {r['peak_bytes'] / 2**20:.0f} | "
            f"{r['peak_vs_dense']:.2f}× | {r['activation_bytes'] / 2**20:.0f} | {activation_ratio} |"
        )
    return [*lines, ""]


def quality_section(payload: dict[str, Any], source: Path) -> list[str]:
    from training.evaluate import MethodResult, markdown_table

    meta = payload["meta"]
    results = [MethodResult(**r) for r in payload["results"]]
    return [
        f"## Quality vs ρ — {meta['model']} ({meta['profile']} recipe), {meta['split']}",
        "",
        f"Source: `{source}`; {meta['num_examples']} examples ({meta.get('subset', '')}). "
        f"Command: `{meta.get('command', '')}`.",
        "",
        markdown_table(results),
    ]


def plot_quality(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    methods = list(dict.fromkeys(r["method"] for r in payload["results"]))
    for method in methods:
        points = sorted((r["rho"], 100 * r["accuracy"]) for r in payload["results"] if r["method"] == method)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
    ax.set_xlabel("ρ (fraction of real tokens kept at the last layer)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{payload['meta']['model']} — {payload['meta']['split']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speed(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    cells = sorted({(r["seq_len"], r["batch"]) for r in payload["results"]})
    for seq_len, batch in cells:
        rows = [r for r in payload["results"] if (r["seq_len"], r["batch"]) == (seq_len, batch) and r["rho"]]
        for precision in ("fp32", "int8"):
            chosen = sorted((r["rho"], r["speedup_vs_dense"]) for r in rows if r["precision"] == precision)
            if chosen:
                ax.plot(
                    [c[0] for c in chosen],
                    [c[1] for c in chosen],
                    marker="o",
                    label=f"measured {precision}, {seq_len} tok, batch {batch}",
                )
    theory = sorted(
        {
            (r["rho"], r["theoretical_flop_ratio"])
            for r in payload["results"]
            if r["rho"] and r["seq_len"] == cells[-1][0] and r["precision"] == "fp32"
        }
    )
    ax.plot(
        [t[0] for t in theory],
        [t[1] for t in theory],
        "k--",
        label=f"theoretical FLOP ratio ({cells[-1][0]} tok)",
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("ρ")
    ax.set_ylabel("speed-up over dense ONNX fp32")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_report(results_dir: Path = RESULTS, docs_dir: Path = DOCS) -> Path:
    plots = docs_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks report` from the raw JSON under `results/`.",
        "Every figure below is copied from those files; rerun the command named with each table.",
        "",
    ]
    speed_path = results_dir / "bench" / "encoder_speed.json"
    if (speed := _load(speed_path)) is not None:
        lines += speed_section(speed, speed_path)
        plot_speed(speed, plots / "speedup_vs_rho.png")
        lines += ["![speed-up vs ρ](plots/speedup_vs_rho.png)", ""]
    memory_path = results_dir / "bench" / "memory.json"
    if (memory := _load(memory_path)) is not None:
        lines += memory_section(memory, memory_path)
    load_md = results_dir / "bench" / "load.md"
    if load_md.is_file():
        body = load_md.read_text(encoding="utf-8").split("\n", 1)[1]  # drop its own title
        lines += ["## Service under load", "", f"Source: `{load_md.with_suffix('.json')}`.", body, ""]
    for eval_path in sorted(results_dir.glob("*/eval.json")):
        payload = _load(eval_path)
        if payload is None or "meta" not in payload:
            continue
        lines += quality_section(payload, eval_path)
        if payload.get("task") in ("qa", "summarization"):
            continue
        plot_name = f"quality_{eval_path.parent.name}.png"
        plot_quality(payload, plots / plot_name)
        lines += [f"![quality vs ρ]({'plots/' + plot_name})", ""]
    out = docs_dir / "benchmarks.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
