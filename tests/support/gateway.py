"""Start ``embedgate gateway`` as a subprocess for integration tests: ``run_gateway(config_yaml) as gw: gw.url``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

__all__ = ["GatewayProc", "run_gateway", "serve_exported"]

_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GatewayProc:
    url: str  # "http://127.0.0.1:<port>"
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path


@contextmanager
def run_gateway(
    config_yaml: Path,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 30.0,
    https: Mapping[str, Any] | None = None,
) -> Iterator[GatewayProc]:
    """Run the gateway on a free 127.0.0.1 port until /readyz answers 200 (bounded); stop it on exit.

    ``env`` adds environment variables (e.g. ``EMBEDGATE_REQUEST_TIMEOUT_S``). Output goes to a log file next to the
    config (``gateway-<port>.log``), quoted in the error if the gateway does not become ready. ``https``: the
    gateway serves TLS (config ``tls``); the URL is ``https://`` and these httpx keywords (``verify``, ``cert``)
    make the readiness probe's client.
    """
    port = free_port()
    log_path = Path(config_yaml).parent / f"gateway-{port}.log"
    full_env = {**os.environ, **(env or {})}
    python = _REPO / ".venv" / "bin" / "python"
    cmd = [
        str(python if python.exists() else sys.executable),
        "-m",
        "embedgate",
        "gateway",
        "--config",
        str(config_yaml),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=_REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    scheme = "http" if https is None else "https"
    gw = GatewayProc(url=f"{scheme}://127.0.0.1:{port}", port=port, proc=proc, log_path=log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}:\n{_tail(log_path)}")
            try:
                if httpx.get(f"{gw.url}/readyz", timeout=1.0, **(https or {})).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway not ready within {ready_timeout} s:\n{_tail(log_path)}")
            time.sleep(0.05)
        yield gw
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return "<no log>"


@contextmanager
def serve_exported(model_dir: Path, workdir: Path) -> Iterator[tuple[GatewayProc, int]]:
    """An exported model behind serve-local (entry + every PS shard) and a gateway process with REST and gRPC on.

    Yields the gateway and its gRPC port; both processes stop on exit. ``workdir`` holds the gateway config.
    """
    import yaml

    from schemas.manifest import Manifest
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    shards = Manifest.load(model_dir).num_shards
    with serve_local(exported_backends(model_dir)) as server:
        model = embedding_model(model_dir, entry=server.target, shards=[[server.target]] * shards)
        cfg = workdir / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [model]}))
        port = free_port()
        with run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(port)}) as gw:
            yield gw, port
