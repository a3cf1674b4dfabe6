"""serve-local's receive/parse/feed path for large entry requests: what each step costs next to a memory copy.

    .venv/bin/python -m benchmarks.decode_bench [--batches 512,2048] [--repeat 15]

For a DLRM-style entry request (26 sparse features, dim 64, 13 dense) at each batch size, in its ``pooled`` form
(``B x 26 x 64`` float32, 13.6 MB at 2048) and its ``unique_rows`` form (about 45% of the rows distinct plus int32
indices), measured in one process, best of ``--repeat``: protobuf parsing of the serialized request (what the gRPC
server does), ``embedgate.localserve.tensors.decode_tensor`` of every input (a read-only view of each
``tensor_content``), ``tf.make_ndarray`` of every input (the decode serve-local used before: one more copy), and a
plain ``ndarray.copy()`` of the same bytes (the unit), and ``embedgate.localserve.request.parse_predict_request``
(the native split, read in place: ``split``; absent without the native module). Prints one JSON document with the
times in ms and their ratios to the copy.

    .venv/bin/python -m benchmarks.decode_bench --serve [--rows 200000] [--batches 512,2048] [--repeat 30]

Issue 22 item 4: the DLRM model of ``benchmarks.dlrm_bench`` (``--rows`` rows in all), exported (``unique_rows``
entry) and saved whole, loaded as serve-local's ``Servable``s in this process; its one-user and random requests at
each batch, received bytes to serialized response (``request.parse_predict_request`` + ``Servable.predict``), with
serve-local's direct paths on and off (``EMBEDGATE_SERVE_DIRECT_RUN``), the two interleaved call by call. Reports
the calling (gRPC handler) thread's CPU ms per call and the wall ms per call (medians), and entry ÷ whole. No gRPC
transport: ``benchmarks.dlrm_bench`` measures the whole call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _best_ms(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 3)


def _each(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    return [fn(x) for x in items]


def _requests(batch: int) -> dict[str, tuple[bytes, int]]:
    """Serialized pooled and unique_rows entry requests (framed by schemas.wire) and their payload bytes."""
    import numpy as np

    from schemas.wire import predict_request

    rng = np.random.default_rng(batch)
    dense = [("dense", rng.normal(size=(batch, 13)).astype(np.float32))]
    pooled = [(f"s{i}", rng.normal(size=(batch, 64)).astype(np.float32)) for i in range(26)]
    unique_rows = int(0.45 * 26 * batch)
    unique = [("rows__t", rng.normal(size=(unique_rows, 64)).astype(np.float32))]
    unique += [(f"index__s{i}", rng.integers(0, unique_rows, batch).astype(np.int32)) for i in range(26)]
    out = {}
    for name, inputs in (("pooled", pooled + dense), ("unique_rows", unique + dense)):
        out[name] = (predict_request("m", "", inputs), sum(a.nbytes for _, a in inputs))
    return out


def run(batches: list[int], repeat: int) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from embedgate.localserve import request
    from embedgate.localserve.tensors import decode_tensor

    report: dict[str, Any] = {"command": "python -m benchmarks.decode_bench " + " ".join(sys.argv[1:])}
    for b in batches:
        for form, (raw, payload) in _requests(b).items():
            req = predict_pb2.PredictRequest.FromString(raw)
            tensors = list(req.inputs.values())
            flat = np.frombuffer(raw, np.uint8)
            copy_ms = _best_ms(flat.copy, repeat)
            times = {
                "parse": _best_ms(partial(predict_pb2.PredictRequest.FromString, raw), repeat),
                "decode_tensor": _best_ms(partial(_each, decode_tensor, tensors), repeat),
                "tf_make_ndarray": _best_ms(partial(_each, tf.make_ndarray, tensors), repeat),
            }
            if request._split_fn() is not None:
                times["split"] = _best_ms(partial(request.parse_predict_request, raw), repeat)
            report[f"{form}/{b}"] = {
                "request_bytes": len(raw),
                "payload_bytes": payload,
                "copy_ms": copy_ms,
                **{k: {"ms": v, "copies": round(v / copy_ms, 1)} for k, v in times.items()},
            }
    return report


def _served(tmp: Path, rows: int, batches: list[int]) -> tuple[dict[str, Any], dict[str, dict[str, bytes]]]:
    """(``whole`` and ``entry`` Servables, ``kind/batch`` -> target -> serialized request) of the DLRM model."""
    from benchmarks.dlrm_bench import (
        _entry_requests,
        _save_whole,
        _tensor_request,
        build_dlrm,
        cardinalities,
        declaration,
        traffic,
    )
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from embedgate.localserve.servable import Servable

    cards = cardinalities(rows)
    model = build_dlrm(cards)
    r = export_model(model, Declaration.model_validate(declaration("dlrm")), tmp / "out", num_shards=1)
    _save_whole(model, tmp / "whole")
    tables = {f"t{i}": model.get_layer(f"t{i}").embeddings.numpy() for i in range(26)}
    requests = {}
    for kind in ("one_user", "random"):
        for b in batches:
            cols = traffic(kind, b, cards, seed=b)
            requests[f"{kind}/{b}"] = {
                "whole": _tensor_request("dlrm_whole", cols),
                "entry": _entry_requests(cols, tables, {"dlrm": r.manifest})["dlrm"],
            }
    servables = {
        "whole": Servable.load("dlrm_whole", 1, tmp / "whole" / "1"),
        "entry": Servable.load("dlrm_entry", 1, tmp / "out" / "dlrm" / "entry" / "1"),
    }
    return servables, requests


def _handle(servable: Any, raw: bytes) -> bytes:
    from embedgate.localserve.request import parse_predict_request

    req, contents = parse_predict_request(raw)
    out: bytes = servable.predict(req, contents=contents).SerializeToString()
    return out


def serve(rows: int, batches: list[int], repeat: int) -> dict[str, Any]:
    """The ``--serve`` report (module docs)."""
    import statistics
    import tempfile

    from embedgate.localserve.request import DIRECT_ENV
    from tests.support.native import env_set

    report: dict[str, Any] = {
        "command": "python -m benchmarks.decode_bench " + " ".join(sys.argv[1:]),
        "load_average_start": round(os.getloadavg()[0], 1),
    }
    with tempfile.TemporaryDirectory(prefix="decodebench-") as tmp_s:
        servables, requests = _served(Path(tmp_s), rows, batches)
        for key, raws in requests.items():
            got: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for i in range(repeat):
                for target, servable in servables.items():
                    for mode in ("off", "on") if i % 2 else ("on", "off"):
                        with env_set(DIRECT_ENV, mode):
                            wall, cpu = time.perf_counter(), time.thread_time()
                            _handle(servable, raws[target])
                            got.setdefault((target, mode), []).append(
                                ((time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3)
                            )
            med = {
                k: {
                    "wall_ms": round(statistics.median(x[0] for x in v), 2),
                    "thread_cpu_ms": round(statistics.median(x[1] for x in v), 2),
                }
                for k, v in got.items()
            }
            report[key] = {
                "request_bytes": {t: len(r) for t, r in raws.items()},
                **{f"{t}_{m}": med[(t, m)] for t, m in sorted(med)},
                "entry_over_whole": {
                    m: {
                        q: round(med[("entry", m)][q] / med[("whole", m)][q], 2)
                        for q in ("wall_ms", "thread_cpu_ms")
                    }
                    for m in ("off", "on")
                },
            }
        for s in servables.values():
            s.close()
    report["load_average_end"] = round(os.getloadavg()[0], 1)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument(
        "--serve", action="store_true", help="the DLRM model's handler path, direct paths on vs off"
    )
    p.add_argument("--rows", type=int, default=200_000, help="--serve: the DLRM model's rows in all")
    args = p.parse_args(argv)
    report = serve(args.rows, args.batches, args.repeat) if args.serve else run(args.batches, args.repeat)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
