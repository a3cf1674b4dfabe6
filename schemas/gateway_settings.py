"""GatewaySettings: the one settings object of ``embedgate gateway``.

Sources, highest priority first: environment variables (``EMBEDGATE_`` prefix, ``__`` between nested keys, e.g.
``EMBEDGATE_GRPC__KEEPALIVE_TIME_S=20``; ``EMBEDGATE_MODELS`` takes a JSON list), then the YAML file given to
``load_settings``, then the defaults below. Unknown keys and bad values are rejected when the settings are built,
i.e. at startup, with a message naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from schemas.cache_settings import CacheSettings, CoalesceSettings
from schemas.config_file import EnvOverFile, read_config
from schemas.deployment import DeployedModel, EmbeddingModel
from schemas.tls import BackendTLS, ServerTLS

__all__ = [
    "AdmissionSettings",
    "AuthSettings",
    "GatewaySettings",
    "GrpcSettings",
    "LimitsSettings",
    "LogSettings",
    "is_loopback",
    "load_settings",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GrpcSettings(_Strict):
    keepalive_time_s: float = Field(30.0, gt=0, description="send a keepalive ping after this idle time")
    keepalive_timeout_s: float = Field(
        10.0, gt=0, description="close the connection if a ping is not answered"
    )
    max_receive_message_bytes: int = Field(
        512 * 1024 * 1024, gt=0, le=2**31 - 1, description="largest backend response accepted"
    )
    max_reconnect_backoff_s: float = Field(
        2.0,
        gt=0,
        le=120,
        description="longest wait before a backend channel reconnects to a backend that went away (gRPC's own "
        "default grows to 120 s, so a PS replica restarted after a long outage was not seen for up to 2 minutes)",
    )
    max_send_message_bytes: int = Field(
        512 * 1024 * 1024, gt=0, le=2**31 - 1, description="largest request sent"
    )
    native_client: bool = Field(
        True,
        description="Predict calls to plaintext backends (the entry, the PS lookups, pass-through models) through "
        "the native HTTP/2 client instead of grpc.aio (when the native module is installed; TLS backends always "
        "use grpc.aio)",
    )
    replica_retry_s: float = Field(
        5.0, ge=0, description="a PS replica that answered UNAVAILABLE is skipped for this long"
    )
    position_poll_s: float = Field(
        1.0,
        ge=0,
        description="how often every PS replica's stream_position is read; a replica behind the others is read "
        "last (0 = never)",
    )


class LogSettings(_Strict):
    format: Literal["json", "text"] = "json"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    access: bool = Field(True, description="one log line per /v1 request (probes and /metrics excluded)")


class LimitsSettings(_Strict):
    """Bounds on what one client can make the gateway do (docs/security.md lists each with its answer)."""

    body_timeout_s: float = Field(
        10.0, gt=0, description="the whole request body must arrive within this many seconds (408 after)"
    )
    max_buffered_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="request body bytes held at once by all requests being read or processed (429 above)",
    )
    max_json_depth: int = Field(32, ge=2, le=512, description="deepest JSON nesting of a request body (400)")
    max_instances: int = Field(
        100_000, gt=0, description="instances / examples / columnar batch size of one request (413)"
    )
    max_ids_per_feature: int = Field(
        100_000, gt=0, description="values of one feature (or input) in one instance (413)"
    )
    max_decompression_ratio: int = Field(
        200,
        ge=1,
        description="a gzip/deflate body may inflate to at most this many times its compressed size, enforced "
        "once 1 MiB came out (413 above)",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="request line + headers (414 / 431 above; a head still incomplete past it: 400)",
    )
    max_headers: int = Field(100, gt=0, description="header fields of one request (431 above)")
    offload_bytes: int = Field(
        64 * 1024,
        ge=0,
        description="bodies at least this large are parsed on the parse threads, off the loop",
    )
    plain_offload_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="a gRPC PredictRequest of numeric tensors only (its parse is a few copies), and an embedding "
        "model's REST predict body the native one-pass parser answers, go to the parse threads from this size "
        "instead of offload_bytes: below it, the thread hops cost more than their work",
    )
    parse_threads: int = Field(2, gt=0, le=64, description="threads parsing large request bodies")
    parse_processes: int = Field(
        1,
        ge=0,
        le=64,
        description="worker processes parsing and typing large request bodies (0: on the parse threads only)",
    )
    http_parser: Literal["h11", "httptools"] = Field(
        "httptools",
        description="HTTP/1.1 parser: httptools (the gateway's protocol on uvicorn's httptools one: refusals under "
        "overload before the ASGI request) or h11 (pure Python); both bound max_header_bytes while reading headers",
    )


class AdmissionSettings(_Strict):
    """Admission control of both fronts (docs/gateway.md "Overload"): an adaptive concurrency limit under
    ``max_in_flight`` and a short wait queue bounded in length and in time. What cannot be admitted is answered at
    once with ``overload_status`` (429 / RESOURCE_EXHAUSTED)."""

    adaptive: bool = Field(
        True,
        description="adapt the concurrency limit to the measured latency (gradient on the minimum round trip); "
        "false: the limit is max_in_flight",
    )
    min_limit: int = Field(
        4, ge=1, description="the limit while the minimum round trip is measured (never above max_in_flight)"
    )
    floor_limit: int = Field(
        32,
        ge=1,
        description="the adapted limit never goes below this (nor below min_limit, nor above max_in_flight): under "
        "CPU contention every round trip grows, and the gradient alone would hold the limit below the concurrency "
        "the backends need to serve at capacity",
    )
    queue_timeout_s: float = Field(
        0.1,
        ge=0,
        le=60,
        description="a request may wait this long for a slot; it is shed after (0: no queue, refused at once)",
    )
    max_loop_lag_s: float = Field(
        0.25,
        ge=0,
        description="while the event loop runs this late in three measurements in a row (every 20 ms), new requests "
        "are refused at once (reason loop_lag); 0 = off",
    )
    max_queue: int = Field(
        64, ge=0, description="requests waiting for a slot at once; more are refused at once"
    )
    sample_window_s: float = Field(
        0.25, gt=0, le=60, description="the limit is recomputed from the round trips of each window this long"
    )
    min_samples: int = Field(16, ge=1, description="a window closes only once it holds this many round trips")
    rtt_tolerance: float = Field(
        0.5,
        ge=0,
        le=10,
        description="round trips up to (1 + rtt_tolerance) x the minimum count as unloaded (the limit grows)",
    )
    rtt_budget_s: float = Field(
        0.1,
        ge=0,
        le=60,
        description="round trips up to this long also count as unloaded: the limit shrinks only when a window's median "
        "round trip is above both this and (1 + rtt_tolerance) x the minimum (0: the minimum alone decides)",
    )
    min_rtt_interval_s: float = Field(
        30.0,
        gt=0,
        description="how often the minimum round trip is measured again while the limit is reached and a new one "
        "could change the target (the limit is held at min_limit meanwhile)",
    )
    min_rtt_samples: int = Field(
        24, ge=1, description="round trips at min_limit whose median is the minimum round trip"
    )
    max_measure_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="a measurement of the minimum round trip ends after this long with the samples it has (at least "
        "one): under contention round trips are long, and the limit held at min_limit for min_rtt_samples of them "
        "refused nearly everything for seconds",
    )
    switch_interval_s: float = Field(
        0.0005,
        ge=0,
        le=0.1,
        description="CPython's thread switch interval (sys.setswitchinterval) in a gateway process with a gRPC front: "
        "how long the gRPC front's thread may wait for the interpreter while the gateway's loop runs; with Python's "
        "default (0.005) it takes at most about 250 calls/s under load; 0 = leave Python's default",
    )


class AuthSettings(_Strict):
    tokens_file: Path | None = Field(
        None, description="bearer tokens, one per line: `<token> [model,model...]` (docs/security.md)"
    )
    allow_unauthenticated: bool = Field(
        False, description="serve without tokens on a non-loopback host (only behind an authenticating proxy)"
    )


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    return host in _LOOPBACK or host.startswith("127.")


class GatewaySettings(EnvOverFile):
    model_config = SettingsConfigDict(
        env_prefix="EMBEDGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = Field("127.0.0.1", description="interface uvicorn binds")
    port: int = Field(8501, ge=0, le=65535, description="REST port (TF Serving's default REST port is 8501)")
    grpc_port: int = Field(
        0, ge=0, le=65535, description="gRPC port of TF Serving's gRPC API (TF Serving uses 8500); 0 = off"
    )
    grpc_front: Literal["gate", "python"] = Field(
        "gate",
        description="what listens on grpc_port: 'gate', the native gRPC gate (embedgate_native, a thread of its "
        "own: refuses overload without Python and relays every other call to the Python front on a private Unix "
        "socket); 'python', the Python front itself (grpc.aio)",
    )
    rest_front: Literal["gate", "python"] = Field(
        "gate",
        description="what listens on port: 'gate', the native REST gate (embedgate_native, a thread of its own: "
        "answers the overload 429s without Python and relays every other request to uvicorn on a private Unix "
        "socket), where it can (the native path on, no tls, workers 1; else uvicorn listens); 'python', uvicorn "
        "with the gateway's HTTP protocol",
    )
    grpc_direct: bool = Field(
        True,
        description="with grpc_front 'gate': calls to TF Serving's services (uncompressed) are received whole by "
        "the gate, off the interpreter lock and only with a known token, and answered on the gateway's loop without "
        "the Python gRPC server; false relays them to it too",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="gateway processes sharing the port (uvicorn's supervisor; /metrics aggregates them all)",
    )
    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio",
        description="event loop of the REST and ops ports and the gateway core (uvloop: libuv, a cheaper turn of "
        "the loop per request; the gRPC front keeps its own asyncio loop)",
    )
    malloc_mmap_threshold_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        le=32 * 1024 * 1024,
        description="glibc malloc, set when the process starts: blocks above this many bytes are mmap'ed, smaller "
        "ones come from the heap and are reused (trim threshold twice it), so a request's buffers (its body, the "
        "entry request, the rows read) are not faulted in afresh on every request; 0 = glibc's dynamic thresholds; "
        "MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment win",
    )
    malloc_trim_interval_s: float = Field(
        2.0,
        ge=0,
        description="every this many seconds, return the free memory of glibc's malloc arenas to the OS "
        "(malloc_trim(0), on a worker thread); 0 = never",
    )
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="deadline of one REST request; every backend call gets the time left (504 after)",
    )
    max_in_flight: int = Field(
        256, gt=0, description="requests processed at once; more are refused, not queued"
    )
    overload_status: Literal[429, 503] = Field(429, description="HTTP status when max_in_flight is reached")
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds sent with 429/503 overload answers")
    max_body_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="largest request body (after gunzip); 400 above"
    )
    metadata_ttl_s: float = Field(
        60.0,
        ge=0,
        description="signature metadata cache lifetime; also refreshed when the served version changes",
    )
    manifest_poll_s: float = Field(
        5.0,
        ge=0,
        description="re-read each embedding model's manifest.json this often when it changed (seconds); 0 = off",
    )
    health_poll_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="how often the gateway probes every backend for /readyz and gRPC Health (one GetModelStatus "
        "per backend servable per poll; probes never run per request)",
    )
    grpc: GrpcSettings = GrpcSettings()
    tls: ServerTLS | None = Field(None, description="TLS on the REST port (https; mTLS with client_ca_file)")
    backend_tls: BackendTLS | None = Field(None, description="TLS/mTLS on every gRPC channel to backends")
    log: LogSettings = LogSettings()
    cache: CacheSettings = CacheSettings()
    coalesce: CoalesceSettings = CoalesceSettings()
    docs: bool = Field(True, description="serve OpenAPI at /docs and /openapi.json")
    limits: LimitsSettings = LimitsSettings()
    auth: AuthSettings = AuthSettings()
    admission: AdmissionSettings = AdmissionSettings()
    ops_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve /metrics, /readyz details and /docs on this port only (public port: /v1 and probes)",
    )
    ops_host: str | None = Field(None, description="interface of the ops port (default: host)")
    models: list[DeployedModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_models(self) -> GatewaySettings:
        seen: set[str] = set()
        ps_names: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"model {m.name!r} is configured twice")
            seen.add(m.name)
            if isinstance(m, EmbeddingModel):
                ps_names.update(m.served_ps_name(i) for i in range(len(m.shards)))
        for m in self.models:
            served = m.served_name if not isinstance(m, EmbeddingModel) else m.served_entry_name
            if m.name in ps_names or served in ps_names:
                raise ValueError(
                    f"model {m.name!r} would expose a PS servable; PS servables are never reachable"
                )
        return self


def load_settings(path: str | Path | None = None, **overrides: Any) -> GatewaySettings:
    """Settings from a YAML file (relative manifest paths resolve against the file's directory) + env."""
    data: dict[str, Any] = read_config(path, "gateway config") if path is not None else {}
    data.update(overrides)
    return GatewaySettings(**data)
