"""Service configuration: one ``Settings`` object, built once in ``create_app`` (env prefix ``RETENTION_``).

Nothing here reads the environment at import time; ``Settings()`` does, when it is constructed. What
only one backend reads lives with that backend: the ONNX Runtime backend's settings (``RETENTION_PRECISION``,
``INTER_OP_THREADS``, ``USE_CUDA``, ``CPU_MEM_ARENA``, ``ORT_MEM_PATTERN``) are
``service.backends.onnx_backend.OnnxSettings``, read from the same environment variables; given to
``Settings(...)`` as keywords (a test's, a Ray Serve config's ``args``) they are kept as its extra
fields and handed to that backend (``OnnxSettings.of``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from retention_core.contract import DEFAULT_MAX_WINDOWS


class Settings(BaseSettings):
    # extra="allow": keywords for a backend's own settings (``OnnxSettings.of`` reads them); the
    # environment's unknown RETENTION_* variables are not kept (the backend reads its own)
    model_config = SettingsConfigDict(env_prefix="RETENTION_", env_nested_delimiter="__", extra="allow")

    # ------------------------------------------------------------------ models
    models_dir: Path = Field(default=Path("models"), description="root holding one directory per model")
    default_models: dict[str, str] = Field(
        default_factory=dict, description="task -> model name; else the first model of that task (sorted)"
    )
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="CPU threads one run uses: onnxruntime's intra-op threads, torch's on the CPU (0 = the "
        "backend's default, one per core)",
    )
    backend: Literal["onnxruntime", "torch"] = Field(
        default="onnxruntime",
        description="what runs the models: onnxruntime (model.onnx; the CPU image) or torch (the model "
        "directory's weights.safetensors through the GPU-shaped forward; needs torch and safetensors)",
    )
    torch_device: str = Field(
        default="auto", description="torch backend: cuda:0, cpu, ... (auto: the first GPU, else the CPU)"
    )
    torch_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="torch backend: the encoder's dtype (auto: bfloat16 on a GPU, float32 on CPU)",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="torch backend on a GPU: capture one CUDA graph per shape plan on first use, replay it",
    )
    max_cuda_graphs: int = Field(
        default=64,
        ge=1,
        description="torch backend: captured graphs kept per model for the plans requests meet, beside "
        "those captured at load (least recently used go)",
    )
    cuda_graphs_at_load: int = Field(
        default=64,
        ge=0,
        description="torch backend on a GPU: graphs captured when a model loads, for the plans of the "
        "server's runs (its batch and length buckets under max_batch_tokens, at default rho and 1), "
        "fewest padded tokens first; fewer while the device has under a quarter of its memory free",
    )
    warmup: bool = True
    reload_interval_s: float = Field(
        default=0.0,
        ge=0.0,
        description="rescan models_dir this often and hot-load what changed, as SIGHUP does (0 = off)",
    )

    # ------------------------------------------------------------------ batching / backpressure
    max_batch_tokens: int = Field(default=8192, ge=1, description="padded tokens per backend run")
    max_batch_wait_ms: float = Field(default=2.0, ge=0.0, description="how long a batch waits to fill")
    max_queue_requests: int = Field(default=256, ge=1, description="requests waiting per model before 429")
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with 429")
    request_timeout_s: float = Field(default=30.0, gt=0.0, description="per-request deadline (504 past it)")
    max_body_bytes: int = Field(default=1_000_000, ge=1, description="request bodies larger than this: 413")
    max_windows: int = Field(
        default=DEFAULT_MAX_WINDOWS,
        ge=1,
        description="QA / summarization windows per input; more is truncated (or 413)",
    )
    max_items: int = Field(default=64, ge=1, description="texts / questions per request (413 beyond)")
    max_embedding_inputs: int = Field(
        default=2048,
        ge=1,
        description="texts per /embed, /v1/embeddings, TEI's / or /tokenize request (413 beyond; TEI's "
        "max_client_batch_size): OpenAI's limit; a large request is served across several batches, "
        "interleaved with the small ones",
    )
    admission_control: bool = Field(
        default=True,
        description="refuse (429) a request whose predicted completion misses its deadline or rho=auto "
        "target, instead of queueing it",
    )
    max_concurrent_requests: int = Field(
        default=0, ge=0, description="inference requests in the server at once before 429 (0 = no cap)"
    )
    early_refusal: bool = Field(
        default=True,
        description="decide a 429 from the path, query and headers before the body is read, when the "
        "work already queued would make even a minimal request late",
    )
    refusal_hold_s: float = Field(
        default=1.0,
        ge=0.0,
        description="hold a 429 open at least this long (never past its Retry-After) before answering it: "
        "slows clients that retry at once; costs a connection, not a core (0 = answer at once, no hold)",
    )
    max_held_refusals: int = Field(
        default=4096, ge=0, description="429s held open at once; beyond, they are answered at once"
    )
    refusal_retry_budget_per_s: float = Field(
        default=200.0,
        gt=0.0,
        description="under a retry storm every 429 is held long enough that the held clients come back "
        "at most this often a second in all (hold = refusals held now / this; Little's law), between "
        "refusal_hold_s and max_refusal_hold_s",
    )
    refusals_per_answer: float = Field(
        default=2.0,
        ge=0.0,
        description="the storm's retry budget also follows the server's speed: at most this many held "
        "clients' returns a second per request answered a second (measured), never above "
        "refusal_retry_budget_per_s nor below min_refusal_retry_budget_per_s; 0: the fixed budget only",
    )
    min_refusal_retry_budget_per_s: float = Field(
        default=10.0,
        gt=0.0,
        description="the storm's retry budget while few requests are answered (refusals_per_answer)",
    )
    max_refusal_hold_s: float = Field(
        default=8.0,
        ge=0.0,
        description="the longest a 429 is held under a storm (keep it under the clients' timeouts)",
    )
    refusal_connection_close: bool = Field(
        default=False,
        description="send 'Connection: close' with every 429 (measured once, loaded machine: unconfirmed)",
    )
    pad_multiple: int = Field(
        default=16,
        ge=1,
        description="padded row length is rounded up to a multiple of this: the backend sees few shapes "
        "(onnxruntime's memory arena stays flat under varied traffic); a backend that pads to buckets of "
        "its own (torch's CUDA graphs) uses those",
    )
    drain_timeout_s: float = Field(default=30.0, ge=0.0, description="graceful shutdown: wait for in-flight")

    # ------------------------------------------------------------------ rho=auto
    auto_latency_target_s: float = Field(
        default=0.25, gt=0.0, description="rho=auto holds this latency unless the request sets its own"
    )
    max_latency_target_s: float = Field(
        default=30.0,
        gt=0.0,
        description="cap of a request's own target (max_latency_ms)",
    )
    auto_min_rho: float = Field(
        default=0.1, gt=0.0, le=1.0, description="rho=auto's min_rho when the client sends none"
    )
    auto_max_rho: float = Field(default=1.0, gt=0.0, le=1.0, description="rho=auto without load")
    auto_tail_quantile: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="admission and the rho controller scale the cost model's predictions by this quantile "
        "of recent batches' actual/predicted ratios (higher: fewer late answers, more refusals)",
    )
    auto_late_after_targets: float = Field(
        default=0.0,
        ge=0.0,
        description="a rho=auto request still queued (none of it run) this many latency targets after it "
        "arrived is refused (429 late_queued, Retry-After) rather than answered late (0 = never)",
    )

    # ------------------------------------------------------------------ security
    api_key: SecretStr | None = Field(
        default=None, description="when set, every API call needs 'Bearer <key>' (not probes or /metrics)"
    )
    # Model control is off unless asked for (as in Triton): without this key the admin routes do not exist.
    admin_api_key: SecretStr | None = Field(
        default=None,
        description="when set, POST /admin/reload exists and needs 'Bearer <admin key>'; a separate key",
    )
    cors_origins: list[str] = Field(default_factory=list, description="CORS is off unless origins are listed")

    # ------------------------------------------------------------------ server (python -m service)
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
