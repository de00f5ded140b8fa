"""Write a trained classification run as a plain Hugging Face ``BertForSequenceClassification`` dir.

The load benchmark's baseline (FastAPI + a transformers pipeline) then serves *the same weights* as our
service at ρ=1, so the throughput comparison is at matched quality. The conversion lives in
``training.hf_checkpoint`` (also ``python -m training to-hf``); this keeps the benchmarks' entry point.

    python -m benchmarks.hf_checkpoint runs/imdb-minilm-quick --out /tmp/hf-imdb-minilm
"""

from __future__ import annotations

import argparse
from pathlib import Path


def export_hf_checkpoint(run_dir: Path, out: Path) -> Path:
    from training.fit import load_run
    from training.hf_checkpoint import write_hf_classifier

    model, recipe, tokenizer = load_run(run_dir)
    return write_hf_classifier(model, recipe, tokenizer, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(f"wrote {export_hf_checkpoint(args.run_dir, args.out)}")


if __name__ == "__main__":
    main()
