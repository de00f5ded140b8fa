"""Write a trained classification run as a plain Hugging Face ``BertForSequenceClassification`` dir.

The load benchmark's baseline (FastAPI + a transformers pipeline) then serves *the same weights* as our
service at ρ=1, so the throughput comparison is at matched quality. Our head (tanh(dense([CLS])) →
out) is exactly BERT's pooler + classifier.

    python -m benchmarks.hf_checkpoint runs/imdb-minilm-quick --out /tmp/hf-imdb-minilm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def export_hf_checkpoint(run_dir: Path, out: Path) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    from training.fit import load_run

    model, recipe, tokenizer = load_run(run_dir)
    if model.task != "classification" or model.backbone.info.family != "bert":
        raise ValueError("only BERT-family classification runs convert to BertForSequenceClassification")
    config = BertConfig.from_dict(model.backbone.config.to_dict())
    config.num_labels = len(recipe.labels)
    config.id2label = dict(enumerate(recipe.labels))
    config.label2id = {label: i for i, label in enumerate(recipe.labels)}
    hf = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        hf.bert.embeddings.load_state_dict(model.backbone.embeddings.state_dict(), strict=False)
        for target, view in zip(hf.bert.encoder.layer, model.backbone.views, strict=True):
            target.attention.self.query.load_state_dict(view.query.state_dict())
            target.attention.self.key.load_state_dict(view.key.state_dict())
            target.attention.self.value.load_state_dict(view.value.state_dict())
            target.attention.output.dense.load_state_dict(view.attn_out.state_dict())
            target.attention.output.LayerNorm.load_state_dict(view.attn_norm.state_dict())
            target.intermediate.dense.load_state_dict(view.ffn_in.state_dict())
            target.output.dense.load_state_dict(view.ffn_out.state_dict())
            target.output.LayerNorm.load_state_dict(view.ffn_norm.state_dict())
        head = model.head
        hf.bert.pooler.dense.load_state_dict(head.dense.state_dict())  # type: ignore[union-attr]
        hf.classifier.load_state_dict(head.out.state_dict())  # type: ignore[union-attr]
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))  # type: ignore[attr-defined]
    return out


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
