"""POST /summarize"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from retention_core.text import split_sentences
from service.api.deps import ExplainQueryDep, InferenceDep
from service.api.inference import explain_requested, explanations, infer, shed_early
from service.api.routers.common import ERROR_RESPONSES, serving
from service.api.schemas import SelectedSentence, SummarizeRequest, SummarizeResponse
from service.errors import InvalidRequest, PayloadTooLarge

SUMMARIZATION = "summarization"  # the task name in retention_core.tasks

router = APIRouter(tags=["inference"], route_class=serving(SUMMARIZATION))

MAX_SENTENCES = 2048


def document_sentences(body: SummarizeRequest) -> list[str]:
    """The client's sentences, or the server's rule-based split of ``text`` (``retention_core.text``).
    A text the splitter finds no sentence in (only whitespace, e.g. a no-break space) is one sentence:
    the schema accepts any non-empty text, so the server answers it (an empty summary) rather than
    refuse it."""
    if body.sentences is not None:
        return list(body.sentences)
    text = body.text or ""
    return split_sentences(text) or [text]


@router.post("/summarize", response_model=SummarizeResponse, responses=ERROR_RESPONSES)
async def summarize(body: SummarizeRequest, ctx: InferenceDep, explain: ExplainQueryDep) -> SummarizeResponse:
    """Extractive summary: the selected sentences in document order, with their scores. Choose the length
    with ``max_sentences`` or ``ratio`` (fraction of the document's sentences); default 3 sentences."""
    model = ctx.model_for(SUMMARIZATION)
    explained = explain_requested(model, body.explain, explain)
    shed_early(ctx, model, body)
    sentences = await run_in_threadpool(document_sentences, body)
    if not sentences:
        raise InvalidRequest("the document has no sentences")
    if len(sentences) > MAX_SENTENCES:
        raise PayloadTooLarge(f"at most {MAX_SENTENCES} sentences per request")
    codec = model.codec
    encoded = await run_in_threadpool(codec.encode, sentences)
    outcome = await infer(ctx, "summarize", model, [encoded], body)
    decoded = codec.decode(encoded, outcome.outputs[0], max_sentences=body.max_sentences, ratio=body.ratio)
    selected = sorted(
        (SelectedSentence.model_validate(s) for s in decoded["sentences"]), key=lambda s: s.index
    )
    return SummarizeResponse(
        model=model.name,
        summary=" ".join(s.text for s in selected),
        sentences=selected,
        usage=outcome.usage,
        explanations=explanations(model, [encoded], outcome) if explained else None,
    )
