"""``UpdaterSettings``: everything ``embedgate updater`` reads at startup, from YAML plus ``EMBEDGATE_`` env vars.

Precedence: environment over YAML over defaults. Nested keys use ``__``: ``EMBEDGATE_BATCH__MAX_ROWS=1024``,
``EMBEDGATE_RETRY__MAX_BACKOFF_MS=2000``; lists/objects take JSON: ``EMBEDGATE_TOPICS='["a","b"]'``.
``models:`` is the gateway's model list (:mod:`schemas.deployment`); the updater uses its ``embedding`` entries and
ignores ``passthrough`` ones. Bad values are rejected at startup.

Kafka security uses flat keys named as Kafka's client settings (:class:`schemas.tls.KafkaSecurityFields`):
``security_protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl_mechanism`` (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512), ``sasl_username``, ``sasl_password`` or ``sasl_password_file``, ``ssl_cafile``, ``ssl_certfile``,
``ssl_keyfile``; they apply to the consumer, the dead-letter producer and the admin client. ``backend_tls``
(:class:`schemas.tls.BackendTLS`) secures the gRPC channels to the PS replicas.

``replay_since`` (:func:`parse_replay_since`) makes the updater seek back to a point in time on its first partition
assignment, e.g. to restore rows a restarted PS replica lost (``embedgate updater --replay-since`` overrides it).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from schemas.config_file import EnvOverFile, read_config
from schemas.deltas import DEAD_LETTER_TOPIC, delta_topic
from schemas.deployment import DeployedModel, EmbeddingModel
from schemas.tls import BackendTLS, KafkaSecurityFields

__all__ = ["BatchSettings", "RetrySettings", "UpdaterSettings", "parse_replay_since"]

_REPLAY_EXPORT = "export"
_AUTO = "auto"
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_replay_since(value: str, *, now: float) -> float | None:
    """Epoch seconds of a ``replay_since`` value, or None for ``export`` (the updater resolves that from the PS
    artifacts). Accepted: an ISO-8601 timestamp (``2026-11-22T04:00:00Z``; without an offset it is UTC) or a
    duration before ``now`` (``90s``, ``15m``, ``2h``, ``1d``). ValueError naming the value otherwise."""
    text = value.strip()
    if text == _REPLAY_EXPORT:
        return None
    if m := _DURATION_RE.match(text):
        return now - float(m.group(1)) * _DURATION_S[m.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"replay_since {value!r} is not an ISO-8601 timestamp (2026-11-22T04:00:00Z), "
            "a duration ago (90s, 15m, 2h, 1d) or 'export'"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp()
    if seconds < 0:
        raise ValueError(f"replay_since {value!r} is before 1970-01-01")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchSettings(_Strict):
    max_messages: int = Field(1024, gt=0, description="Kafka messages gathered before a batch is applied")
    max_delay_ms: int = Field(
        20, ge=0, le=60_000, description="longest a batch waits to fill once it has a record"
    )
    max_rows_per_call: int = Field(
        16384, gt=0, description="rows per Predict call (large groups are chunked)"
    )


class RetrySettings(_Strict):
    min_backoff_ms: int = Field(100, gt=0, description="first wait before retrying a failed shard write")
    max_backoff_ms: int = Field(5000, gt=0, description="cap of the exponential backoff")

    @model_validator(mode="after")
    def _order(self) -> RetrySettings:
        if self.max_backoff_ms < self.min_backoff_ms:
            raise ValueError("retry.max_backoff_ms must be >= retry.min_backoff_ms")
        return self


class UpdaterSettings(EnvOverFile, KafkaSecurityFields):
    model_config = SettingsConfigDict(
        env_prefix="EMBEDGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    models: list[DeployedModel] = Field(min_length=1)
    bootstrap_servers: str = Field("127.0.0.1:9092", description="comma-separated host:port list")
    topics: list[str] | None = Field(
        None, description="embedgate delta topics; null = one per model, embedgate.deltas.<model>"
    )
    hps_topic_pattern: str | None = Field(
        _AUTO, description="regex of HPS topics; auto = hps_et.<model>.* of the configured models; null = off"
    )
    group_id: str | None = Field(
        None, description="consumer group; null = embedgate-updater.<sorted model names joined by '.'>"
    )
    client_id: str = "embedgate-updater"
    dead_letter_topic: str = DEAD_LETTER_TOPIC
    create_topics: bool = Field(
        True, description="create topics and the dead-letter topic at startup if missing"
    )
    topic_partitions: int = Field(
        4, gt=0, description="partitions of topics the updater creates (at least the largest shard count)"
    )
    topic_replication_factor: int = Field(
        1, gt=0, description="replication factor of topics the updater creates"
    )
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(1000, ge=100)
    metadata_max_age_ms: int = Field(5000, ge=1000, description="how soon new HPS topics are discovered")
    batch: BatchSettings = BatchSettings()
    retry: RetrySettings = RetrySettings()
    apply_deadline_s: float = Field(5.0, gt=0, description="deadline of each Predict write call")
    backend_tls: BackendTLS | None = Field(None, description="TLS/mTLS on the gRPC channels to PS replicas")
    metrics_port: int = Field(9464, ge=0, le=65535, description="Prometheus /metrics port; 0 = off")
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"
    expire_interval_s: float = Field(
        60.0,
        ge=0,
        description="seconds between calls of the PS expire signature on every replica of models with a ttl_s "
        "table (updater.expiry); 0 = never",
    )
    replay_since: str | None = Field(
        None,
        description="on the first partition assignment, seek back to this time: ISO-8601, 15m/2h/90s ago, or export",
    )

    @field_validator("replay_since")
    @classmethod
    def _replay_since(cls, value: str | None) -> str | None:
        if value is not None:
            parse_replay_since(value, now=time.time())
            value = value.strip()
        return value

    @model_validator(mode="after")
    def _check(self) -> UpdaterSettings:
        if not self.embedding_models:
            raise ValueError("models: no embedding model configured; the updater has nothing to write to")
        if not self.delta_topics and not self.hps_pattern:
            raise ValueError("topics is empty and hps_topic_pattern is off: nothing to consume")
        if self.dead_letter_topic in self.delta_topics:
            raise ValueError(f"dead_letter_topic {self.dead_letter_topic!r} must not be one of topics")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("a model is configured twice")
        return self

    @property
    def embedding_models(self) -> list[EmbeddingModel]:
        return [m for m in self.models if isinstance(m, EmbeddingModel)]

    @property
    def delta_topics(self) -> list[str]:
        """``topics``, or by default each embedding model's own topic ``embedgate.deltas.<model>``."""
        if self.topics is not None:
            return list(self.topics)
        return [delta_topic(m.name) for m in self.embedding_models]

    @property
    def hps_pattern(self) -> str | None:
        """The HPS topic regex in effect: ``auto`` = ``hps_et\\.(<m1>|<m2>...)\\..*`` over the embedding models."""
        if self.hps_topic_pattern != _AUTO:
            return self.hps_topic_pattern
        names = "|".join(re.escape(m.name) for m in self.embedding_models)
        return rf"hps_et\.(?:{names})\..*"

    @property
    def consumer_group(self) -> str:
        """``group_id``, or by default one derived from the served models: deployments serving different model
        lists never share a group (and so never split each other's partitions)."""
        if self.group_id is not None:
            return self.group_id
        return "embedgate-updater." + ".".join(sorted(m.name for m in self.embedding_models))

    @classmethod
    def from_yaml(cls, path: str | Path) -> UpdaterSettings:
        """Read ``path`` (YAML mapping), apply ``EMBEDGATE_`` env overrides, validate."""
        return cls(**read_config(path, "updater config"))
