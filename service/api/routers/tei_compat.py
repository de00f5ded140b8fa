"""Hugging Face text-embeddings-inference (TEI)'s API beside ours, so a TEI client works against this server
by changing only its URL: ``POST /embed`` reads TEI's body (``inputs``) as well as ours (``text`` /
``texts``), ``POST /`` is TEI's embed too (where ``InferenceClient(base_url=...).feature_extraction``
posts), ``GET /info`` and ``POST /tokenize`` answer in TEI's shapes. Mounted with the embedding task,
as OpenAI's /v1/embeddings (``service.api.app.inference_routers``).

rho, rho=auto, min_rho and max_latency_ms come as extra body fields or query parameters, as on every
inference route (``?rho=0.3`` in the client's URL is enough). Vectors go through the same pipeline
(``inference.run``: budget, shedding, batcher, usage, metrics, x-* headers); errors keep this server's
shape (``service.errors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Query, Request

from service.api.deps import ExplainQueryDep, InferenceContext, InferenceDep, ServerDep, SettingsDep
from service.api.faces import EMBEDDING, TaskFace, check_dimensions, encode_each, vectors
from service.api.inference import off_loop_if_long, run
from service.api.routers.common import ERROR_RESPONSES, TEI_ERROR_RESPONSES, serving
from service.api.routers.tasks import answer
from service.api.schemas import (
    EmbedBody,
    EmbedRequest,
    EmbedResponse,
    TEIEmbeddingModel,
    TEIEmbeddings,
    TEIEmbedRequest,
    TEIInfo,
    TEIModelType,
    TEIToken,
    TEITokenizeRequest,
)
from service.errors import InvalidRequest, PayloadTooLarge
from service.serving import ServedModel
from service.settings import Settings

TEI_EMBED_PATH = "/"  # TEI serves an embedding model's embed at its root too
ROOT_ENDPOINT = "root"  # that route's metrics label, as ``service.api.app.endpoint_label`` names it
TEI_DTYPES = {
    "fp32": "float32",
    "bf16": "bfloat16",
}  # this server's precision -> TEI's model_dtype (int8 stays int8)

INFO_QUERY = frozenset({"model"})  # /info's query parameters: anything else is refused, not ignored
ModelQuery = Annotated[str | None, Query(description="model name; default: the default embedding model")]

# POST / runs the embedding models (its metrics carry the task); /info and /tokenize run none.
embed_root = APIRouter(tags=["tei"], route_class=serving(EMBEDDING))
router = APIRouter(tags=["tei"])


# ------------------------------------------------------------------------------- embeddings
async def tei_vectors(body: TEIEmbedRequest, ctx: InferenceContext, endpoint: str) -> TEIEmbeddings:
    """The vectors of a TEI body: its inputs checked, the embedding model, ``dimensions`` checked before
    any inference, then ``inference.run`` as every inference route."""
    texts = body.texts()
    ctx.check_items(len(texts), param="inputs", limit=ctx.settings.max_embedding_inputs)
    model = ctx.model_for(EMBEDDING)
    check_dimensions(model, body.dimensions)
    served = await run(ctx, endpoint, model, body, lambda: encode_each(model.codec, [(t,) for t in texts]))
    return vectors(served, normalize=body.normalize)


def refuse_explain(explain: bool | None) -> None:
    """TEI's answer is a bare list of vectors: explanations have nowhere to go, so asking is a 422
    rather than silently answered without them."""
    if explain:
        raise InvalidRequest(
            "explain is not available with TEI's body ('inputs'): its answer is a bare list of vectors; "
            "send 'text' or 'texts' to get explanations",
            param="explain",
        )


def embed_router(face: TaskFace[EmbedRequest, EmbedResponse]) -> APIRouter:
    """``POST /embed`` in both shapes, in place of the generic task route (``tasks.task_router``): a body
    with ``inputs`` is TEI's (a bare list of vectors back), one with ``text`` / ``texts`` is ours
    (``tasks.answer``, unchanged); both or neither is a 422 (``schemas.EmbedBody``)."""
    router = APIRouter(tags=["inference"], route_class=serving(face.task))

    async def embed(body: EmbedBody, ctx: InferenceDep, explain: ExplainQueryDep) -> Any:
        if isinstance(body, TEIEmbedRequest):
            refuse_explain(explain)
            return await tei_vectors(body, ctx, face.endpoint)
        return await answer(face, body, ctx, explain)

    router.add_api_route(
        face.path,
        embed,
        methods=["POST"],
        name=face.endpoint,
        description=f"{face.description}\n\nTEI's body (`inputs`, `normalize`, ...) gets TEI's answer: "
        "a bare list of vectors.",
        response_model=EmbedResponse | TEIEmbeddings,
        responses=TEI_ERROR_RESPONSES,
    )
    return router


@embed_root.post(TEI_EMBED_PATH, response_model=TEIEmbeddings, responses=TEI_ERROR_RESPONSES)
async def tei_embed(body: TEIEmbedRequest, ctx: InferenceDep) -> TEIEmbeddings:
    """TEI's embed: one vector per input, in input order (normalised unless `normalize` is false)."""
    return await tei_vectors(body, ctx, ROOT_ENDPOINT)


# ------------------------------------------------------------------------------- /info
def tokenization_workers() -> int:
    """Threads that may tokenize at once: long inputs go to the thread pool (``off_loop_if_long``)."""
    return int(anyio.to_thread.current_default_thread_limiter().total_tokens)


def tei_info(model: ServedModel, settings: Settings, version: str) -> TEIInfo:
    manifest = model.manifest
    pooling = manifest.embedding.pooling if manifest.embedding is not None else "mean"
    return TEIInfo(
        model_id=model.name,
        model_dtype=TEI_DTYPES.get(model.precision, model.precision),
        served_model_name=model.name,
        model_type=TEIModelType(embedding=TEIEmbeddingModel(pooling=pooling)),
        max_concurrent_requests=settings.max_concurrent_requests,
        max_input_length=manifest.max_length,
        max_batch_tokens=settings.max_batch_tokens,
        max_client_batch_size=settings.max_embedding_inputs,
        auto_truncate=True,  # truncate left out: the head is kept (``inference.check_truncation``)
        tokenization_workers=tokenization_workers(),
        version=version,
    )


@router.get(
    "/info",
    response_model=TEIInfo,
    responses={status: ERROR_RESPONSES[status] for status in (401, 404, 422, 503)},
)
async def info(
    request: Request, server: ServerDep, settings: SettingsDep, model: ModelQuery = None
) -> TEIInfo:
    """TEI's model and router information, for the default embedding model (or `model`)."""
    unknown = sorted(set(request.query_params) - INFO_QUERY)
    if unknown:  # a typo (?models=...) would otherwise describe another model than the one asked for
        raise InvalidRequest(
            f"unknown query parameter(s) {unknown}; /info takes only 'model'", param=unknown[0]
        )
    return tei_info(server.resolve(model, EMBEDDING), settings, request.app.version)


# ------------------------------------------------------------------------------- /tokenize
def utf8_offsets(text: str) -> Sequence[int]:
    """Character index -> UTF-8 byte offset into ``text`` (TEI reports byte offsets; Python's tokenizer
    binding reports character offsets). The identity for ASCII text."""
    if text.isascii():
        return range(len(text) + 1)
    return list(accumulate((len(char.encode()) for char in text), initial=0))


def tei_tokens(text: str, encoding: Any) -> list[TEIToken]:
    """One input's tokens as TEI's SimpleToken: a special token carries its own text and no offsets,
    any other the input's text it covers."""
    at_byte = utf8_offsets(text)
    tokens = []
    for token_id, token, (start, end), special in zip(
        encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
    ):
        if special:
            tokens.append(TEIToken(id=token_id, text=token, special=True, start=None, stop=None))
        else:
            covered = text[start:end]
            tokens.append(
                TEIToken(id=token_id, text=covered, special=False, start=at_byte[start], stop=at_byte[end])
            )
    return tokens


@router.post("/tokenize", response_model=list[list[TEIToken]], responses=ERROR_RESPONSES)
async def tokenize(
    body: TEITokenizeRequest, server: ServerDep, settings: SettingsDep, model: ModelQuery = None
) -> list[list[TEIToken]]:
    """TEI's tokenize: every input's tokens (not cut to the model's max_length), in input order."""
    texts = body.texts()
    limit = settings.max_embedding_inputs
    if len(texts) > limit:
        raise PayloadTooLarge(f"at most {limit} items per request, got {len(texts)}", param="inputs")
    codec = server.resolve(model, EMBEDDING).codec

    def tokenized() -> list[list[TEIToken]]:
        return [tei_tokens(text, codec.tokens(text, body.add_special_tokens)) for text in texts]

    return await off_loop_if_long(sum(len(text) for text in texts), tokenized)
