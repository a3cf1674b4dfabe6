"""Resources of one app, opened in the lifespan: gRPC channels (one per target), clients, servables, the parse threads
and processes, the manifest watcher, the PS stream-position poller (``grpc.position_poll_s``), the readiness poller
(``health_poll_s``, :mod:`gateway.readiness`), and the gRPC front
(when ``grpc_port`` is set); the limiter, the buffered-bytes budget and the
authenticator are built with the app. ``Runtime.track`` is the per-request accounting both fronts use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from fastapi import FastAPI

from gateway import native
from gateway.admission import Admission
from gateway.auth import Authenticator
from gateway.backends.channels import channel_credentials, open_channel
from gateway.backends.client import BackendClient, ReplicaSet
from gateway.backends.native_client import NativeCalls
from gateway.core import EmbeddingServable, Gateway, MetadataCache, PassthroughServable, Servable
from gateway.core.manifests import ManifestStore, manifest_file
from gateway.core.positions import PositionTracker
from gateway.errors import GatewayError, clip
from gateway.limits import BufferedBytes, ParsePool
from gateway.metrics import Metrics
from gateway.readiness import PROBE_TIMEOUT_S, Readiness, poll_readiness
from gateway.stream import DeltaStream
from schemas.deployment import EmbeddingModel
from schemas.gateway_settings import GatewaySettings
from schemas.manifest import Manifest

if TYPE_CHECKING:
    from gateway.grpc_front import GrpcFront

__all__ = ["Call", "InFlightLimiter", "Runtime", "lifespan"]

log = logging.getLogger("embedgate.gateway")


class InFlightLimiter(Admission):
    """At most ``limit`` requests at once; beyond that requests are refused at once (never queued): an
    :class:`~gateway.admission.Admission` with a fixed limit and no queue."""

    def __init__(self, limit: int, status: int, retry_after: int) -> None:
        super().__init__(limit, status, retry_after)


@dataclass
class Call:
    """What one request reports to the metrics; the front end fills it in as it learns the values."""

    model: str = ""
    api: str = "other"  # predict / classify / regress / status / metadata / other
    version: str = ""  # the version that answered ("" when unknown)
    degraded: str | None = (
        None  # why the answer is marked degraded: reasons, comma-separated (each counted when the outcome is OK)
    )
    admitted: bool = False  # holds a max_in_flight slot
    _admitted_at: float = 0.0  # admission clock when the slot was taken
    _limiter: Admission | None = field(default=None, repr=False)
    _metrics: Metrics | None = field(default=None, repr=False)

    def admit(self) -> None:
        """Take a ``max_in_flight`` slot (raises ResourceExhausted/Unavailable when full; counted as rejected)."""
        if self.admitted or self._limiter is None or self._metrics is None:
            return
        try:
            self._admitted_at = self._limiter.acquire()
        except GatewayError:
            self._metrics.rejected.inc()
            raise
        self.admitted = True
        self._metrics.in_flight.inc()

    async def admit_queued(self) -> None:
        """:meth:`admit`, waiting for a slot in the admission queue when none is free (``admission``)."""
        if self.admitted or self._limiter is None or self._metrics is None:
            return
        try:
            self._admitted_at = await self._limiter.admit()
        except GatewayError:
            self._metrics.rejected.inc()
            raise
        self.admitted = True
        self._metrics.in_flight.inc()

    def release(self, ok: bool) -> None:
        """Give the slot back, if held (on the limiter's event loop); ``ok``: the request was answered OK, so its
        round trip is a sample of the adaptive limit."""
        if not self.admitted or self._limiter is None or self._metrics is None:
            return
        self.admitted = False
        self._limiter.release(self._admitted_at if ok else None)
        self._metrics.in_flight.dec()


@dataclass
class Runtime:
    """What handlers reach through ``request.app.state.runtime``."""

    settings: GatewaySettings
    manifests: dict[str, Manifest]
    metrics: Metrics
    limiter: Admission
    buffered: BufferedBytes = field(
        default_factory=lambda: BufferedBytes(256 * 1024 * 1024, 1)
    )  # bodies held
    auth: Authenticator | None = None  # None: no tokens required
    model_names: frozenset[str] = frozenset()
    targets: tuple[str, ...] = ()  # every configured backend address (removed from client-facing texts)
    gateway: Gateway | None = None
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    native_calls: NativeCalls | None = (
        None  # backend Predict calls' native client (grpc.native_client), while open
    )
    grpc_port: int = 0  # the bound gRPC port while the gRPC front runs, else 0
    # the gRPC front while it runs (its ``.front``: "gate", native, or "python", is what listens on grpc_port)
    grpc_front: GrpcFront | None = None
    executor: ThreadPoolExecutor | None = None  # parse threads for large bodies (open while the app runs)
    procs: ParsePool | None = None  # parse worker processes for large bodies (limits.parse_processes > 0)
    stream: DeltaStream | None = None  # the hot-row cache's delta stream (cache.max_bytes > 0)
    positions: dict[str, PositionTracker] = field(
        default_factory=dict
    )  # per embedding model, while the app runs with grpc.position_poll_s > 0
    readiness: Readiness = field(
        default_factory=Readiness
    )  # the health poller's last result (/readyz, gRPC Health)

    @contextmanager
    def track(self, *, admit: bool = True, release: bool = True) -> Iterator[Call]:
        """Record one request's metrics when the block ends; with ``admit`` take its ``max_in_flight`` slot first
        (raises when full), else the front calls ``call.admit()`` itself (REST: once the body is in). With
        ``release`` the slot is given back when the block ends; else the front gives it back itself
        (``call.release``; the gRPC front, whose block runs on another thread than the limiter's loop).

        The outcome is ``OK``, the GatewayError's code name, ``INTERNAL`` for any other exception, ``CANCELLED`` when
        the task is cancelled (every exception is re-raised; a cancellation, e.g. a gRPC client that cancelled or whose
        deadline passed, is logged at INFO without a traceback). Task-safe within one event loop; without ``admit`` and
        ``release`` also from another thread (it then only counts, with thread-safe metrics).
        """
        call = Call(_limiter=self.limiter, _metrics=self.metrics)
        start = time.perf_counter()
        outcome = "OK"
        try:
            if admit:
                call.admit()
            yield call
        except GatewayError as exc:
            outcome = exc.code.name
            raise
        except Exception:
            outcome = "INTERNAL"
            raise
        except BaseException:  # the task was cancelled (client gone, shutdown): not an error, no traceback
            outcome = "CANCELLED"
            log.info("request cancelled", extra={"api": call.api, "model": clip(call.model)})
            raise
        finally:
            if release:
                call.release(outcome == "OK")
            label = call.model if call.model in self.model_names else "_other"
            self.metrics.requests.labels(label, call.version, call.api, outcome).inc()
            if call.degraded is not None and outcome == "OK":
                for reason in call.degraded.split(","):
                    self.metrics.degraded.labels(label, reason).inc()
            self.metrics.latency.labels(label, call.api).observe(time.perf_counter() - start)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    rt: Runtime = app.state.runtime
    s = rt.settings
    clients: dict[str, BackendClient] = {}
    creds = channel_credentials(s.backend_tls) if s.backend_tls is not None else None

    calls = _native_calls(s)
    rt.native_calls = calls

    def client(target: str) -> BackendClient:
        if target not in clients:
            rt.channels[target] = open_channel(target, s.grpc, s.backend_tls, creds)
            clients[target] = BackendClient(target, rt.channels[target], rt.metrics.observe_backend, calls)
        return clients[target]

    if rt.manifests:  # import the feature/pooling modules now, not on the first request
        import gateway.codec.example
        import gateway.embedding
        import gateway.features  # noqa: F401
    cache = MetadataCache(s.metadata_ttl_s)
    servables: dict[str, Servable] = {}
    stores: list[ManifestStore] = []
    for m in s.models:
        if isinstance(m, EmbeddingModel):
            shards = [ReplicaSet([client(t) for t in sh.replicas], s.grpc.replica_retry_s) for sh in m.shards]
            store = ManifestStore(
                m.name,
                rt.manifests[m.name],
                manifest_file(m.manifest),
                num_shards=len(m.shards),
                on_reload=rt.metrics.observe_manifest_reload,
            )
            stores.append(store)
            servables[m.name] = EmbeddingServable(m, store, client(m.entry), shards, cache)
            if s.grpc.position_poll_s > 0:
                rt.positions[m.name] = PositionTracker(
                    m.name,
                    [(m.served_ps_name(i), rs) for i, rs in enumerate(shards)],
                    rt.metrics.observe_catching_up,
                )
        else:
            servables[m.name] = PassthroughServable(m, client(m.target), cache)
    rt.gateway = Gateway(servables)
    health = await _start_health(rt, rt.gateway)
    rt.executor = ThreadPoolExecutor(s.limits.parse_threads, thread_name_prefix="embedgate-parse")
    if s.limits.parse_processes:
        rt.procs = ParsePool(s.limits.parse_processes)
        rt.procs.warm()
    front: GrpcFront | None = None
    stream_task = _start_cache(rt, servables)  # coalescers; the hot-row cache fed by the delta stream
    watcher = (
        asyncio.create_task(_watch_manifests(stores, s.manifest_poll_s), name="manifest-watcher")
        if stores and s.manifest_poll_s > 0
        else None
    )
    poller = (
        asyncio.create_task(
            _watch_positions(list(rt.positions.values()), s.grpc.position_poll_s), name="position-poller"
        )
        if rt.positions
        else None
    )
    lag = (
        asyncio.create_task(rt.limiter.watch_lag(), name="loop-lag")
        if s.admission.max_loop_lag_s > 0
        else None
    )
    trimmer = (
        asyncio.create_task(_trim_malloc(s.malloc_trim_interval_s), name="malloc-trim")
        if s.malloc_trim_interval_s > 0
        else None
    )
    try:
        if s.grpc_port:
            from gateway.grpc_front import GrpcFront

            front = GrpcFront(rt)
            await front.start()
            rt.grpc_port = front.port
            rt.grpc_front = front
        log.info(
            "gateway started",
            extra={
                "models": [m.name for m in s.models],
                "targets": sorted(clients),
                "grpc_port": rt.grpc_port,
                "grpc_front": front.front if front is not None else "",
                "rest_codec": native.path(),  # "native" (embedgate_native) or "reference" (gateway.native)
                # "native" (gateway.backends.native_client) or "grpc.aio": what makes the backend Predict calls
                "backend_client": "native" if rt.native_calls is not None else "grpc.aio",
            },
        )
        yield
    finally:
        for task in (watcher, poller, health, lag, trimmer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        rt.positions.clear()
        if front is not None:
            await front.stop()
            rt.grpc_port = 0
            rt.grpc_front = None
        if rt.stream is not None and stream_task is not None:
            rt.stream.stop()
            stream_task.cancel()  # may sit in a connection attempt; the consumer is closed on the way out
            with contextlib.suppress(asyncio.CancelledError):
                await stream_task
            rt.stream = None
        for ch in rt.channels.values():
            await ch.close()
        rt.channels.clear()
        if rt.native_calls is not None:
            rt.native_calls.close()
            rt.native_calls = None
        rt.gateway = None
        rt.executor.shutdown(wait=False, cancel_futures=True)
        rt.executor = None
        if rt.procs is not None:
            rt.procs.shutdown()
            rt.procs = None


def _native_calls(s: GatewaySettings) -> NativeCalls | None:
    """The native client of backend Predict calls (``grpc.native_client``; plaintext backends, native module)."""
    if not s.grpc.native_client or s.backend_tls is not None:
        return None
    client = native.grpc_client(s.grpc.max_receive_message_bytes)
    return None if client is None else NativeCalls(client, max_send=s.grpc.max_send_message_bytes)


async def _start_health(rt: Runtime, gw: Gateway) -> asyncio.Task[None]:
    """The first readiness poll (so /readyz is right as soon as the app serves), then the poller task
    (``health_poll_s``)."""
    s = rt.settings
    rt.readiness = Readiness()
    timeout = min(PROBE_TIMEOUT_S, s.request_timeout_s)
    try:
        await rt.readiness.poll(gw, timeout)
    except Exception:  # a bug in one poll must not stop startup; the poller retries
        log.exception("readiness poll failed")
    return asyncio.create_task(
        poll_readiness(rt.readiness, gw, s.health_poll_s, timeout, first_done=True), name="health-poller"
    )


def _start_cache(rt: Runtime, servables: dict[str, Servable]) -> asyncio.Task[None] | None:
    """Per embedding model: a Coalescer when ``coalesce.max_delay_ms`` > 0; with ``cache.max_bytes`` > 0 a RowCache
    wrapping its row source, and the stream task (returned)."""
    s = rt.settings
    embedding = {n: m for n, m in servables.items() if isinstance(m, EmbeddingServable)}
    if s.coalesce.max_delay_ms > 0:
        from gateway.coalesce import Coalescer

        runs = rt.metrics.coalesced
        for name, m in embedding.items():

            def observe(requests: int, trigger: str, name: str = name) -> None:
                runs.labels(model=name, trigger=trigger).observe(requests)

            m.coalescer = Coalescer(
                m.run_now,
                max_delay_s=s.coalesce.max_delay_ms / 1000,
                max_batch=s.coalesce.max_batch,
                observe=observe,
            )
    if not s.cache.max_bytes or not embedding:
        return None
    from gateway.cache import CachedRowSource, CacheMetrics, RowCache
    from gateway.stream import DeltaStream

    metrics = CacheMetrics(rt.metrics.registry)
    caches: dict[str, RowCache] = {}
    manifests: dict[str, Manifest] = {}
    for m in embedding.values():
        manifest = m.manifest
        cache = RowCache(
            manifest.model_name,
            {t.name: t.dim for t in manifest.tables},
            s.cache.max_bytes,
            settle_s=s.cache.settle_s,
            metrics=metrics,
        )
        m.rows = CachedRowSource(m.rows, cache)
        caches[manifest.model_name] = cache
        manifests[manifest.model_name] = manifest
    rt.stream = DeltaStream(s.cache, caches, manifests, metrics)
    return asyncio.create_task(rt.stream.run(), name="delta-stream")


async def _watch_manifests(stores: list[ManifestStore], every_s: float) -> None:
    """Every ``every_s`` seconds, re-read each embedding model's manifest.json if it changed (until cancelled).

    A bad file is logged and counted by the store; an unexpected error is logged and the watch goes on.
    """
    while True:
        await asyncio.sleep(every_s)
        for store in stores:
            try:
                store.poll()
            except Exception:  # never let one bad poll stop the watcher
                log.exception("manifest poll failed", extra={"model": store.model})


async def _trim_malloc(every_s: float) -> None:
    """Every ``every_s`` seconds, glibc's ``malloc_trim(0)`` on a worker thread (1-6 ms a call): the free memory the
    heap keeps for the next requests' buffers (``malloc_mmap_threshold_bytes``) goes back to the OS between bursts."""
    from embedgate.localserve.memory import trim_malloc

    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(trim_malloc)


_POSITION_TIMEOUT_S = 5.0


async def _watch_positions(trackers: list[PositionTracker], every_s: float) -> None:
    """At once, then ``every_s`` seconds after each poll ended: every PS replica's stream position (until cancelled).

    Each poll waits at most ``max(every_s, 1)`` seconds (5 at most) for the replicas; an unexpected error is logged
    and the polls go on (the flags then stay as the last poll set them)."""
    timeout = min(max(every_s, 1.0), _POSITION_TIMEOUT_S)
    while True:
        deadline = time.monotonic() + timeout
        results = await asyncio.gather(*(t.poll(deadline) for t in trackers), return_exceptions=True)
        for tracker, result in zip(trackers, results, strict=True):
            if isinstance(result, Exception):  # never let one bad poll stop the poller
                log.error("stream position poll failed", extra={"model": tracker.model}, exc_info=result)
            elif isinstance(result, BaseException):
                raise result
        await asyncio.sleep(every_s)
