"""Request and response bodies (pydantic v2). Documented in OpenAPI at /docs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.rho import parse_rho

Rho = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
RhoOrAuto = Rho | Literal["auto"]
NonEmptyText = Annotated[str, Field(min_length=1)]


class InferenceOptions(BaseModel):
    """Options every inference body may carry; a body value wins over the same query parameter."""

    model_config = ConfigDict(extra="forbid")
    rho: RhoOrAuto | None = Field(
        default=None,
        description="kept fraction of real tokens at the last layer, in (0, 1], or 'auto'; "
        "default: the model's default_rho; 1 = exactly the dense model",
        examples=[0.3, "auto"],
    )
    min_rho: Rho | None = Field(default=None, description="rho=auto never goes below this")
    truncate: bool | None = Field(
        default=None, description="false: inputs longer than the model max are rejected with 413"
    )

    @field_validator("rho", mode="before")
    @classmethod
    def _rho(cls, value: object) -> object:
        return parse_rho(value, "rho", allow_auto=True)

    @field_validator("min_rho", mode="before")
    @classmethod
    def _min_rho(cls, value: object) -> object:
        return parse_rho(value, "min_rho", allow_auto=False)


class ClassifyRequest(InferenceOptions):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["texts"]}]}
    )
    text: NonEmptyText | None = None
    texts: list[NonEmptyText] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def one_input(self) -> ClassifyRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("send exactly one of 'text' or 'texts'")
        return self

    def items(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: NonEmptyText
    context: NonEmptyText


class QARequest(InferenceOptions):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["question", "context"]}, {"required": ["items"]}]},
    )
    question: NonEmptyText | None = None
    context: NonEmptyText | None = None
    items: list[QAItem] | None = Field(default=None, min_length=1, description="several (question, context)")

    @model_validator(mode="after")
    def one_input(self) -> QARequest:
        single = self.question is not None or self.context is not None
        if single == (self.items is not None):
            raise ValueError("send either 'question' and 'context', or 'items'")
        if single and (self.question is None or self.context is None):
            raise ValueError("'question' and 'context' go together")
        return self

    def pairs(self) -> list[QAItem]:
        if self.items is not None:
            return list(self.items)
        return [QAItem(question=self.question or "", context=self.context or "")]


class SummarizeRequest(InferenceOptions):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["text"]}, {"required": ["sentences"]}],
            "not": {"required": ["max_sentences", "ratio"]},
        },
    )
    text: NonEmptyText | None = None
    sentences: list[NonEmptyText] | None = Field(default=None, min_length=1)
    max_sentences: int | None = Field(default=None, ge=1, le=1000)
    ratio: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def one_input(self) -> SummarizeRequest:
        if (self.text is None) == (self.sentences is None):
            raise ValueError("send exactly one of 'text' or 'sentences'")
        if self.max_sentences is not None and self.ratio is not None:
            raise ValueError("send at most one of 'max_sentences' or 'ratio'")
        return self


class Usage(BaseModel):
    input_tokens: int = Field(description="real tokens of the input(s), before truncation")
    processed_tokens: int = Field(description="real tokens that entered the encoder (all rows)")
    rows: int = Field(description="graph rows (windows) the input became")
    num_layers: int
    kept_tokens_per_layer: list[int] = Field(description="tokens entering each layer, summed over rows")
    token_work_fraction: float = Field(
        description="encoder token-work done / dense token-work (processed_tokens x num_layers); "
        "the last layer counts manifest.schedule.last_layer_queries queries when set"
    )
    rho_requested: float | Literal["auto"] | None
    rho_effective: float
    min_rho: float | None = None
    degraded: bool = Field(description="rho=auto served below its ceiling to hold the latency target")
    truncated: bool
    queue_time_s: float
    inference_time_s: float


class ClassificationResult(BaseModel):
    label: str
    scores: dict[str, float]


class ClassifyResponse(BaseModel):
    model: str
    label: str | None = Field(default=None, description="single 'text' requests only")
    scores: dict[str, float] | None = Field(default=None, description="single 'text' requests only")
    results: list[ClassificationResult]
    usage: Usage


class QAResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    answer: str
    start: int = Field(description="character offset of the answer in the context")
    end: int = Field(description="character offset just past the answer")
    score: float


class QAResponse(BaseModel):
    model: str
    answer: str | None = None
    start: int | None = None
    end: int | None = None
    score: float | None = None
    results: list[QAResult]
    usage: Usage


class SelectedSentence(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = Field(description="position of the sentence in the document")
    text: str
    score: float


class SummarizeResponse(BaseModel):
    model: str
    summary: str
    sentences: list[SelectedSentence] = Field(description="selected sentences in document order")
    usage: Usage


class ModelSummary(BaseModel):
    name: str
    task: str
    backbone: str
    precision: str
    default_rho: float
    max_length: int
    labels: list[str]
    providers: list[str]
    is_default: bool


class ModelList(BaseModel):
    models: list[ModelSummary]
    aliases: dict[str, str]
    errors: dict[str, str] = Field(description="model directories that failed to load")


class ModelDetail(BaseModel):
    summary: ModelSummary
    manifest: dict[str, Any] = Field(description="manifest.json, including the quality-vs-rho curve")


class ReloadResponse(BaseModel):
    status: Literal["ok", "partial"]
    loaded: list[str]
    unchanged: list[str]
    removed: list[str]
    errors: dict[str, str]


class Health(BaseModel):
    status: str
    models: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict)


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorDetail
