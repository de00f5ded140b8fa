"""What the inference endpoints share: the pipeline every route runs (``run``: the request's budget,
decided once by ``service.api.budget``, early shedding, truncation policy, the model server call),
usage accounting, metrics and response headers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from starlette.concurrency import run_in_threadpool

from retention_core.codecs.base import BUILT_TEXT, Encoded
from retention_core.explain import token_depths
from retention_core.usage import Work, token_work
from service.api.budget import Asked, Budget, decide
from service.api.deps import InferenceContext
from service.api.schemas import ExplainedToken, Explanation, InferenceOptions, Usage
from service.errors import PREDICTED_WAIT_HEADER, InferenceFailed, InputTooLong, InvalidRequest
from service.serving import REASON_DEFAULT, REASON_REQUESTED, InferenceResult, ServedModel

T = TypeVar("T")

# Text (characters) up to which a request is tokenized on the event loop rather than in the thread pool:
# handing work to a pool thread and back cost the loop more than tokenizing a few paragraphs (profiled
# at 10x overload: the pool's queue hand-off took more of the loop than the tokenizer took of its thread),
# while a long input (a book chapter, a batch of 64 texts) must not hold the loop for milliseconds.
INLINE_TEXT_CHARS = 8192


async def off_loop_if_long(chars: int, work: Callable[[], T]) -> T:
    """``work()`` (tokenizing ``chars`` characters of text) inline when short, else in the thread pool."""
    if chars <= INLINE_TEXT_CHARS:
        return work()
    return await run_in_threadpool(work)


@dataclass
class Outcome:
    outputs: list[list[np.ndarray]]  # per encoded item: the graph output of each of its rows
    usage: Usage
    depths: list[list[np.ndarray]] | None = None  # per item, per row (T_i,); None: the graph has none


class ExplainUnavailable(InvalidRequest):
    code = "explain_unavailable"


def explain_requested(model: ServedModel, body_value: bool | None, query_value: bool | None) -> bool:
    """Whether to explain (a body value wins over the query parameter); 422 when asked of a model whose
    graph has no survival depth (exported before it existed). Checked before any inference."""
    wanted = bool(body_value if body_value is not None else query_value)
    if wanted and not model.explains:
        raise ExplainUnavailable(
            f"model {model.name!r} was exported without survival depth; re-export it to use explain",
            param="explain",
        )
    return wanted


def explanations(model: ServedModel, encoded: list[Encoded], outcome: Outcome) -> list[Explanation]:
    """Every input's token survival depths, mapped back to its text (``retention_core.explain``)."""
    if outcome.depths is None:  # explain_requested let it through, so the graph must have answered
        raise InferenceFailed()
    return [
        Explanation(
            num_layers=model.num_layers,
            document=item.extra.get(BUILT_TEXT),
            tokens=[
                ExplainedToken.model_validate(t, from_attributes=True) for t in token_depths(item, depths)
            ],
        )
        for item, depths in zip(encoded, outcome.depths, strict=True)
    ]


def check_truncation(model: ServedModel, encoded: list[Encoded], truncate: bool | None) -> None:
    """413 when the client sent ``truncate=false`` (a body value wins over the query's) and an input
    was longer than the model reads."""
    if truncate is False and any(item.truncated for item in encoded):
        longest = max(item.input_tokens for item in encoded if item.truncated)
        raise InputTooLong(
            f"input has {longest} tokens but model {model.name!r} reads at most {model.manifest.max_length}; "
            "send truncate=true to keep the head"
        )


def shed_early(ctx: InferenceContext, model: ServedModel, budget: Budget) -> None:
    """Before tokenizing: 429 when the work already queued for ``model`` ends after this request's due
    time (its rho=auto target, else its deadline)."""
    ctx.server.shed(model, budget.due.at, budget.due.by_target)


def per_item(encoded: list[Encoded], outputs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The flat per-row outputs cut back into one list per encoded item."""
    grouped: list[list[np.ndarray]] = []
    offset = 0
    for item in encoded:
        grouped.append(outputs[offset : offset + len(item.rows)])
        offset += len(item.rows)
    return grouped


def usage_of(encoded: list[Encoded], budget: Budget, result: InferenceResult, work: Work) -> Usage:
    requested, auto = budget.requested, budget.auto
    rho = result.rho
    reason = result.rho_reason or (REASON_DEFAULT if requested is None else REASON_REQUESTED)
    return Usage(
        input_tokens=sum(item.input_tokens for item in encoded),
        processed_tokens=work.processed_tokens,
        rows=int(result.kept_counts.shape[0]),
        num_layers=int(result.kept_counts.shape[1]),
        kept_tokens_per_layer=work.kept_tokens_per_layer,
        token_work_fraction=round(work.fraction, 6),
        rho_requested="auto" if requested == "auto" else (None if requested is None else float(requested)),
        rho_effective=rho,
        min_rho=auto.min_rho if auto is not None else None,
        min_kept_tokens=work.min_kept_tokens,
        rows_at_floor=work.rows_at_floor,
        degraded=auto is not None and rho < auto.max_rho,
        rho_reason=reason,
        latency_target_s=budget.target_s,
        truncated=any(item.truncated for item in encoded),
        queue_time_s=result.queue_time,
        inference_time_s=result.inference_time,
    )


def record(
    ctx: InferenceContext, endpoint: str, model: ServedModel, usage: Usage, budget: Budget, work: Work
) -> None:
    """Metrics of one served request (labelled with the model's task), and its x-* response headers."""
    metrics, name, task, rho = ctx.metrics, model.name, model.task, usage.rho_effective
    metrics.input_tokens.labels(endpoint=endpoint, task=task).observe(usage.input_tokens)
    if budget.requested != "auto":
        metrics.requested_rho.labels(endpoint=endpoint, task=task).observe(rho)
    metrics.effective_rho.labels(endpoint=endpoint, task=task).observe(rho)
    metrics.served_rho.labels(model=name, task=task, reason=usage.rho_reason).observe(rho)
    if usage.degraded:
        metrics.degraded.labels(endpoint=endpoint, task=task).inc()
    metrics.token_layers_computed.labels(model=name, task=task).inc(work.computed)
    metrics.token_layers_saved.labels(model=name, task=task).inc(max(0.0, work.dense - work.computed))
    metrics.activation_memory.labels(model=name, task=task).observe(work.activation_bytes)

    headers = ctx.response.headers
    headers["x-model"] = name
    headers["x-rho-effective"] = f"{rho:.6g}"
    headers["x-queue-time"] = f"{usage.queue_time_s:.6f}"
    headers["x-inference-time"] = f"{usage.inference_time_s:.6f}"
    headers["x-rho-reason"] = usage.rho_reason


async def infer(
    ctx: InferenceContext,
    endpoint: str,
    model: ServedModel,
    encoded: list[Encoded],
    truncate: bool | None,
    budget: Budget,
) -> Outcome:
    """Run the encoded inputs of one request through the model's batcher at the request's budget."""
    check_truncation(model, encoded, truncate)
    rows = [row for item in encoded for row in item.rows]
    if not rows:
        raise InvalidRequest("the input produced no tokens")
    result = await ctx.server.infer(model, rows, budget.rho, budget.deadline, budget.auto)
    work = token_work(model.manifest, [len(row) for row in rows], result.kept_counts)
    usage = usage_of(encoded, budget, result, work)
    record(ctx, endpoint, model, usage, budget, work)
    # admission's prediction beside what happened (x-queue-time): how far off it was, per request
    ctx.response.headers[PREDICTED_WAIT_HEADER] = f"{result.predicted_wait:.6f}"
    depths = per_item(encoded, result.depths) if result.depths is not None else None
    return Outcome(per_item(encoded, result.outputs), usage, depths)


@dataclass(frozen=True)
class Served:
    """One request served: its model, every input's rows and the graph's outputs for them."""

    model: ServedModel
    encoded: list[Encoded]
    outcome: Outcome

    def decoded(self, **options: Any) -> list[dict[str, Any]]:
        """Every input's answer from the task's codec (``options``: its decode's), in input order."""
        decode = self.model.codec.decode
        return [
            decode(item, outputs, **options)
            for item, outputs in zip(self.encoded, self.outcome.outputs, strict=True)
        ]

    def explanations(self) -> list[Explanation]:
        return explanations(self.model, self.encoded, self.outcome)


Encode = Callable[[], Awaitable[list[Encoded]]]


async def run(
    ctx: InferenceContext, endpoint: str, model: ServedModel, body: InferenceOptions, encode: Encode
) -> Served:
    """The pipeline of every inference route: the request's budget (decided once, here:
    ``service.api.budget``), early shedding, ``encode()`` (the route's inputs to codec rows), inference,
    usage, metrics and headers."""
    asked = Asked.of(ctx.arrival, ctx.timeout_s, ctx.latency_target_s, body, ctx.query)
    budget = decide(ctx.settings, asked, model.manifest.default_rho)
    shed_early(ctx, model, budget)
    encoded = await encode()
    truncate = body.truncate if body.truncate is not None else ctx.query.truncate
    return Served(model, encoded, await infer(ctx, endpoint, model, encoded, truncate, budget))
