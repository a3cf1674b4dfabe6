"""GetModelStatus, and the hot swap: versions appear and disappear under concurrent Predict traffic."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Self

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.localserve.models import write_half_plus

pytestmark = pytest.mark.integration

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END


def _status(channel: grpc.Channel, name: str, version: int | None = None) -> dict[int, int]:
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = name
    if version is not None:
        req.model_spec.version.value = version
    resp = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(req, 10)
    for s in resp.model_version_status:
        assert s.HasField("status") and s.status.error_code == 0
    return {s.version: s.state for s in resp.model_version_status}


def test_status(channel: grpc.Channel) -> None:
    assert _status(channel, "half") == {1: AVAILABLE, 2: AVAILABLE}
    assert _status(channel, "half", 1) == {1: AVAILABLE}
    assert _status(channel, "half_pinned") == {1: AVAILABLE}
    assert _status(channel, "clf") == {1: AVAILABLE}
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    for name, version, code, message in [
        ("nope", None, grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope"),
        ("half", 7, grpc.StatusCode.NOT_FOUND, "Could not find version 7 of model half"),
        ("", None, grpc.StatusCode.INVALID_ARGUMENT, "Missing model name in request."),
    ]:
        req = get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = name
        if version is not None:
            req.model_spec.version.value = version
        with pytest.raises(grpc.RpcError) as info:
            stub.GetModelStatus(req, 10)
        assert (info.value.code(), info.value.details()) == (code, message)  # type: ignore[attr-defined]


class _Traffic:
    """Threads sending Predict to ``swap`` until stopped; bounded by ``max_requests`` in total."""

    def __init__(self, channel: grpc.Channel, threads: int = 4, max_requests: int = 20_000) -> None:
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.max_requests = max_requests
        self.sent = 0
        self.failures: list[str] = []
        self.seen: dict[int, float] = {}  # version -> y for x = 0
        self.last_version = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def _run(self) -> None:
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "swap"
        req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.zeros(4, np.float32)))
        while not self._stop.is_set():
            with self._lock:
                if self.sent >= self.max_requests:
                    return
                self.sent += 1
            try:
                resp = self._stub.Predict(req, 10)
            except grpc.RpcError as exc:
                with self._lock:
                    self.failures.append(f"{exc.code()}: {exc.details()}")  # type: ignore[attr-defined]
                continue
            with self._lock:
                self.last_version = resp.model_spec.version.value
                self.seen[self.last_version] = resp.outputs["y"].float_val[0]

    def wait_for(self, version: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.last_version == version or self.failures or self.sent >= self.max_requests:
                    break
            time.sleep(0.05)
        with self._lock:
            assert self.last_version == version, (
                f"version {version} not served within {timeout} s; "
                f"seen {self.seen}, failures {self.failures[:3]}"
            )


def test_hot_swap_under_traffic(channel: grpc.Channel, model_root: Path) -> None:
    base = model_root / "swap"
    with _Traffic(channel) as traffic:
        traffic.wait_for(1)
        write_half_plus(base, 2, offset=200.0)  # built elsewhere, renamed into place
        traffic.wait_for(2)
        trash = base.parent / ".swap-2-removed"
        (base / "2").rename(trash)  # version 2 disappears: version 1 comes back, 2 is unloaded
        shutil.rmtree(trash)
        traffic.wait_for(1)
        time.sleep(0.3)
    assert traffic.failures == []
    assert traffic.seen == {1: 100.0, 2: 200.0}
    assert traffic.sent > 20
    deadline = time.monotonic() + 10
    while _status(channel, "swap").get(2) != END and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _status(channel, "swap") == {2: END, 1: AVAILABLE}
