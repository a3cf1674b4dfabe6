"""The deployment tools `make deploy-tools` builds into .cache/go-bin: Helm and tools/deploycheck."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "embedgate"
BIN = ROOT / ".cache" / "go-bin"
KUBE_VERSION = "1.31.0"


def tool(name: str) -> Path:
    path = BIN / name
    assert path.exists(), f"{path} is missing: run `make deploy-tools` (make test does)"
    return path


def run(args: list[str | Path], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def helm_template(*sets: str, values: Path | None = None) -> subprocess.CompletedProcess[str]:
    args: list[str | Path] = [tool("helm"), "template", "r", CHART, "--kube-version", KUBE_VERSION]
    if values is not None:
        args += ["--values", values]
    for s in sets:
        args += ["--set", s]
    return run(args)


def render(*sets: str, values: Path | None = None) -> list[dict[str, Any]]:
    proc = helm_template(*sets, values=values)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def parse_monitoring_config(text: str) -> Any:
    """Parse TF Serving's --monitoring_config_file text proto (tensorflow_serving/config/monitoring_config.proto:
    MonitoringConfig{PrometheusConfig prometheus_config = 1}, PrometheusConfig{bool enable = 1; string path = 2}),
    which tensorflow-serving-api does not ship; the message is built here from those field numbers."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

    f = descriptor_pb2.FileDescriptorProto(name="embedgate_test_monitoring.proto", package="embedgate.test")
    prom = f.message_type.add(name="PrometheusConfig")
    prom.field.add(name="enable", number=1, type=8, label=1)  # TYPE_BOOL, LABEL_OPTIONAL
    prom.field.add(name="path", number=2, type=9, label=1)  # TYPE_STRING
    mon = f.message_type.add(name="MonitoringConfig")
    mon.field.add(
        name="prometheus_config", number=1, type=11, label=1, type_name=".embedgate.test.PrometheusConfig"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("embedgate.test.MonitoringConfig"))
    return text_format.Parse(text, cls())


@contextmanager
def model_status_server(states: dict[str, str]) -> Iterator[int]:
    """A stand-in for TF Serving's REST model status on 127.0.0.1 (yields its port): ``GET /v1/models/<name>``
    answers ``{"model_version_status": [{"version": "1", "state": <states[name]>, ...}]}``, 404 for other names."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.removeprefix("/v1/models/")
            if name not in states:
                body, code = b'{"error": "Could not find any versions of model"}', 404
            else:
                text = f'{{"model_version_status": [{{"version": "1", "state": "{states[name]}", "status": {{}}}}]}}'
                body, code = text.encode(), 200
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def probe_passes(command: list[str], rest_port: int, port: int) -> bool:
    """Run a healthcheck / probe command (``[..., "bash", "-c", script]``) with TF Serving's REST port replaced by
    ``port``; whether it exits 0."""
    script = command[-1].replace(f"/dev/tcp/127.0.0.1/{rest_port}", f"/dev/tcp/127.0.0.1/{port}")
    assert script != command[-1], "the probe does not ask the REST port"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60, check=False)
    return proc.returncode == 0
