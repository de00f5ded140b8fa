"""The whole CLI of a study script that measures one trained run at a few ρ
(``python -m experiments.<module> runs/<name> --rhos 0.3 0.5 --<count> N --out <file>.json``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import Payload, publish

DEFAULT_RHOS = (0.3, 0.5)


def run_dir_main(
    argv: list[str] | None,
    *,
    module: str,
    description: str | None,
    count: tuple[str, int],
    measure: Callable[[Path, list[float], int], Payload],
    markdown: Callable[[Payload], str],
) -> None:
    """``module``'s CLI: ``measure(run_dir, rhos, count)`` → ``--out`` and its table.

    ``count`` is the name and default of the option that sizes the sample (``("questions", 64)``).
    """
    argv = sys.argv[1:] if argv is None else argv
    flag, default = count
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument(f"--{flag}", type=int, default=default, dest="count", metavar=flag.upper())
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    publish(measure(args.run_dir, args.rhos, args.count), markdown, args.out, module, argv)
