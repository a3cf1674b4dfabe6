"""The PS server's own memory: serve-local's RSS serving one PS shard that holds no rows (the chart's ``ps.baselineMi``).

    .venv/bin/python -m benchmarks.ps_baseline [--rounds 3] [--dim 64]

Each round starts ``embedgate serve-local`` on a PS SavedModel written by the exporter's ``write_ps_shard`` with one
table of ``--dim`` and no rows, waits until it serves, answers one ``lookup`` of two ids, and reads the server's VmRSS.
The same run also reads the RSS of a bare ``python -c "import tensorflow"`` (most of serve-local's figure: it is a
Python process with TensorFlow loaded). ``tensorflow_model_server`` is not measured: its binary is not available
here. Prints one JSON document. Bounded: ``--rounds`` <= 10, every wait <= 300 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

_SERVED = "baseline_ps_0"
_CHILD = "import tensorflow\nfor l in open('/proc/self/status'):\n    l.startswith('VmRSS:') and print(l.split()[1])\n"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _empty_shard(root: Path, dim: int) -> Path:
    from embedgate.export.ps import write_ps_shard
    from schemas.manifest import TableSpec

    base = root / "ps_0"
    write_ps_shard(base / "1", [TableSpec(name="t", dim=dim)], {})
    return base


def _lookup(target: str) -> None:
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name, req.model_spec.signature_name = _SERVED, "lookup"
    ids = req.inputs["t_ids"]
    ids.dtype = 9  # DT_INT64
    ids.tensor_shape.dim.add(size=2)
    ids.int64_val.extend([1, 2])
    with grpc.insecure_channel(target) as channel:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=300)


def _bare_tensorflow_mb() -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, check=True, env=env
    )
    return int(out.stdout.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=64)
    args = ap.parse_args(argv)
    rounds = max(1, min(args.rounds, 10))
    from tests.support.servers import serve_local

    serve, bare = [], []
    with tempfile.TemporaryDirectory(prefix="ps-baseline-") as tmp:
        base = _empty_shard(Path(tmp), args.dim)
        for _ in range(rounds):
            bare.append(_bare_tensorflow_mb())
            with serve_local({_SERVED: base}) as server:
                _lookup(server.target)
                time.sleep(1.0)  # let the first call's allocations settle
                serve.append(_rss_mib(server.proc.pid))
    print(
        json.dumps(
            {
                "serve_local_empty_ps_rss_mib": {"median": statistics.median(serve), "all": serve},
                "bare_import_tensorflow_rss_mib": {"median": statistics.median(bare), "all": bare},
                "dim": args.dim,
                "command": f"python -m benchmarks.ps_baseline --rounds {rounds} --dim {args.dim}",
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
