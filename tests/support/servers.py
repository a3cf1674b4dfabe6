"""Start ``embedgate serve-local`` as a subprocess on 127.0.0.1 and wait until every model is AVAILABLE.

Usage::

    with serve_local({"half": base_dir}) as server:       # served name -> dir of numeric versions
        channel = grpc.insecure_channel(server.target)
    with serve_local(Path("models.config")) as server:    # an existing TF Serving model config file
        ...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

__all__ = ["LocalServer", "ServerStartError", "serve_local"]

_REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 10.0
_LOG_TAIL = 4000


class ServerStartError(RuntimeError):
    """serve-local died or did not make every model AVAILABLE in time; the message has its log tail."""


@dataclass
class LocalServer:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    models: tuple[str, ...]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, chars: int = _LOG_TAIL) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "<no log>"


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _config_text(models: dict[str, Path], num_versions: int | None = None) -> str:
    policy = (
        ""
        if num_versions is None
        else f"    model_version_policy {{ latest {{ num_versions: {num_versions} }} }}\n"
    )
    parts = []
    for name, base in models.items():
        parts.append(
            f'  config {{\n    name: "{name}"\n    base_path: "{Path(base).resolve()}"\n'
            f'    model_platform: "tensorflow"\n{policy}  }}\n'
        )
    return "model_config_list {\n" + "".join(parts) + "}\n"


def _model_names(config: Path) -> tuple[str, ...]:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2  # plain protos; does not import TensorFlow

    msg = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(config.read_text(encoding="utf-8"), msg)
    return tuple(c.name for c in msg.model_config_list.config)


@contextmanager
def serve_local(
    models: dict[str, Path] | Path,
    *,
    poll_seconds: float = 0.5,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    credentials: Any = None,
    num_versions: int | None = None,
) -> Iterator[LocalServer]:
    """Run serve-local on ``models`` (served name -> base path, or a model config file) until the block ends.

    ``num_versions``: with a dict, every model gets ``model_version_policy { latest { num_versions } }`` (None: no
    policy, TF Serving's default of the latest version only; ``embedgate.export.placement.SERVED_VERSIONS`` is
    what the generated deployments use).

    ``credentials`` (``grpc.ChannelCredentials``) is what the readiness probe connects with when ``extra_args``
    make the server speak TLS (``--ssl_config_file``)."""
    with tempfile.TemporaryDirectory(prefix="serve-local-") as tmp:
        workdir = Path(tmp)
        if isinstance(models, dict):
            config = workdir / "models.config"
            config.write_text(_config_text(models, num_versions), encoding="utf-8")
            names = tuple(models)
        else:
            config = Path(models)
            names = _model_names(config)
        port = port or free_port()
        log_path = workdir / "serve-local.log"
        cmd = [
            _python(),
            "-m",
            "embedgate",
            "serve-local",
            f"--port={port}",
            "--host=127.0.0.1",
            f"--model_config_file={config}",
            f"--file_system_poll_wait_seconds={poll_seconds}",
            *extra_args,
        ]
        env = dict(
            os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), PYTHONUNBUFFERED="1"
        )
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        server = LocalServer(port=port, proc=proc, log_path=log_path, models=names)
        try:
            _wait_available(server, credentials)
            yield server
        finally:
            _stop(proc)


def _wait_available(server: LocalServer, credentials: Any = None) -> None:
    import grpc

    from schemas.proto import tfs_pb2  # our wire copy: no TensorFlow import in the test process

    deadline = time.monotonic() + _START_TIMEOUT
    pending = list(server.models)
    channel_cm = (
        grpc.insecure_channel(server.target)
        if credentials is None
        else grpc.secure_channel(server.target, credentials)
    )
    with channel_cm as channel:
        get_status = channel.unary_unary(
            "/tensorflow.serving.ModelService/GetModelStatus",
            request_serializer=tfs_pb2.GetModelStatusRequest.SerializeToString,
            response_deserializer=tfs_pb2.GetModelStatusResponse.FromString,
        )
        while pending:
            if server.proc.poll() is not None:
                raise ServerStartError(
                    f"serve-local exited with code {server.proc.returncode} before models "
                    f"{pending} were AVAILABLE; log tail:\n{server.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"serve-local: models {pending} not AVAILABLE after {_START_TIMEOUT:.0f} s; "
                    f"log tail:\n{server.log_tail()}"
                )
            name = pending[0]
            request = tfs_pb2.GetModelStatusRequest()
            request.model_spec.name = name
            try:
                response = get_status(request, timeout=2.0)
            except grpc.RpcError:
                time.sleep(0.2)
                continue
            available = tfs_pb2.ModelVersionStatus.AVAILABLE
            if any(s.state == available for s in response.model_version_status):
                pending.pop(0)
            else:
                time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(_STOP_TIMEOUT)
