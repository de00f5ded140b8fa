"""Why the two-path graph ran 1.11–1.13× the frozen graph's seconds per batch at ρ < 1 although its copy
branch holds the same operators (docs/experiments/2026-11-28-pruned-branch.md). One batch of random
ids, interleaved rounds, the same kept tokens in every variant:

- ``frozen``: the frozen retrofit's export (pruned pass one ``If`` deep, weights in the outer graph);
- ``two-path``: the copy's export as shipped (its pruned pass two ``If`` levels deep, every weight in the
  outermost graph);
- ``two-path-weights-one-level``: the same graph with the copy's own weights moved into the outer ``If``'s
  else branch (one level above the copy's pass, as the frozen graph's weights are above its pass:
  ``training.export.two_path.with_weights_beside_their_pass``, what the export now does);
- ``frozen-pass`` / ``copy-pass``: each pruned pass alone as a top-level graph (weights local);
- ``frozen-no-prepacking``: the frozen graph with onnxruntime's weight prepacking off.

If the standalone passes run alike and ``two-path`` is slower than ``frozen``, the nesting costs it; if
moving the weights closes the gap, where they live does; if the frozen graph without prepacking slows by
as much (and its outputs move as the two-path graph's do), the weights two levels up were not prepacked.

    python -m experiments.two_path_speed <frozen export dir> <two-path export dir> \\
        --out results/experiments/pruned-branch/two-path-speed.json
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, ort_session, publish, speedups, timed_rounds

MODULE = "experiments.two_path_speed"
BATCH, LENGTH, ROUNDS = 8, 256, 15
RHOS = (0.5, 0.3)
REFERENCE = "frozen"


NO_PREPACKING = "frozen-no-prepacking"


def variant_files(frozen: Path, two_path: Path, workdir: Path) -> dict[str, Path]:
    import onnx

    from training.export.two_path import unjoined, with_weights_beside_their_pass

    frozen_model, two_path_model = onnx.load(str(frozen)), onnx.load(str(two_path))
    frozen_parts, two_path_parts = unjoined(frozen_model), unjoined(two_path_model)
    assert frozen_parts is not None and two_path_parts is not None
    copy_parts = unjoined(two_path_parts[0])  # the ρ < 1 side: (the copy's pass, both paths)
    assert copy_parts is not None
    built = {
        "two-path-weights-one-level": with_weights_beside_their_pass(two_path_model),
        "frozen-pass": frozen_parts[0],
        "copy-pass": copy_parts[0],
    }
    files = {REFERENCE: frozen, "two-path": two_path, NO_PREPACKING: frozen}
    for name, model in built.items():
        files[name] = workdir / f"{name}.onnx"
        onnx.save(model, str(files[name]))
    return files


def unpacked_session(path: Path, threads: int) -> Any:
    """``ort_session``'s settings with weight prepacking off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_for(session: Any, rho: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, (BATCH, LENGTH)).astype(np.int64)
    values: dict[str, np.ndarray] = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "rho": np.full(BATCH, rho, np.float32),
    }
    return {graph_input.name: values[graph_input.name] for graph_input in session.get_inputs()}


def measure(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="two-path-speed-") as tmp:
        files = variant_files(args.frozen / "model.onnx", args.two_path / "model.onnx", Path(tmp))
        sessions = {name: ort_session(path, args.threads) for name, path in files.items()}
        sessions[NO_PREPACKING] = unpacked_session(files[NO_PREPACKING], args.threads)
        results: dict[str, Any] = {}
        for rho in RHOS:
            runs = {name: _run(session, feeds_for(session, rho)) for name, session in sessions.items()}
            outputs = {name: run() for name, run in runs.items()}
            rounds = timed_rounds(runs, args.rounds, 1, 900.0)
            results[f"{rho:g}"] = {
                name: {
                    **speedups(rounds, name, REFERENCE, BATCH, speedup="speedup_vs_frozen"),
                    "max_abs_vs_same_weights": _same_weights_difference(outputs, name),
                }
                for name in runs
            }
    return {
        "settings": {"batch": BATCH, "length": LENGTH, "rounds": args.rounds, "threads": args.threads},
        "frozen": str(args.frozen),
        "two_path": str(args.two_path),
        "results": results,
    }


def _run(session: Any, feeds: dict[str, np.ndarray]) -> Any:
    return lambda: session.run(None, feeds)[0]


def _same_weights_difference(outputs: dict[str, np.ndarray], name: str) -> float:
    """Largest difference to the variant running the same weights (a check that the surgery kept them)."""
    twin = {
        "frozen-pass": REFERENCE,
        NO_PREPACKING: REFERENCE,
        "copy-pass": "two-path",
        "two-path-weights-one-level": "two-path",
    }
    other = twin.get(name, name)
    return float(np.max(np.abs(outputs[name] - outputs[other])))


def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "# Two-path graph speed: where the copy's weights live and how deep its pass runs",
        "",
        f"Batch {BATCH} × {LENGTH} random ids, {payload['settings']['rounds']} interleaved rounds, "
        f"{payload['settings']['threads']} threads. Ratio: frozen seconds / variant seconds, per round.",
        "",
        "| ρ | variant | seconds per batch | speed vs frozen (min–max) | max diff vs same weights |",
        "|---|---|---:|---|---:|",
    ]
    for rho, rows in payload["results"].items():
        for name, row in rows.items():
            lines.append(
                f"| {rho} | {name} | {row['seconds_per_batch']:.3f} | {row['speedup_vs_frozen']:.3f}× "
                f"({row['speedup_min']:.2f}–{row['speedup_max']:.2f}) "
                f"| {row['max_abs_vs_same_weights']:.1e} |"
            )
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload.get('wall_seconds', '?')} s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    parser = cli(MODULE, __doc__)
    parser.add_argument("frozen", type=Path, help="the frozen retrofit's export directory")
    parser.add_argument("two_path", type=Path, help="the two-path (copy) export directory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    return publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
