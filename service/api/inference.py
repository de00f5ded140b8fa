"""What the three inference endpoints share: rho resolution, truncation policy, the engine call,
usage accounting, metrics and response headers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from fastapi import Response

from retention_core.codecs.base import Encoded
from retention_core.usage import token_work
from service.api.deps import QueryOptions
from service.api.schemas import InferenceOptions, Usage
from service.engine import Engine
from service.errors import InputTooLong, InvalidRequest, PayloadTooLarge
from service.metrics import Metrics
from service.runtime import LoadedModel
from service.settings import Settings


@dataclass
class Outcome:
    outputs: list[list[np.ndarray]]  # per encoded item: the graph output of each of its rows
    usage: Usage


def check_items(count: int, settings: Settings) -> None:
    if count > settings.max_items:
        raise PayloadTooLarge(f"at most {settings.max_items} items per request, got {count}")


async def infer(
    *,
    endpoint: str,
    model: LoadedModel,
    encoded: list[Encoded],
    body: InferenceOptions,
    query: QueryOptions,
    deadline: float,
    engine: Engine,
    settings: Settings,
    metrics: Metrics,
    response: Response,
) -> Outcome:
    # Rule: a body value wins over the query parameter of the same name.
    requested = body.rho if body.rho is not None else query.rho
    truncate = body.truncate if body.truncate is not None else query.truncate
    min_rho = body.min_rho if body.min_rho is not None else query.min_rho

    truncated = any(item.truncated for item in encoded)
    input_tokens = sum(item.input_tokens for item in encoded)
    if truncated and truncate is False:
        longest = max(item.input_tokens for item in encoded if item.truncated)
        raise InputTooLong(
            f"input has {longest} tokens but model {model.name!r} reads at most {model.manifest.max_length}; "
            "send truncate=true to keep the head"
        )
    rows = [row for item in encoded for row in item.rows]
    if not rows:
        raise InvalidRequest("the input produced no tokens")

    degraded = False
    if requested == "auto":
        floor = min_rho if min_rho is not None else settings.auto_min_rho
        choice = engine.auto_rho(model, sum(len(row) for row in rows), floor)
        rho, degraded = choice.rho, choice.degraded
    else:
        floor = None
        rho = float(requested) if requested is not None else model.manifest.default_rho

    result = await engine.infer(model, rows, [rho] * len(rows), deadline)

    outputs: list[list[np.ndarray]] = []
    offset = 0
    for item in encoded:
        outputs.append(result.outputs[offset : offset + len(item.rows)])
        offset += len(item.rows)
    work = token_work(model.manifest, [len(row) for row in rows], result.kept_counts)
    usage = Usage(
        input_tokens=input_tokens,
        processed_tokens=work.processed_tokens,
        rows=len(rows),
        num_layers=int(result.kept_counts.shape[1]),
        kept_tokens_per_layer=work.kept_tokens_per_layer,
        token_work_fraction=round(work.fraction, 6),
        rho_requested="auto" if requested == "auto" else (None if requested is None else float(requested)),
        rho_effective=rho,
        min_rho=floor,
        degraded=degraded,
        truncated=truncated,
        queue_time_s=result.queue_time,
        inference_time_s=result.inference_time,
    )

    name = model.name
    metrics.input_tokens.labels(endpoint=endpoint).observe(input_tokens)
    if requested != "auto":
        metrics.requested_rho.labels(endpoint=endpoint).observe(rho)
    metrics.effective_rho.labels(endpoint=endpoint).observe(rho)
    if degraded:
        metrics.degraded.labels(endpoint=endpoint).inc()
    metrics.token_layers_computed.labels(model=name).inc(work.computed)
    metrics.token_layers_saved.labels(model=name).inc(max(0.0, work.dense - work.computed))
    metrics.activation_memory.labels(model=name).observe(work.activation_bytes)

    response.headers["x-model"] = name
    response.headers["x-rho-effective"] = f"{rho:.6g}"
    response.headers["x-queue-time"] = f"{result.queue_time:.6f}"
    response.headers["x-inference-time"] = f"{result.inference_time:.6f}"
    return Outcome(outputs, usage)
