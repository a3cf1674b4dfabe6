"""Clients that give up are not errors (issue 21 item 8): a REST client that disconnects while sending its body or
while its request is answered, and gRPC calls the client cancels or lets expire, are logged at INFO without a
traceback, and nothing is logged at ERROR (a real gateway process, serve-local backend; its JSON log is read after it
stopped)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from tests.gateway.conftest import passthrough_models
from tests.support.gateway import run_gateway
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

_SLOW_N = 600_000  # the slow model's loop count: long enough that every client below gives up first


def _slow_request() -> Any:
    from schemas.proto import tfs_pb2

    req = tfs_pb2.PredictRequest()
    req.model_spec.name = "slow"
    t = req.inputs["n"]
    t.dtype = tfs_pb2.DataType.DT_INT32
    t.tensor_shape.dim.add().size = 1
    t.int_val.append(_SLOW_N)
    return req


def _log_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # not one of the gateway's JSON lines (e.g. a native library's stderr)
            out.append({"level": "?", "msg": line})
    return out


def _wait_idle(url: str) -> None:
    """Until the gateway has no request in flight (the abandoned ones ran to their end); bounded."""
    for _ in range(1200):
        if "embedgate_requests_in_flight 0.0" in httpx.get(f"{url}/metrics", timeout=10).text:
            return
        time.sleep(0.1)
    pytest.fail("requests still in flight after 120 s")


def test_client_cancels_are_info_without_traceback(passthrough_backend: Any, tmp_path: Path) -> None:
    from schemas.proto import tfs_pb2

    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"models": passthrough_models(passthrough_backend.target)}))
    grpc_port = free_port()
    with run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(grpc_port)}) as gw:
        body = json.dumps({"instances": [_SLOW_N]}).encode()
        head = b"POST /v1/models/slow:predict HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:  # leaves mid-body
            sock.sendall(head + f"Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
            time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:  # leaves while answered
            sock.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.5)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            predict = channel.unary_unary(
                "/tensorflow.serving.PredictionService/Predict",
                request_serializer=tfs_pb2.PredictRequest.SerializeToString,
                response_deserializer=tfs_pb2.PredictResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as exc:  # the client's deadline passes
                predict(_slow_request(), timeout=0.3)
            assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            call = predict.future(_slow_request(), timeout=60)  # the client cancels
            time.sleep(0.3)
            assert call.cancel()
        _wait_idle(gw.url)
    lines = _log_lines(gw.log_path)
    gateway = [
        x for x in lines if str(x.get("logger", "")).startswith(("embedgate", "uvicorn", "grpc", "asyncio"))
    ]
    assert not [x for x in gateway if x.get("level") in ("ERROR", "CRITICAL")], gateway
    assert not [x for x in lines if "exc" in x or "Traceback" in str(x.get("msg", ""))], lines
    assert not [x for x in lines if x.get("level") == "?" and "Traceback" in str(x["msg"])], lines
    cancelled = [x for x in gateway if x.get("msg") == "request cancelled" and x.get("model") == "slow"]
    # the cancelled call; the expired one too unless the gateway's own deadline (the client's) ended it first
    assert len(cancelled) in (1, 2) and all(x["level"] == "INFO" for x in cancelled), gateway
    left = [x for x in gateway if x.get("msg") == "client disconnected"]
    assert len(left) >= 1 and all(x["level"] == "INFO" for x in left), (
        gateway
    )  # the REST client that left mid-body
