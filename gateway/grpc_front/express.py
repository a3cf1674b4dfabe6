"""The gRPC front's express lane: an embedding model's Predict whose every row the hot-row cache holds, served on the
gateway's loop in one synchronous step and the entry call (issue 17).

Why: a call the native gate received whole (``grpc_direct``) took the general path on the loop: a task through
:meth:`DirectCalls.serve <gateway.grpc_front.servicer.DirectCalls.serve>`, ``_core`` (admission's queue, the
request scope, protobuf's parse of the message, the limits), ``Gateway.handle``, ``EmbeddingServable.predict``, the
version pin, the coalescer and ``run_now``: about 0.7-0.85 ms of the loop per request in some 30 Python steps of 1-3 %
each (docs/benchmarks.md), most of them deciding what is already settled for the common request. The lane decides it
once, up front, and reads nothing twice: the message is never parsed by protobuf (its head is read by
:func:`gateway.native.predict_head`, its tensors' sizes by ``native_input_bytes``, its features by
:func:`gateway.native.tensor_features`); the entry's request is written by the cache's one native call.

When it serves a call (else the general path serves it, from its first step, with nothing counted or held: every
check before the cache read is pure, and the cache read, the last, counts and ticks only when it answers):

* the native path is on, no tokens file is configured (``auth``), and the message is smaller than
  ``limits.plain_offload_bytes`` (the general path would parse it on the loop too);
* its head is plain: ``model_spec`` with a name and at most a signature (no version or label: "latest"), inputs,
  no ``output_filter``;
* the model is an embedding model with a hot-row cache, the signature its own (or empty), the version pin fresh and
  not degraded;
* admission would admit it at once (a free slot, nobody queued, the loop not lagging), the buffered-bytes budget has
  room for it and what its tensors decode to, the coalescer has nothing running or waiting;
* the native feature reader reads every input and the cache holds every row.

What it does is what the general path does for such a call, step for step: the request counted with the same
labels, latency and outcome (``Runtime.track``), its bytes counted and reserved, a ``max_in_flight`` slot taken and
given back with its round-trip sample, the coalescer's count of a lone run, the entry called at the pin with the
call's deadline, the answer relayed with the client's model name and signature (the same bytes), the
``x-embedgate-degraded`` trailer, errors renamed and worded alike. A ``NotFound`` from the entry (the pinned version
went away) re-pins and serves the call by the general path, as its second attempt does. Each call served here is
counted in ``embedgate_grpc_express_total{model}``. ``tests/gateway/test_grpc_express.py`` checks the lane against
the general path (``grpc_express: false``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway import native
from gateway.core.embedding import CachedRun, EmbeddingServable
from gateway.core.servable import is_hidden_signature
from gateway.errors import GatewayError, NotFound
from gateway.grpc_front.messages import native_input_bytes, parse_message
from gateway.grpc_front.replies import DEGRADED_METADATA_KEY, predict_reply, relayed_reply
from schemas.proto import tfs_pb2

if TYPE_CHECKING:
    from gateway.grpc_front.servicer import _Servicer

__all__ = ["ExpressLane"]


class ExpressLane:
    """The lane of one gRPC front (``servicer``: its methods' shared steps). One event loop: the gateway's."""

    def __init__(self, servicer: _Servicer) -> None:
        self._s = servicer

    async def serve(self, call: Any, raw: bytes) -> bool:
        """Serve the Predict ``call`` (its message ``raw``) and return True, or return False at once, with nothing
        counted or held, when the general path must serve it (the module's conditions)."""
        ready = self._ready(call, raw)
        if ready is None:
            return False
        model, run, extra = ready
        await self._answer(call, raw, model, run, extra)
        return True

    def _ready(self, call: Any, raw: bytes) -> tuple[EmbeddingServable, CachedRun, int] | None:
        rt = self._s.rt
        limits = rt.settings.limits
        gw = rt.gateway
        if gw is None or rt.auth is not None or call.cancelled or len(raw) >= limits.plain_offload_bytes:
            return None
        head = native.predict_head(raw)
        if head is None:
            return None
        name, signature = head
        model = gw.servables.get(name)
        if not isinstance(model, EmbeddingServable) or is_hidden_signature(signature):
            return None
        decoded = native_input_bytes(raw, limits, rt.settings.max_body_bytes)
        if decoded is None:
            return None
        extra = max(0, decoded - len(raw))
        if not rt.buffered.has_room(len(raw) + extra) or not rt.limiter.would_admit_now():
            return None
        run = model.cached_run(raw, signature)  # the cache read: the last check, the first step that counts
        return None if run is None else (model, run, extra)

    async def _answer(
        self, call: Any, raw: bytes, model: EmbeddingServable, run: CachedRun, extra: int
    ) -> None:
        """The call answered: the general path's steps after its checks (see the module docs), in its order."""
        s = self._s
        rt = s.rt
        deadline = s.deadline(call.time_remaining())
        held = [0]  # the message's bytes and what its tensors decode to beyond them, reserved in rt.buffered
        try:
            with rt.track(admit=False, release=False) as tracked:
                tracked.api = "predict"
                tracked.model = model.name
                s.take(raw, held)
                ok = False
                try:
                    tracked.admit()  # a free slot: admission would admit now (checked, no await since)
                    s.reserve(extra, held)
                    rt.metrics.grpc_express.labels(model.name).inc()
                    reply, version, degraded = await self._reply(raw, model, run, deadline)
                    tracked.version = "" if version is None else str(version)
                    tracked.degraded = degraded
                    ok = True
                finally:
                    tracked.release(ok)
            trailers = [(DEGRADED_METADATA_KEY, degraded)] if degraded is not None else []
            call.respond(0, "", reply, trailers)
            return
        except asyncio.CancelledError:  # the client went away: no one to answer
            return
        except Exception as exc:  # noqa: BLE001 - every error becomes the call's status
            code, message = s.failure("predict", exc)
        finally:
            s.release_held(held)
        call.respond(int(code.value[0]), message)

    async def _reply(
        self, raw: bytes, model: EmbeddingServable, run: CachedRun, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        """The serialized reply, the version that answered and the degraded reason (None: not degraded)."""
        try:
            res = await model.cached_answer(run, deadline)
        except (
            NotFound
        ):  # the pinned version went away: re-pinned, then the general path (its second attempt)
            await model.pins.after_not_found(run.pin, deadline)
            s = self._s
            limits, max_body = s.rt.settings.limits, s.rt.settings.max_body_bytes
            message = parse_message(tfs_pb2.PredictRequest, raw, limits, max_body).message
            return await s.predict(message, raw, deadline)
        except GatewayError as exc:
            raise model.renamed(exc) from exc.__cause__
        name = model.name
        if res.wire is not None:
            return relayed_reply(res.wire, name, res.signature), res.version, res.degraded
        return predict_reply(name, res, []).SerializeToString(), res.version, res.degraded
