"""`embedgate serve-local` flags: single-model form, tensor_content outputs, config re-read, reload RPC, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.support.ports import free_port
from tests.support.servers import serve_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE


def _predict(target: str, model: str, x: list[float]) -> predict_pb2.PredictResponse:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(x, np.float32)))
    with grpc.insecure_channel(target) as ch:
        return prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(req, 10)


def _wait_status(target: str, name: str, timeout: float = 60.0) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as ch:
        stub = model_service_pb2_grpc.ModelServiceStub(ch)
        req = get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = name
        while True:
            try:
                resp = stub.GetModelStatus(req, 2)
                states = {s.version: s.state for s in resp.model_version_status}
                if AVAILABLE in states.values():
                    return states
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not AVAILABLE at {target} within {timeout} s")
            time.sleep(0.2)


def test_config_reread_and_tensor_content(model_root: Path, tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "a" base_path: "{model_root}/half" }} }}', encoding="utf-8"
    )
    with serve_local(
        config,
        extra_args=[
            "--enable_serialization_as_tensor_content=true",
            "--model_config_file_poll_wait_seconds=0.3",
        ],
    ) as server:
        resp = _predict(server.target, "a", [2.0])
        y = resp.outputs["y"]
        assert not y.float_val and len(y.tensor_content) == 4  # tensor_content, as TF Serving with the flag
        assert tf.make_ndarray(y).tolist() == [3.0]
        # the config file is re-read: a second model appears, the first stays
        config.write_text(
            f'model_config_list {{ config {{ name: "a" base_path: "{model_root}/half" }}\n'
            f'config {{ name: "b" base_path: "{model_root}/clf" }} }}',
            encoding="utf-8",
        )
        assert _wait_status(server.target, "b") == {1: AVAILABLE}


def test_reload_rpc_replaces_the_config(model_root: Path, tmp_path: Path) -> None:
    """HandleReloadConfigRequest replaces the config: "a" goes away. (On a server that does not re-read its config
    file: one that does puts the file's models back at its next poll, as TF Serving does.)"""
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "a" base_path: "{model_root}/half" }} }}', encoding="utf-8"
    )
    with serve_local(config) as server:
        assert _predict(server.target, "a", [0.0]).model_spec.version.value == 2
        reload = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(
            f'model_config_list {{ config {{ name: "c" base_path: "{model_root}/half" }} }}', reload.config
        )
        with grpc.insecure_channel(server.target) as ch:
            model_service_pb2_grpc.ModelServiceStub(ch).HandleReloadConfigRequest(reload, 30)
        assert _predict(server.target, "c", [0.0]).model_spec.version.value == 2
        with pytest.raises(grpc.RpcError) as info:
            _predict(server.target, "a", [0.0])
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_single_model_flags_and_sigterm(model_root: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "embedgate",
                "serve-local",
                "--port",
                str(port),
                "--model_name",
                "half",
                "--model-base-path",
                str(model_root / "half"),
                "--file_system_poll_wait_seconds=0",
                "--malloc_mmap_threshold_bytes=33554432",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
        )
    try:
        target = f"127.0.0.1:{port}"
        assert _wait_status(target, "half") == {2: AVAILABLE}  # latest only
        assert list(_predict(target, "half", [2.0]).outputs["y"].float_val) == [3.0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
        assert "'MALLOC_MMAP_THRESHOLD_': 33554432, 'MALLOC_TRIM_THRESHOLD_': 67108864" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model_config_file", "{tmp}/absent.config"], "absent.config: cannot read model config"),
        (["--model_config_file", "{tmp}/bad.config"], "bad.config: not a valid ModelServerConfig"),
        (["--rest_api_port", "8501"], "no REST API"),
        (["--malloc_mmap_threshold_bytes", "-1"], "expected a number of bytes >= 0, got -1"),
        (["--malloc_mmap_threshold_bytes", "1M"], "expected a number of bytes, got '1M'"),
    ],
)
def test_bad_flags_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "bad.config").write_text("model_config_list { config { nme: 'x' } }", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "embedgate", "serve-local", *[a.format(tmp=tmp_path) for a in args]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert needle in result.stderr
