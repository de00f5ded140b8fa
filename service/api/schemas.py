"""Request and response bodies (pydantic v2). Documented in OpenAPI at /docs."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainValidator,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema

from retention_core.rho import parse_rho
from service.serving import RhoReason

Rho = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
RhoOrAuto = Rho | Literal["auto"]
NonEmptyText = Annotated[str, Field(min_length=1)]

T = TypeVar("T")


class NotNull:
    """For ``X | None`` fields the client may leave out but not send as null: pydantic validates and
    documents them as plain ``X`` (no null in the OpenAPI schema, 422 for an explicit null); None is only
    the Python default of an omitted field. (``rho: null``, on the other hand, means "the default".)"""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        (inner,) = [arg for arg in get_args(source) if arg is not type(None)]
        return handler.generate_schema(inner)


Omittable = Annotated[T | None, NotNull()]


def whole_float_to_int(value: object) -> object:
    """JSON Schema counts 528.0 as an integer; strict pydantic would not: a ``BeforeValidator`` of counts.
    (The constraints come first: they must apply to the int itself to appear in the JSON schema.)"""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Constraints live inside the Omittable, on the non-null type, so the schema shows them as JSON Schema.
NonEmptyTexts = Annotated[list[NonEmptyText], Field(min_length=1)]


class InferenceOptions(BaseModel):
    """Options every inference body may carry; a body value wins over the same query parameter.

    Request bodies are strict (no "0" for false, no "3" for 3): the server accepts what the OpenAPI
    schema says, nothing it would have to guess. Subclasses inherit this config."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rho: RhoOrAuto | None = Field(
        default=None,
        description="kept fraction of real tokens at the last layer, in (0, 1], or 'auto'; "
        "default: the model's default_rho; 1 = exactly the dense model",
        examples=[0.3, "auto"],
    )
    min_rho: Rho | None = Field(default=None, description="rho=auto never goes below this")
    max_latency_ms: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="rho=auto: this request's latency target in milliseconds (capped by the server's "
        "max_latency_target_s); wins over the query parameter",
    )
    truncate: bool | None = Field(
        default=None, description="false: inputs longer than the model max are rejected with 413"
    )

    @field_validator("rho", mode="before")
    @classmethod
    def _rho(cls, value: object) -> object:
        return parse_rho(value, "rho", allow_auto=True, text_numbers=False)

    @field_validator("min_rho", mode="before")
    @classmethod
    def _min_rho(cls, value: object) -> object:
        return parse_rho(value, "min_rho", allow_auto=False, text_numbers=False)


class ExplainOptions(InferenceOptions):
    """Options of the routes that can explain: every task route (not /v1/embeddings)."""

    explain: bool | None = Field(
        default=None,
        description="true: add 'explanations', every input token's survival depth (layers it entered) "
        "with its character offsets into the input; a body value wins over the query parameter. "
        "Refused (422, explain_unavailable) for a model exported before the graph reported it",
    )


class TextsRequest(ExplainOptions):
    """One text (``text``) or several (``texts``): the body of /classify and /embed."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["texts"]}]}
    )
    text: Omittable[NonEmptyText] = None
    texts: Omittable[NonEmptyTexts] = None

    @model_validator(mode="after")
    def one_input(self) -> TextsRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("send exactly one of 'text' or 'texts'")
        return self

    def items(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class EmbedRequest(TextsRequest):
    normalize: bool | None = Field(
        default=None,
        description="L2-normalise the vectors; default: the model's (its sentence-transformers config)",
    )


def text_only(field: str) -> BeforeValidator:
    """OpenAI and TEI also take pre-tokenized input (lists of token ids); these models read text only,
    and the 422 says so (naming ``field``) rather than a bare type error."""

    def no_token_arrays(value: object) -> object:
        if isinstance(value, list) and any(isinstance(item, int | float | list) for item in value):
            raise ValueError(
                f"token arrays are not supported: send '{field}' as a string or a list of strings"
            )
        return value

    return BeforeValidator(no_token_arrays)


class OpenAIEmbeddingRequest(InferenceOptions):
    """OpenAI's embeddings body (``POST /v1/embeddings``), plus this server's rho options."""

    input: Annotated[NonEmptyText | NonEmptyTexts, text_only("input")] = Field(
        description="a text or a list of texts (token arrays are not supported)"
    )
    model: Omittable[str] = Field(
        default=None, description="served model name or alias; default: the default embedding model"
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: the little-endian float32 bytes of each vector"
    )
    dimensions: Omittable[Annotated[int, Field(ge=1), BeforeValidator(whole_float_to_int)]] = Field(
        default=None, description="must equal the model's vector size (no truncation of vectors)"
    )
    user: Omittable[str] = Field(default=None, description="accepted for compatibility, ignored")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


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
    min_kept_tokens: int = Field(
        default=0,
        description="the model's kept-token floor: every layer keeps at least min(this, a row's real "
        "tokens), so inputs at or under it run dense at any rho (0: no floor)",
    )
    rows_at_floor: int = Field(
        default=0,
        description="rows whose last layer kept exactly the floor, min(min_kept_tokens, real tokens): "
        "the floor, not rho, set how many of their tokens survived",
    )
    degraded: bool = Field(description="rho=auto served below its max_rho to hold the latency target")
    rho_reason: RhoReason = Field(
        default="requested",
        description="why rho_effective: the client's number, the model's default, or rho=auto at its "
        "max_rho (idle), lowered for the queued work (backlog) or at min_rho (floor)",
    )
    latency_target_s: float | None = Field(
        default=None, description="rho=auto: the latency target it was served under"
    )
    truncated: bool
    queue_time_s: float
    inference_time_s: float


class ExplainedToken(BaseModel):
    # A str, not a fixed list: each task's codec names the segments of its inputs, so a new task (a
    # reranker's "query" and "passages[0]", ...) needs no edit here.
    segment: str = Field(
        description="the input text the offsets index, named as the request body field it came from: "
        "'text' (/classify, /embed), 'question' or 'context' (/qa), 'NAME[i]' for item i of a list "
        "field; except 'document' (/summarize: the sentences joined by one space, see 'document')",
        examples=["text", "question", "context", "document", "passages[0]"],
    )
    start: int = Field(description="character offset of the token in its segment")
    end: int = Field(description="character offset just past the token")
    depth: int = Field(
        description="layers the token entered: 0 = dropped before the first layer, num_layers = never "
        "dropped; a token read by several windows reports its deepest"
    )


class Explanation(BaseModel):
    """One input's survival depths (``explain=true``). Special tokens ([CLS], [SEP]) are left out."""

    num_layers: int
    document: str | None = Field(default=None, description="/summarize: the text 'document' offsets index")
    tokens: list[ExplainedToken] = Field(description="the input's tokens in text order")


EXPLANATIONS_FIELD = Field(
    default=None, description="explain=true only: one per input, in input order (see Explanation)"
)


class EmbedResponse(BaseModel):
    model: str
    embedding: list[float] | None = Field(default=None, description="single 'text' requests only")
    embeddings: list[list[float]] = Field(description="one vector per input, in input order")
    usage: Usage
    explanations: list[Explanation] | None = EXPLANATIONS_FIELD


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of the little-endian float32 bytes")


class OpenAIUsage(Usage):
    """OpenAI's two counts plus this server's usage fields (what every inference response reports)."""

    prompt_tokens: int = Field(description="tokens the encoder read, after truncation (= processed_tokens)")
    total_tokens: int = Field(description="= prompt_tokens")


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class CudaGraphs(BaseModel):
    """A model's CUDA graphs (torch backend on a GPU): one per shape plan, replayed instead of launching
    every kernel of the forward."""

    limit: int = Field(
        description="graphs its cache keeps: RETENTION_MAX_CUDA_GRAPHS + those captured at load"
    )
    held: int = Field(description="graphs held now")
    planned_at_load: int = Field(
        description="plans of the server's runs (its batch and length buckets under "
        "RETENTION_MAX_BATCH_TOKENS, at default_rho and 1): what the load wanted captured"
    )
    captured_at_load: int = Field(
        description="of them, captured before any request: at most RETENTION_CUDA_GRAPHS_AT_LOAD, "
        "fewer while the device has under a quarter of its memory free"
    )
    load_stopped: str | None = Field(description="why the load captured fewer than planned; null: it did not")
    captured_on_request: int = Field(description="plans a request met first, captured on its path")
    capture_failures: int = Field(description="plans whose capture failed: they run eagerly, never retried")
    eager_runs: int = Field(description="runs of those plans, each answered eagerly")
    evictions: int = Field(description="graphs dropped from the full cache, least recently used first")


class ModelSummary(BaseModel):
    name: str
    task: str
    backbone: str
    precision: str
    default_rho: float = Field(description="rho of a request that sends none")
    default_rho_rule: str | None = Field(
        default=None, description="how the exporter chose default_rho; null for models exported before"
    )
    max_length: int
    labels: list[str]
    providers: list[str]
    backend: str = Field(default="onnxruntime", description="what runs it: onnxruntime or torch")
    device: str = Field(default="cpu", description="where it runs: cpu, cuda:0")
    cuda_graphs: CudaGraphs | None = Field(
        default=None,
        description="its CUDA graphs; null: none are captured (onnxruntime, the CPU, graphs off)",
    )
    pruned_branch_bytes: int | None = Field(
        default=None,
        description="bytes of the weights only rho < 1 runs, in the served variant (a two-path model: "
        "rho = 1 runs the original weights, rho < 1 a copy trained to work on fewer tokens); null: one set "
        "of weights serves every rho",
    )
    is_default: bool
    explain: bool = Field(
        default=False, description="its graph reports survival depth: explain=true is served"
    )
    route: str | None = Field(
        default=None, description="the POST route of its task ('/classify'); null: no route serves its task"
    )
    fields: list[str] = Field(
        default_factory=list,
        description="the request body fields of ONE input at that route (/classify: ['text']; /qa: "
        "['question', 'context']): what a client fills per input, e.g. from a batch row's columns",
    )
    list_fields: list[str] = Field(
        default_factory=list, description="those of 'fields' whose value is a list of texts"
    )


class ModelList(BaseModel):
    models: list[ModelSummary]
    aliases: dict[str, str]
    errors: dict[str, str] = Field(description="model directories that failed to load")


class ModelDetail(BaseModel):
    summary: ModelSummary
    manifest: dict[str, Any] = Field(description="manifest.json, including the quality-vs-rho curve")


class ScheduleCurve(BaseModel):
    """``GET /models/{name}/schedule``: the fraction of dense encoder token-work one row of ``length`` real
    tokens does at each ρ of ``rho``, as the model's graph keeps it (``retention_core.schedule``)."""

    length: int
    rho: list[float]
    token_work: list[float]


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


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error, authentication_error, rate_limit_error or server_error"
    )
    param: str | None = Field(description="the request field at fault, when one is")
    code: str | None = Field(description="this server's error code (model_not_found, invalid_request, ...)")


class OpenAIErrorBody(BaseModel):
    """Errors of the OpenAI-compatible routes (``/v1/...``), in OpenAI's shape."""

    error: OpenAIErrorDetail


# ------------------------------------------------------------ TEI (Hugging Face text-embeddings-inference)
# TEI's bodies and answers (field names and defaults of its docs/openapi.json), so its clients
# (huggingface_hub's InferenceClient) work by changing only the URL. Errors keep this server's shape
# (``service.errors``): a TEI client raises on the status either way.


def _keeps_the_head(value: object) -> object:
    """Every codec keeps an input's head (``retention_core.codecs.base.head_row``): TEI's
    ``truncation_direction: left`` (keep the tail) would be served wrong, so it is refused, clearly."""
    if isinstance(value, str) and value.lower() == "left":
        raise ValueError(
            "truncation_direction 'left' is not supported: a long input keeps its head (right truncation)"
        )
    return value


def _no_prompt(value: object) -> object:
    """TEI prepends a sentence-transformers prompt (``prompt_name``); these models carry none, and
    ignoring the name would return vectors of the wrong text, so only null is accepted."""
    if value is not None:
        raise ValueError(
            "prompt_name is not supported: the model has no sentence-transformers prompts; "
            "prepend the prompt's text to each input instead"
        )
    return value


TruncationDirection = Annotated[Literal["right", "Right"], BeforeValidator(_keeps_the_head)]
NoPrompt = Annotated[None, BeforeValidator(_no_prompt)]
TEIInputs = Annotated[NonEmptyText | NonEmptyTexts, text_only("inputs")]
PROMPT_FIELD = Field(
    default=None, description="null only: the models carry no prompts (prepend it to the text yourself)"
)


class TEIEmbedRequest(InferenceOptions):
    """TEI's ``POST /embed`` body (also served at ``POST /``, where TEI serves it), plus this server's rho
    options. ``truncate`` left out truncates, as TEI with ``--auto-truncate``."""

    inputs: TEIInputs = Field(description="a text or a list of texts (token arrays are not supported)")
    normalize: bool = Field(default=True, description="L2-normalise the vectors (TEI's default: true)")
    dimensions: Annotated[int, Field(ge=1), BeforeValidator(whole_float_to_int)] | None = Field(
        default=None, description="must equal the model's vector size, or null (no truncation of vectors)"
    )
    truncation_direction: TruncationDirection = Field(
        default="right", description="right only: a long input keeps its head"
    )
    prompt_name: NoPrompt = PROMPT_FIELD

    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)


def _embed_body(value: object) -> EmbedRequest | TEIEmbedRequest:
    """``POST /embed`` reads either shape: TEI's when the body has ``inputs``, this server's when it has
    ``text`` or ``texts``. Validated here rather than as a tagged union, whose errors would carry the
    tag in their location (``body.tei.inputs``): existing clients keep their error locations."""
    if isinstance(value, dict):
        tei, ours = "inputs" in value, "text" in value or "texts" in value
        if tei and ours:
            raise ValueError("send TEI's 'inputs' or this server's 'text' / 'texts', not both")
        if not (tei or ours):
            raise ValueError("send 'inputs' (TEI's body), or exactly one of 'text' or 'texts'")
        if tei:
            return TEIEmbedRequest.model_validate(value)
    return EmbedRequest.model_validate(value)


EmbedBody = Annotated[
    EmbedRequest | TEIEmbedRequest,
    PlainValidator(_embed_body, json_schema_input_type=EmbedRequest | TEIEmbedRequest),
]
TEIEmbeddings = list[list[float]]  # TEI's EmbedResponse: one vector per input, in input order


class TEITokenizeRequest(BaseModel):
    """TEI's ``POST /tokenize`` body."""

    model_config = ConfigDict(extra="forbid", strict=True)
    inputs: TEIInputs = Field(description="a text or a list of texts")
    add_special_tokens: bool = Field(default=True, description="add the template's [CLS] / [SEP]")
    prompt_name: NoPrompt = PROMPT_FIELD

    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)


class TEIToken(BaseModel):
    """One token, as TEI's ``SimpleToken``. Offsets are UTF-8 byte offsets into the input, as TEI's
    (equal to character offsets for ASCII text); a special token has none."""

    id: int
    text: str = Field(description="the input's bytes the token covers; a special token's own text")
    special: bool
    start: int | None = Field(description="byte offset of the token in the input (null: special)")
    stop: int | None = Field(description="byte offset just past the token (null: special)")


class TEIEmbeddingModel(BaseModel):
    pooling: str = Field(description="mean or cls")


class TEIModelType(BaseModel):
    embedding: TEIEmbeddingModel


class TEIInfo(BaseModel):
    """TEI's ``GET /info``: the fields this server can fill honestly, under TEI's names."""

    model_config = ConfigDict(protected_namespaces=())
    model_id: str = Field(description="the served model's name (what 'model' selects)")
    model_sha: str | None = None
    model_dtype: str = Field(description="float32, or int8 for a quantized graph")
    served_model_name: str
    model_type: TEIModelType
    max_concurrent_requests: int = Field(description="inference requests in the server at once (0: no cap)")
    max_input_length: int = Field(description="tokens the model reads; longer inputs are truncated")
    max_batch_tokens: int = Field(description="padded tokens per ONNX run")
    max_batch_requests: int | None = Field(default=None, description="null: batches are bounded by tokens")
    max_client_batch_size: int = Field(description="inputs per request (413 beyond)")
    auto_truncate: bool = Field(description="true: a request that sends no 'truncate' is truncated")
    tokenization_workers: int = Field(
        description="threads that tokenize long inputs (short ones are tokenized on the event loop)"
    )
    version: str = Field(description="this server's version")
    sha: str | None = None
    docker_label: str | None = None
