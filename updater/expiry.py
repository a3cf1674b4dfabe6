"""Expiring rows: call every PS replica's ``expire`` signature on a schedule, for models with a table that has ``ttl_s``.

The PS does the work (:mod:`embedgate.export.slab`): ``expire(now_ms)`` removes the rows of each table with
``ttl_s`` whose newest write is older than ``now_ms - ttl_s * 1000`` and leaves a tombstone, so a late, older message
cannot bring one back. The updater only supplies the clock (its wall clock, in ms, like producer timestamps) and the
schedule (``UpdaterSettings.expire_interval_s``), and counts what each shard removed.

:class:`Expirer` owns one ``grpc.aio`` channel per target (closed by :meth:`Expirer.close`). A replica that fails is
logged and counted (``embedgate_updater_expire_failures_total``) and tried again next round; every replica of a shard
is called, since each one expires its own copy. Task-safe within one event loop.

Metrics (on the updater's registry): ``embedgate_updater_rows_expired_total`` {model, table}: rows removed, the
largest count among a shard's replicas summed over shards; ``embedgate_updater_expire_failures_total`` {model,
shard}: failed ``expire`` calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import grpc
import grpc.aio
import numpy as np
from prometheus_client import CollectorRegistry, Counter

from schemas.manifest import EXPIRE_SIGNATURE, expire_count_output
from schemas.proto import tfs_pb2
from schemas.tensors import TensorError, from_ndarray, to_ndarray
from schemas.tls import BackendTLS
from tfs_grpc.channels import ChannelConfig, channel_credentials, open_channel, stub
from updater.ingest import Route

__all__ = ["Expirer", "expiring_tables"]

log = logging.getLogger(__name__)
_CHANNEL = ChannelConfig(reconnect_backoff_ms=100, max_reconnect_backoff_ms=1000)


def expiring_tables(route: Route) -> list[str]:
    """The tables of ``route``'s manifest that have a ``ttl_s`` (its PS shards then answer ``expire``)."""
    return [t.name for t in route.manifest.tables if t.ttl_s is not None]


class Expirer:
    """Calls ``expire`` on every replica of every shard of the ``routes`` that have expiring tables."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        registry: CollectorRegistry,
        deadline_s: float = 30.0,
        tls: BackendTLS | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._routes = {name: r for name, r in routes.items() if expiring_tables(r)}
        self._deadline_s = deadline_s
        self._tls = tls
        self._credentials = channel_credentials(tls) if tls is not None else None
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        p = "embedgate_updater_"
        self.rows_expired = Counter(
            p + "rows_expired",
            "Rows removed by the PS expire signature (ttl_s)",
            ["model", "table"],
            registry=registry,
        )
        self.failures = Counter(
            p + "expire_failures",
            "Failed expire calls to a PS replica",
            ["model", "shard"],
            registry=registry,
        )

    @property
    def active(self) -> bool:
        """Whether any configured model has an expiring table."""
        return bool(self._routes)

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """Expire every ``interval_s`` seconds (the first round after one interval) until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
                return
            except TimeoutError:
                pass
            await self.expire_once()

    async def expire_once(self) -> dict[tuple[str, str], int]:
        """One round over every replica; ``{(model, table): rows removed}`` (max over a shard's replicas, summed)."""
        now_ms = int(self._clock() * 1000)
        totals: dict[tuple[str, str], int] = {}
        for name, route in self._routes.items():
            tables = [t.name for t in route.manifest.tables]
            for shard, targets in enumerate(route.config.shards):
                served = route.config.served_ps_name(shard)
                answers = await asyncio.gather(
                    *(self._expire(t, served, now_ms, tables) for t in targets.replicas)
                )
                for table in tables:
                    counts = [a[table] for a in answers if a is not None]
                    if counts:
                        totals[(name, table)] = totals.get((name, table), 0) + max(counts)
                for a in answers:
                    if a is None:
                        self.failures.labels(name, str(shard)).inc()
        for (model, table), n in totals.items():
            self.rows_expired.labels(model, table).inc(n)
        return totals

    async def _expire(
        self, target: str, served: str, now_ms: int, tables: list[str]
    ) -> dict[str, int] | None:
        req = tfs_pb2.PredictRequest(
            model_spec=tfs_pb2.ModelSpec(name=served, signature_name=EXPIRE_SIGNATURE)
        )
        req.inputs["now_ms"].CopyFrom(from_ndarray(np.asarray(now_ms, np.int64)))
        try:
            resp = await self._call(target)(req.SerializeToString(), timeout=self._deadline_s)
            return {t: int(to_ndarray(resp.outputs[expire_count_output(t)])) for t in tables}
        except (grpc.aio.AioRpcError, TensorError, KeyError) as exc:
            log.warning("expire on %s at %s failed: %s", served, target, exc)
            return None

    def _call(self, target: str) -> grpc.aio.UnaryUnaryMultiCallable:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = open_channel(target, _CHANNEL, self._tls, self._credentials)
        return stub(channel, "Predict", serialized=True)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()
