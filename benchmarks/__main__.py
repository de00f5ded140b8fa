"""``python -m benchmarks {speed,memory,report,all}`` — ``make bench`` runs ``all``: the encoder speed
grid and peak memory into ``results/bench/``, then ``docs/benchmarks.md`` with plots from every committed
result. ``--quick`` uses a tiny model and takes seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import encoder_speed, memory, report

FULL_GRID = ["--seq-lens", "128", "512", "--batches", "1", "8", "32"]  # the speed grid of ``make bench``


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("command", choices=["speed", "memory", "report", "all"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--docs-dir", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    bench_dir = args.results_dir / "bench"
    quick = ["--quick"] if args.quick else []
    if args.command in ("speed", "all"):
        encoder_speed.main(
            [*quick, "--out", str(bench_dir / "encoder_speed.json"), *([] if args.quick else FULL_GRID)]
        )
    if args.command in ("memory", "all"):
        memory.main([*quick, "--out", str(bench_dir / "memory.json"), "--no-arena"])
    if args.command in ("report", "all"):
        print(f"wrote {report.build_report(args.results_dir, args.docs_dir)}")


if __name__ == "__main__":
    main()
