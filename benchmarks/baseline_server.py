"""The baseline users build by hand: FastAPI + a transformers pipeline (torch), no pruning, no batching.

    python -m benchmarks.baseline_server --model PATH_OR_HF_ID [--task classification] --port 8001

Serves the same request shapes as the service (``/classify`` with ``text`` or ``texts``; ``/qa`` with
``question`` + ``context``) so ``benchmarks/load.py`` can drive both. Benchmark-only: imports torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import BaseModel


class ClassifyBody(BaseModel):
    text: str | None = None
    texts: list[str] | None = None


class QABody(BaseModel):
    question: str
    context: str


def build_app(model: str, task: str, max_length: int, threads: int | None) -> Any:
    import torch
    from fastapi import FastAPI
    from transformers import pipeline

    if threads:
        torch.set_num_threads(threads)
    hf_task = {"classification": "text-classification", "qa": "question-answering"}[task]
    make_pipeline: Any = pipeline  # typed overloads want a Literal task
    pipe = make_pipeline(hf_task, model=model, tokenizer=model, device="cpu")
    app = FastAPI(title="baseline (transformers pipeline)")

    @app.post("/classify")
    def classify(body: ClassifyBody) -> dict[str, Any]:  # sync: FastAPI runs it in its thread pool
        texts = [body.text] if body.text is not None else list(body.texts or [])
        with torch.inference_mode():
            outputs = pipe(texts, truncation=True, max_length=max_length, top_k=None)
        results = [
            {
                "label": max(o, key=lambda x: x["score"])["label"],
                "scores": {x["label"]: x["score"] for x in o},
            }
            for o in outputs
        ]
        return {"results": results, **(results[0] if body.text is not None else {})}

    @app.post("/qa")
    def qa(body: QABody) -> dict[str, Any]:
        with torch.inference_mode():
            out = pipe(question=body.question, context=body.context, max_seq_len=max_length)
        return {"answer": out["answer"], "start": out["start"], "end": out["end"], "score": out["score"]}

    @app.get("/livez")
    def livez() -> dict[str, str]:
        return {"status": "alive"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baseline_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="HF checkpoint directory or hub id")
    parser.add_argument("--task", choices=["classification", "qa"], default="classification")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)

    import uvicorn

    uvicorn.run(
        build_app(args.model, args.task, args.max_length, args.threads), host=args.host, port=args.port
    )


if __name__ == "__main__":
    main()
