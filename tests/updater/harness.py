"""Shared pieces of the updater's integration tests: settings for a test, the updater running in the test's event
loop, a bounded async poll, and the demo row a test publishes to move one prediction."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from asyncio import sslproto
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from schemas.manifest import FeatureKind, Manifest, SparseFeatureSpec, TableSpec
from schemas.updater_settings import UpdaterSettings
from tests.support.kafka import Broker
from tests.updater.conftest import PsCluster
from updater.consumer import Updater

__all__ = [
    "DemoRow",
    "demo_row",
    "eventually",
    "predict_one",
    "running",
    "tls_closes_settled",
    "updater_settings",
]


def updater_settings(kafka: Broker, cluster: PsCluster | None, name: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "models": [cluster.model_config()] if cluster is not None else [],
        "bootstrap_servers": kafka.bootstrap,
        "topics": [f"{name}.deltas"],
        "dead_letter_topic": f"{name}.dlq",
        "hps_topic_pattern": None,
        "group_id": f"{name}-group",
        "client_id": f"{name}-updater",
        "session_timeout_ms": 3000,
        "heartbeat_interval_ms": 300,
        "metrics_port": 0,
        "batch": {"max_messages": 512, "max_delay_ms": 10},
        "retry": {"min_backoff_ms": 100, "max_backoff_ms": 1000},
        "apply_deadline_s": 3.0,
    }
    base.update(over)
    return base


@contextlib.asynccontextmanager
async def running(settings: dict[str, Any]) -> AsyncIterator[Updater]:
    """The updater in this event loop; stopped gracefully (and awaited, bounded) at exit."""
    upd = Updater(UpdaterSettings(**settings))
    task = asyncio.create_task(upd.run())
    ready = asyncio.create_task(upd.ready.wait())
    try:
        await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the updater failed while starting: raise its error here
        assert ready.done(), "updater not ready within 30 s"
        yield upd
    finally:
        ready.cancel()
        upd.stop()
        await asyncio.wait_for(task, 30)
        await tls_closes_settled()


def _closing_tls_connections() -> int:
    """TLS connections in this process that were closed but whose socket is still open (the TLS shutdown exchange
    with the peer is in flight). asyncio has no public view of this, hence the private fields (test code only)."""
    closing = (
        sslproto.SSLProtocolState.FLUSHING,
        sslproto.SSLProtocolState.SHUTDOWN,
        sslproto.SSLProtocolState.UNWRAPPED,
    )
    return len(
        [
            o
            for o in gc.get_objects()
            if isinstance(o, sslproto.SSLProtocol)
            and o._transport is not None
            and getattr(o, "_state", None) in closing
        ]
    )


async def tls_closes_settled(timeout_s: float = 40.0) -> None:
    """Runs the loop until every closed TLS connection has released its socket. aiokafka closes a connection whose
    SASL handshake was cancelled (a client stopped mid-connect) without waiting for the TLS shutdown; if the test's
    loop ended first, the socket would be left to the garbage collector and its ResourceWarning would fail whichever
    test happened to be running then. Bounded by asyncio's own TLS shutdown timeout (30 s)."""

    async def settled() -> bool:
        return _closing_tls_connections() == 0

    await eventually(settled, timeout_s, "closed TLS connections releasing their sockets")


async def eventually(
    cond: Callable[[], Awaitable[bool]], timeout_s: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class DemoRow:
    """The row a test publishes to move one prediction: the demo's first single-id feature, its table, the demo's
    first instance and the id that instance sends for the feature."""

    manifest: Manifest
    feature: SparseFeatureSpec
    table: TableSpec
    instance: dict[str, Any]
    the_id: int


def demo_row(demo_artifacts: Any) -> DemoRow:
    manifest: Manifest = demo_artifacts.manifest
    feature = next(f for f in manifest.sparse_features if f.kind is FeatureKind.SINGLE)
    instance = dict(demo_artifacts.instances[0])
    raw_id = instance[feature.name]
    the_id = int(raw_id[0] if isinstance(raw_id, list) else raw_id)
    return DemoRow(manifest, feature, manifest.table(feature.table), instance, the_id)


async def predict_one(client: httpx.AsyncClient, url: str, instance: dict[str, Any]) -> np.ndarray:
    """The prediction (its first output, flat float64) of ``instance`` alone, posted to the REST predict ``url``."""
    r = await client.post(url, content=json.dumps({"instances": [instance]}))
    assert r.status_code == 200, r.text
    pred = r.json()["predictions"][0]
    if isinstance(pred, dict):
        pred = next(iter(pred.values()))
    return np.asarray(pred, dtype=np.float64).reshape(-1)
