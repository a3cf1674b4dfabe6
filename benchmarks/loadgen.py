"""Real load generators, run as subprocesses on 127.0.0.1: ghz (gRPC) and vegeta (HTTP), both built from the Go module
proxy into ``.cache/go-bin`` by ``make bench-tools``; and ``benchmarks.split_client`` (a bare grpc.aio client doing
the split's PS lookups + entry call) in its own process.

Every run is bounded by a duration and a subprocess time limit. Each returns a :class:`Result` with latency
percentiles (ms), throughput (requests/s), the request count and the error count (a run with errors is reported,
never silently averaged in).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["BIN", "Result", "ghz", "protoset", "split_client", "vegeta"]

_REPO = Path(__file__).resolve().parent.parent
BIN = _REPO / ".cache" / "go-bin"
PREDICT = "tensorflow.serving.PredictionService.Predict"


@dataclass(frozen=True)
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    requests: int
    errors: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `make bench-tools` (make bench does)")
    return str(path)


def protoset(dest: Path) -> Path:
    """A FileDescriptorSet holding TF Serving's PredictionService (from the official tensorflow-serving-api protos),
    which ghz needs to call it."""
    from google.protobuf import descriptor_pb2
    from tensorflow_serving.apis import prediction_service_pb2

    files: dict[str, Any] = {}

    def add(fd: Any) -> None:
        if fd.name in files:
            return
        for dep in fd.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        files[fd.name] = proto

    add(prediction_service_pb2.DESCRIPTOR)
    dest.write_bytes(descriptor_pb2.FileDescriptorSet(file=list(files.values())).SerializeToString())
    return dest


def ghz(
    target: str, request: bytes, proto_set: Path, *, clients: int, seconds: float, rate: float = 0
) -> Result:
    """``clients`` concurrent gRPC Predict calls of the serialized ``request`` for ``seconds`` (one connection each);
    with ``rate`` > 0 at most that many calls per second (ghz ``--rps``, open loop while ``clients`` suffice)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as data:
        data.write(request)
        data.flush()
        cmd = [
            _tool("ghz"),
            "--insecure",
            "--protoset",
            str(proto_set),
            "--call",
            PREDICT,
            "--binary-file",
            data.name,
            "--concurrency",
            str(clients),
            "--connections",
            str(clients),
            "--duration",
            f"{seconds}s",
            "--timeout",
            "30s",
            "--duration-stop",
            "wait",
            "--format",
            "json",
            target,
        ]
        if rate > 0:
            cmd[-1:-1] = ["--rps", f"{rate:.0f}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise RuntimeError(f"ghz failed: {proc.stderr.strip()[-2000:]}")
    doc = json.loads(proc.stdout)
    dist = {int(d["percentage"]): d["latency"] / 1e6 for d in doc.get("latencyDistribution") or []}
    if not dist and doc.get("details"):  # no distribution when no call was OK: from every call's latency
        lat = sorted(d["latency"] / 1e6 for d in doc["details"])
        dist = {q: lat[min(len(lat) - 1, int(q / 100 * len(lat)))] for q in (50, 99)}
    codes = doc.get("statusCodeDistribution") or {}
    return Result(
        p50_ms=round(dist.get(50, float("nan")), 3),
        p99_ms=round(dist.get(99, float("nan")), 3),
        rps=round(doc["rps"], 1),
        requests=int(doc["count"]),
        errors=sum(n for code, n in codes.items() if code != "OK"),
    )


def vegeta(url: str, body: bytes, *, clients: int, seconds: float, rate: float = 0) -> Result:
    """``clients`` workers POSTing ``body`` (JSON) to ``url`` as fast as they are answered, for ``seconds``; with
    ``rate`` > 0, open loop at that many requests/s instead (up to ``clients`` connections)."""
    with tempfile.TemporaryDirectory(prefix="vegeta-") as tmp:
        body_path = Path(tmp) / "body.json"
        body_path.write_bytes(body)
        targets = Path(tmp) / "targets.txt"
        targets.write_text(f"POST {url}\nContent-Type: application/json\n@{body_path}\n")
        attack = [
            _tool("vegeta"),
            "attack",
            f"-targets={targets}",
            "-format=http",
            f"-rate={rate:.0f}/s" if rate > 0 else "-rate=0",
            f"-workers={clients}",
            f"-max-workers={clients}",
            f"-connections={clients}",
            f"-duration={seconds}s",
            "-timeout=30s",
            "-keepalive=true",
        ]
        out = Path(tmp) / "results.bin"
        with out.open("wb") as sink:
            subprocess.run(attack, stdout=sink, timeout=seconds + 60, check=True)
        report = subprocess.run(
            [_tool("vegeta"), "report", "-type=json", str(out)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    doc = json.loads(report.stdout)
    lat = doc["latencies"]
    codes = doc.get("status_codes") or {}
    return Result(
        p50_ms=round(lat["50th"] / 1e6, 3),
        p99_ms=round(lat["99th"] / 1e6, 3),
        rps=round(doc["throughput"], 1),
        requests=int(doc["requests"]),
        errors=sum(n for code, n in codes.items() if code != "200"),
    )


def split_client(target: str, requests_file: Path, *, clients: int, seconds: float) -> Result:
    """The bare split client (``benchmarks.split_client``) in its own process."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.split_client",
        "--target",
        target,
        "--requests",
        str(requests_file),
        "--clients",
        str(clients),
        "--seconds",
        str(seconds),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, cwd=_REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"split_client failed: {proc.stderr.strip()[-2000:]}")
    return Result(**json.loads(proc.stdout))
