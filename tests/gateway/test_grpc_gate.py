"""The native gRPC gate (``native/src/gate.rs``, ``grpc_front: gate``, the default) in front of the Python gRPC front.

In-process gateways on real gRPC (127.0.0.1) over ``tests.gateway.fake_backend``, which holds GetModelMetadata until
released, so which calls are in flight does not depend on timing. Every other gRPC test of the suite runs through the
gate too (it is the default); these check what only the gate does: its own bound, refusals worded and counted as
the Python front's, relaying of streams and large messages, and the Python front (``grpc_front: python``) as the
reference."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from schemas.proto import tfs_pb2
from tests.gateway.fake_backend import FakeBackend, call_metadata, fake_backend
from tests.support.ports import free_port
from tests.support.stack import metric_sum

pytestmark = pytest.mark.integration

_WAIT_S = 60.0  # bound of every wait (never reached when the gateway behaves)
_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_REQ = tfs_pb2.GetModelMetadataRequest(
    model_spec=tfs_pb2.ModelSpec(name="m"), metadata_field=["signature_def"]
)


def _app(backend: FakeBackend, front: str, direct: bool = True, extra: Any = None, **admission: Any) -> Any:
    from gateway.app import create_app
    from schemas.deployment import PassthroughModel
    from schemas.gateway_settings import GatewaySettings

    settings = GatewaySettings.model_validate(
        {
            "models": [PassthroughModel(name="m", target=backend.target)],
            "host": "127.0.0.1",
            "grpc_port": free_port(),
            "grpc_front": front,
            "grpc_direct": direct,
            "max_in_flight": 1,
            "admission": {"max_loop_lag_s": 0, **admission},
            **(extra or {}),
        }
    )
    return create_app(settings)


async def _call(
    channel: grpc.aio.Channel, method: str = _METADATA, req: Any = _REQ
) -> tuple[grpc.StatusCode, str]:
    try:
        await channel.unary_unary(method, request_serializer=type(req).SerializeToString)(
            req, timeout=_WAIT_S
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _until(check: Any) -> None:
    for _ in range(int(_WAIT_S / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail("condition never met")


def _big_predict(*shape: int) -> tfs_pb2.PredictRequest:
    """A Predict of model ``m`` with one float32 input ``x`` of ``shape``, zeros in ``tensor_content``."""
    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="m"))
    x = req.inputs["x"]
    x.dtype = tfs_pb2.DataType.DT_FLOAT
    for size in shape:
        x.tensor_shape.dim.add().size = size
    x.tensor_content = bytes(4 * math.prod(shape))
    return req


def _metrics(app: Any) -> str:
    return app.state.runtime.metrics.render().decode()


@pytest.fixture
def backend() -> Iterator[FakeBackend]:
    with fake_backend() as fb:
        fb.hold_metadata = True
        yield fb


@pytest.mark.parametrize("front", ["gate", "python"])
def test_a_call_over_the_limit_gets_the_same_refusal_from_either_front(
    backend: FakeBackend, front: str
) -> None:
    """The only slot held at the backend, no queue: the next call is refused RESOURCE_EXHAUSTED with admission's own
    text and counted as ``queue_full``, by the gate as by the Python front; once the slot is free calls pass."""

    async def scenario() -> None:
        app = _app(backend, front, queue_timeout_s=0)
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            assert rt.grpc_front is not None and rt.grpc_front.front == front
            async with grpc.aio.insecure_channel(f"127.0.0.1:{rt.grpc_port}") as channel:
                first = asyncio.ensure_future(_call(channel))
                await asyncio.to_thread(backend.metadata_started.wait, _WAIT_S)
                await _until(lambda: rt.limiter.current == 1)
                code, text = await _call(channel)
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, text)
                assert text == (
                    "Too many requests in flight: 1 at the concurrency limit of 1 (max_in_flight=1), 0 waiting "
                    "(admission.max_queue); retry later"
                )
                backend.release.set()
                assert await first == (grpc.StatusCode.OK, "")
                assert await _call(channel) == (grpc.StatusCode.OK, "")
                if front == "gate":
                    assert rt.grpc_front.relayed == 0  # every relay slot given back
            text = _metrics(app)
            assert metric_sum(text, "embedgate_admission_shed_total", {"reason": "queue_full"}) == 1
            assert metric_sum(text, "embedgate_requests_rejected_total") == 1

    asyncio.run(scenario())


def test_the_gate_bounds_the_calls_the_python_front_has_not_taken(backend: FakeBackend) -> None:
    """While the Python front cannot take calls (its event loop blocked here), the calls relayed to it wait in gRPC
    core's queue, unseen by admission; past the limit plus the queue room plus a margin (1 + 0 + 8) the gate refuses
    the next one itself (``grpc_gate``). Once the front runs again every relayed call is answered (none with an
    internal error) and calls pass."""
    from gateway.admission import _TRANSIT_MIN

    async def scenario() -> None:
        app = _app(backend, "gate", direct=False, queue_timeout_s=0)
        backend.hold_metadata = False
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            front = rt.grpc_front
            unblock = threading.Event()
            front._loop.call_soon_threadsafe(
                unblock.wait, _WAIT_S
            )  # the Python front's loop stops taking calls
            bound = 1 + _TRANSIT_MIN
            async with grpc.aio.insecure_channel(f"127.0.0.1:{rt.grpc_port}") as channel:
                waiting = [asyncio.ensure_future(_call(channel)) for _ in range(bound)]
                await _until(lambda: front.relayed == bound)
                code, text = await _call(channel)
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, text)
                assert text.startswith(
                    f"Too many calls in flight at the gRPC front: {bound} at its limit of {bound}"
                )
                assert "retry later" in text
                unblock.set()
                codes = [c for c, _ in await asyncio.gather(*waiting)]
                assert grpc.StatusCode.OK in codes
                assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
                await _until(lambda: front.relayed == 0)
                assert await _call(channel) == (grpc.StatusCode.OK, "")
            text = _metrics(app)
            assert metric_sum(text, "embedgate_admission_shed_total", {"reason": "grpc_gate"}) == 1
            other = {"api": "other", "model": "_other", "outcome": "RESOURCE_EXHAUSTED"}
            assert metric_sum(text, "embedgate_requests_total", other) == 1

    asyncio.run(scenario())


def test_the_gate_relays_streams_large_messages_and_unguarded_services(backend: FakeBackend) -> None:
    """Health.Watch (a server stream, never refused), a 24 MB Predict relayed to the backend and answered, and a
    call the client cancels (the backend's call is cancelled too)."""
    backend.hold_metadata = True

    async def scenario() -> None:
        app = _app(backend, "gate", queue_timeout_s=0.5)
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{rt.grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]
            ) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=""), timeout=_WAIT_S
                )
                first = await watch.read()
                assert first.status == health_pb2.HealthCheckResponse.SERVING
                watch.cancel()

                big = _big_predict(1024, 6 * 1024)
                call = channel.unary_unary(
                    _PREDICT,
                    request_serializer=tfs_pb2.PredictRequest.SerializeToString,
                    response_deserializer=tfs_pb2.PredictResponse.FromString,
                )
                resp = await call(big, timeout=_WAIT_S)
                assert list(resp.outputs["y"].float_val) == [1.0]
                assert backend.calls["Predict"] == 1

                cancelled = asyncio.ensure_future(_call(channel))
                await asyncio.to_thread(backend.metadata_started.wait, _WAIT_S)
                cancelled.cancel()
                assert await asyncio.to_thread(backend.metadata_cancelled.wait, _WAIT_S)
                backend.release.set()
                await _until(lambda: rt.grpc_front.relayed == 0 and rt.limiter.current == 0)

    asyncio.run(scenario())


def test_the_gate_goes_away_gracefully_on_shutdown(backend: FakeBackend) -> None:
    """A call in flight when the gateway stops still gets its answer; the port is closed afterwards."""
    result: dict[str, Any] = {}

    def client(target: str) -> None:
        result["code"] = call_metadata(target)

    async def scenario() -> str:
        app = _app(backend, "gate", queue_timeout_s=0)
        async with app.router.lifespan_context(app):
            target = f"127.0.0.1:{app.state.runtime.grpc_port}"
            caller = threading.Thread(target=client, args=(target,))
            caller.start()
            await asyncio.to_thread(backend.metadata_started.wait, _WAIT_S)
            threading.Timer(0.2, backend.release.set).start()  # released while the gateway is stopping
        await asyncio.to_thread(caller.join, _WAIT_S)
        return target

    target = asyncio.run(scenario())
    assert result.get("code") == grpc.StatusCode.OK, result
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(channel).result(timeout=1)


def test_calls_received_whole_never_wait_for_the_python_front(backend: FakeBackend) -> None:
    """``grpc_direct`` (the default): TF Serving's methods are received whole by the gate and answered on the
    gateway's loop. With the Python front's loop blocked, Predict and GetModelMetadata are answered (a 24 MB Predict
    too); the health service, relayed to the Python front, is answered once it runs again."""
    backend.hold_metadata = False

    async def scenario() -> None:
        app = _app(backend, "gate")
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            front = rt.grpc_front
            assert front.front == "gate" and front.direct
            unblock = threading.Event()
            front._loop.call_soon_threadsafe(unblock.wait, _WAIT_S)
            try:
                async with grpc.aio.insecure_channel(
                    f"127.0.0.1:{rt.grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]
                ) as channel:
                    assert await _call(channel) == (grpc.StatusCode.OK, "")
                    assert await _call(channel, _PREDICT, _big_predict(1024, 6 * 1024)) == (
                        grpc.StatusCode.OK,
                        "",
                    )
                    health = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=_WAIT_S
                    )
                    await asyncio.sleep(0.2)
                    assert not health.done(), "the health call was answered by a blocked front"
                    unblock.set()
                    assert (await health).status == health_pb2.HealthCheckResponse.SERVING
            finally:
                unblock.set()
            assert backend.calls["Predict"] == 1
            assert rt.grpc_front.relayed == 0 and rt.limiter.current == 0

    asyncio.run(scenario())


def test_calls_received_whole_need_a_known_token_and_fit_the_budget(
    backend: FakeBackend, tmp_path: Any
) -> None:
    """With tokens: a call without a valid token is refused in the gateway's words with its message never received
    (a 4 MB message over the 1 MiB budget gets UNAUTHENTICATED, not RESOURCE_EXHAUSTED); with one, the same message
    is refused by the gate's budget (``limits.max_buffered_bytes``, counted as rejected) and a small one passes. A
    token added to the file is taken by the gate within its sync; a gate holding stale tokens gets them again."""
    backend.hold_metadata = False
    tokens = tmp_path / "tokens"
    tokens.write_text("first-token\n", encoding="utf-8")
    budget = 1 << 20
    extra = {
        "auth": {"tokens_file": str(tokens)},
        "limits": {"max_buffered_bytes": budget},
        "max_body_bytes": 8 << 20,
    }

    def bearer(token: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {token}"),)

    async def call(channel: grpc.aio.Channel, req: Any, token: str | None) -> tuple[grpc.StatusCode, str]:
        fn = channel.unary_unary(_PREDICT, request_serializer=tfs_pb2.PredictRequest.SerializeToString)
        try:
            await fn(req, timeout=_WAIT_S, metadata=bearer(token) if token else None)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    big = _big_predict(1 << 20)
    small = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="m"))
    small.inputs["x"].CopyFrom(tfs_pb2.TensorProto(dtype=tfs_pb2.DataType.DT_FLOAT, float_val=[1.0]))

    async def scenario() -> None:
        app = _app(backend, "gate", extra=extra)
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            assert rt.grpc_front.direct
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{rt.grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]
            ) as channel:
                read = metric_sum(_metrics(app), "embedgate_grpc_request_bytes_total")
                code, text = await call(channel, big, None)
                assert (code, text) == (
                    grpc.StatusCode.UNAUTHENTICATED,
                    "Missing bearer token: send 'Authorization: Bearer <token>'",
                )
                assert await call(channel, big, "wrong") == (
                    grpc.StatusCode.UNAUTHENTICATED,
                    "Invalid bearer token",
                )
                assert metric_sum(_metrics(app), "embedgate_grpc_request_bytes_total") == read

                rejected = metric_sum(_metrics(app), "embedgate_requests_rejected_total")
                code, text = await call(channel, big, "first-token")
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, text)
                assert text == (
                    f"Too many request bytes being processed (limits.max_buffered_bytes={budget}); retry later"
                )
                assert metric_sum(_metrics(app), "embedgate_requests_rejected_total") == rejected + 1
                assert await call(channel, small, "first-token") == (grpc.StatusCode.OK, "")

                tokens.write_text("first-token\nsecond-token\n", encoding="utf-8")
                for _ in range(int(_WAIT_S / 0.05)):
                    if await call(channel, small, "second-token") == (grpc.StatusCode.OK, ""):
                        break
                    await asyncio.sleep(0.05)
                else:
                    pytest.fail("the new token was never accepted")

                rt.grpc_front._gate.set_tokens([b"something-else"])  # as if the gate missed a reload
                code, text = await call(channel, small, "first-token")
                assert code == grpc.StatusCode.UNAVAILABLE and "retry" in text, (code, text)
                assert await call(channel, small, "first-token") == (grpc.StatusCode.OK, "")

    asyncio.run(scenario())


@pytest.mark.parametrize("direct", [True, False])
def test_a_message_that_never_comes_is_refused_after_the_body_timeout(
    backend: FakeBackend, direct: bool
) -> None:
    """A call whose headers came but whose message does not (the client waits 10 s before sending it): refused
    DEADLINE_EXCEEDED after ``limits.body_timeout_s`` (0.5 s) by the gate receiving it whole, as by the Python front
    reading it; the slot it held is free again."""

    async def scenario() -> None:
        app = _app(backend, "gate", direct=direct, extra={"limits": {"body_timeout_s": 0.5}})
        async with app.router.lifespan_context(app):
            rt = app.state.runtime
            assert rt.grpc_front.direct is direct
            late = asyncio.Event()

            async def messages() -> Any:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(late.wait(), 10.0)
                yield _REQ.SerializeToString()

            async with grpc.aio.insecure_channel(f"127.0.0.1:{rt.grpc_port}") as channel:
                call = channel.stream_unary(_METADATA)(messages(), timeout=_WAIT_S)
                with pytest.raises(grpc.aio.AioRpcError) as exc:
                    await call
                late.set()
                assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.value
                assert exc.value.details() == (
                    "Request message not received within 0.5 s (limits.body_timeout_s)"
                )
                backend.hold_metadata = False
                assert await _call(channel) == (grpc.StatusCode.OK, "")

    asyncio.run(scenario())
