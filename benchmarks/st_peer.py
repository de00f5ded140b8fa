"""The peer a GPU user runs today: sentence-transformers ``encode`` behind a minimal FastAPI server with a
batching queue, the usual hand-made embedding service; OpenAI's ``POST /v1/embeddings``, so the client of
``benchmarks.gpu_service`` drives it and our service alike.

    python -m benchmarks.st_peer --model DIR --device cuda --dtype bfloat16 --port 8001

Requests wait in one asyncio queue. One worker takes what is queued (up to ``--max-batch`` texts; after
the first it waits at most ``--max-wait-ms`` for more), runs ``encode`` on it in a thread (the event loop
keeps reading requests meanwhile) and answers each request its rows. ``GET /stats``: the batches formed
(count, texts) and the device's memory (``torch.cuda.memory_allocated`` and ``max_memory_allocated``;
None on the CPU). ``GET /readyz`` answers once the model is loaded and warmed. Benchmark-only: imports
torch and sentence-transformers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

DTYPES = ("float32", "bfloat16", "float16")
WARMUP_TEXTS = ["a short warm-up text", "a longer warm-up text about rivers, " * 20]


class EmbeddingsBody(BaseModel):
    """OpenAI's request; other fields (a ``rho`` meant for our service) are ignored."""

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


@dataclass
class Pending:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


@dataclass
class BatchStats:
    batches: int = 0
    texts: int = 0
    requests: int = 0
    encode_seconds: float = 0.0
    sizes: dict[int, int] = field(default_factory=dict)  # texts per batch → batches of that size

    def add(self, requests: int, texts: int, seconds: float) -> None:
        self.batches += 1
        self.requests += requests
        self.texts += texts
        self.encode_seconds += seconds
        self.sizes[texts] = self.sizes.get(texts, 0) + 1


class Batcher:
    """One queue, one worker: each batch is what waited, in arrival order, capped at ``max_batch`` texts;
    a request is never split between batches (one larger than ``max_batch`` goes alone, ``encode`` cuts
    it into mini-batches)."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], max_batch: int, max_wait_s: float) -> None:
        self.encode = encode
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: asyncio.Queue[Pending] = asyncio.Queue()
        self.stats = BatchStats()
        self.held: Pending | None = None  # taken from the queue, did not fit: it starts the next batch
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")

    async def submit(self, texts: list[str]) -> np.ndarray:
        pending = Pending(texts, asyncio.get_running_loop().create_future())
        await self.queue.put(pending)
        return await pending.future

    async def collect(self) -> list[Pending]:
        loop = asyncio.get_running_loop()
        group = [self.held if self.held is not None else await self.queue.get()]
        self.held = None
        count = len(group[0].texts)
        deadline = loop.time() + self.max_wait_s
        while count < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            if count + len(item.texts) > self.max_batch:
                self.held = item  # whole, first in the next batch
                break
            group.append(item)
            count += len(item.texts)
        return group

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            group = await self.collect()
            texts = [text for pending in group for text in pending.texts]
            started = time.perf_counter()
            try:
                vectors = await loop.run_in_executor(self.executor, self.encode, texts)
            except Exception as exc:  # the batch's requests fail, the server stays up
                for pending in group:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            self.stats.add(len(group), len(texts), time.perf_counter() - started)
            offset = 0
            for pending in group:
                if not pending.future.done():
                    pending.future.set_result(vectors[offset : offset + len(pending.texts)])
                offset += len(pending.texts)


def load_encoder(
    model: str, device: str, dtype: str, max_batch: int
) -> tuple[Any, Callable[[list[str]], Any]]:
    """The sentence-transformers model on ``device`` in ``dtype`` (SDPA attention), and its encode."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model, device=device, model_kwargs={"attn_implementation": "sdpa"})
    st = st.to(getattr(torch, dtype)).eval()

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            out = st.encode(texts, batch_size=max_batch, convert_to_tensor=True, show_progress_bar=False)
        return np.asarray(out.float().cpu().numpy(), dtype=np.float32)

    return st, encode


def device_memory(device: str) -> dict[str, int | None]:
    import torch

    if not device.startswith("cuda"):
        return {"memory_allocated_bytes": None, "max_memory_allocated_bytes": None}
    return {
        "memory_allocated_bytes": int(torch.cuda.memory_allocated()),
        "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()),
    }


def embedding_item(index: int, vector: np.ndarray, encoding: str) -> dict[str, Any]:
    value: Any = (
        base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        if encoding == "base64"
        else vector.tolist()
    )
    return {"object": "embedding", "index": index, "embedding": value}


def build_app(model: str, device: str, dtype: str, max_batch: int, max_wait_ms: float) -> Any:
    from fastapi import FastAPI

    st, encode = load_encoder(model, device, dtype, max_batch)
    for _ in range(2):  # kernels chosen, allocator grown: the first request is not the first forward
        encode(WARMUP_TEXTS)
    name = model.rstrip("/").split("/")[-1]
    batcher = Batcher(encode, max_batch, max_wait_ms / 1000)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        batcher.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="sentence-transformers peer", lifespan=lifespan)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsBody) -> dict[str, Any]:
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = await batcher.submit(texts)
        return {
            "object": "list",
            "model": body.model or name,
            "data": [embedding_item(i, v, body.encoding_format) for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        s = batcher.stats
        return {
            "device": device,
            "dtype": dtype,
            "max_seq_length": st.max_seq_length,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
            "batches": s.batches,
            "texts": s.texts,
            "requests": s.requests,
            "encode_seconds": s.encode_seconds,
            "batch_sizes": {str(k): v for k, v in sorted(s.sizes.items())},
            **device_memory(device),
        }

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.st_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a sentence-transformers model directory")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:0, cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    parser.add_argument("--max-batch", type=int, default=32, help="texts per encode (Infinity's default)")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits to fill")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    app = build_app(args.model, args.device, args.dtype, args.max_batch, args.max_wait_ms)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
