"""serve-local's receive/parse/feed path for large entry requests: what each step costs next to a memory copy.

    .venv/bin/python -m benchmarks.decode_bench [--batches 512,2048] [--repeat 15]

For a DLRM-style entry request (26 sparse features, dim 64, 13 dense) at each batch size, in its ``pooled`` form
(``B x 26 x 64`` float32, 13.6 MB at 2048) and its ``unique_rows`` form (about 45% of the rows distinct plus int32
indices), measured in one process, best of ``--repeat``: protobuf parsing of the serialized request (what the gRPC
server does), ``embedgate.localserve.tensors.decode_tensor`` of every input (a read-only view of each
``tensor_content``), ``tf.make_ndarray`` of every input (the decode serve-local used before: one more copy), and a
plain ``ndarray.copy()`` of the same bytes (the unit). Prints one JSON document with the times in ms and their ratios
to the copy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
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
            report[f"{form}/{b}"] = {
                "request_bytes": len(raw),
                "payload_bytes": payload,
                "copy_ms": copy_ms,
                **{k: {"ms": v, "copies": round(v / copy_ms, 1)} for k, v in times.items()},
            }
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048])
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args(argv)
    print(json.dumps(run(args.batches, args.repeat), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
