"""CacheSettings: the gateway's hot-row cache and its delta stream consumer (``cache:`` in the gateway config);
CoalesceSettings: coalescing of concurrent embedding requests (``coalesce:``).

The stream settings mirror the updater's (``schemas/updater_settings.py``): point both at the same broker and
topics. The gateway's consumer has no group (it never commits and never disturbs the updater's group).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.deltas import HPS_TOPIC_PATTERN

__all__ = ["CacheSettings", "CoalesceSettings"]


class CacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: int = Field(
        0, ge=0, description="bytes of rows cached per embedding model (4 * dim + 320 per row); 0 = cache off"
    )
    max_lag_s: float = Field(
        5.0,
        gt=0,
        description="the cache stops serving while the delta stream is this far behind or unreachable",
    )
    settle_s: float = Field(
        5.0,
        ge=0,
        description="a row updated by a delta in the last settle_s seconds is not filled from the PS "
        "(bound on the updater's publish -> PS write delay)",
    )
    expiry_margin_s: float = Field(
        60.0,
        ge=0,
        description="tables with ttl_s: a cached row is dropped this long before its ttl runs out (bound on the "
        "clock difference between the gateway and the updater that calls the PS expire signature)",
    )
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma-separated)"
    )
    topics: list[str] | None = Field(
        None,
        description="embedgate delta topics; null = each embedding model's own topic embedgate.deltas.<model> "
        "(the updater's default)",
    )
    hps_topic_pattern: str | None = Field(HPS_TOPIC_PATTERN, description="regex of HPS topics; null = off")
    metadata_max_age_ms: int = Field(5000, ge=1000, description="how soon new HPS topics are discovered")

    @model_validator(mode="after")
    def _check(self) -> CacheSettings:
        if self.max_bytes and self.topics == [] and not self.hps_topic_pattern:
            raise ValueError(
                "cache.topics is empty and cache.hps_topic_pattern is off: nothing keeps the cache fresh"
            )
        return self


class CoalesceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_delay_ms: float = Field(
        2.0,
        ge=0,
        description="longest wait of a request for others to share its lookups and entry call; 0 = off",
    )
    max_batch: int = Field(512, gt=0, description="examples per coalesced call; a full group is sent at once")
