"""Where the gRPC front spends CPU per example on a PredictRequest, stage by stage, without I/O (issue 17 item 3's
profile: does decoding the request's tensors natively pay?).

    .venv/bin/python -m benchmarks.grpc_decode_bench [--batches 64 512 4096] [--repeat 5] [--write docs/benchmarks.md]

Requests: the demo-like embedding model of ``benchmarks.request_cpu_bench`` (7 single-id features, 2 multi-id
features padded with -1, one weights tensor, 2 dense inputs; Zipf ids) sent as gRPC tensors, encoded two ways:
``content`` (``tensor_content`` bytes, what ``tf.make_tensor_proto`` of a numpy array and our own clients send)
and ``typed`` (the repeated ``int64_val`` / ``float_val`` fields, what hand-built protos send); and a pass-through
model's request (13 float32 + 26 int64 inputs per example, ``content``), whose inputs the gateway forwards as the
client's bytes. Stages, each timed alone on the same bytes (process CPU time, best of ``--repeat``, µs per example):

* ``parse``: ``grpc_front.messages.parse_message`` (protobuf's C parser, then the rank/shape/size guards);
* ``decode``: every input TensorProto -> numpy (``grpc_front.features._decode``: a view of ``tensor_content``, or
  a copy of the typed field) — the step a native decoder from the raw bytes would replace, with ``parse``;
* ``features``: ``batch_from_tensors`` (decode + validation + the feature batch), for the embedding model;
* ``plan`` and ``pool+encode``: the rest of the gateway's per-request CPU (lookup plan, pooling into the entry
  request), for scale.

A pass-through request is parsed and checked, then forwarded as bytes: it has no ``decode`` stage.
"""

from __future__ import annotations

import argparse
import os
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import markers, write_section
from benchmarks.request_cpu_bench import DIM, demo_like_manifest, instances
from gateway.embedding import plan_lookups, pool
from gateway.grpc_front.features import _decode, batch_from_tensors
from gateway.grpc_front.messages import parse_message
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray

__all__ = ["main"]

DT = tfs_pb2.DataType


def _typed(arr: np.ndarray) -> tfs_pb2.TensorProto:
    """``arr`` as a TensorProto with the typed value field instead of ``tensor_content``."""
    t = tfs_pb2.TensorProto(dtype=DT.DT_INT64 if arr.dtype.kind in "iu" else DT.DT_FLOAT)
    t.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in arr.shape)
    if arr.dtype.kind in "iu":
        t.int64_val.extend(arr.astype(np.int64).reshape(-1).tolist())
    else:
        t.float_val.extend(arr.astype(np.float32).reshape(-1).tolist())
    return t


def embedding_request(n: int, manifest: Manifest, typed: bool) -> bytes:
    """The demo-like model's PredictRequest of ``n`` examples, serialized."""
    rows = instances(n)
    arrays: dict[str, np.ndarray] = {}
    for f in manifest.sparse_features:
        if f.kind.value == "single":
            arrays[f.name] = np.array([r[f.name] for r in rows], np.int64)
            continue
        width = f.max_ids or 1
        ids = np.full((n, width), -1, np.int64)
        weights = np.zeros((n, width), np.float32)
        for i, r in enumerate(rows):
            ids[i, : len(r[f.name])] = r[f.name]
            if f.weights:
                weights[i, : len(r[f.weights])] = r[f.weights]
        arrays[f.name] = ids
        if f.weights:
            arrays[f.weights] = weights
    for d in manifest.dense_features:
        arrays[d.name] = np.array([r[d.name] for r in rows], np.float32).reshape(n, d.dim)
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = "demo"
    for name, arr in arrays.items():
        req.inputs[name].CopyFrom(_typed(arr) if typed else from_ndarray(arr))
    raw: bytes = req.SerializeToString()
    return raw


def passthrough_request(n: int) -> bytes:
    rng = np.random.default_rng(0)
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = "plain"
    req.inputs["dense"].CopyFrom(from_ndarray(rng.random((n, 13), dtype=np.float32)))
    req.inputs["ids"].CopyFrom(from_ndarray(rng.integers(0, 2_000_000, (n, 26), dtype=np.int64)))
    raw: bytes = req.SerializeToString()
    return raw


def _decode_all(msg: tfs_pb2.PredictRequest) -> list[np.ndarray]:
    return [_decode(k, t) for k, t in msg.inputs.items()]


def _us_per_example(fn: Callable[[], Any], n: int, repeat: int) -> float:
    number = max(1, 2000 // n)
    times = timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)
    return min(times) / number * 1e6 / n


def run(batches: list[int], repeat: int) -> list[dict[str, Any]]:
    manifest = demo_like_manifest()
    limits = LimitsSettings(max_instances=max(batches))
    max_body = 256 * 1024 * 1024
    rows: list[dict[str, Any]] = []
    for n in batches:
        for label, typed in (("content", False), ("typed", True)):
            raw = embedding_request(n, manifest, typed)
            msg = parse_message(tfs_pb2.PredictRequest, raw, limits, max_body).message
            batch = batch_from_tensors(msg.inputs, manifest)
            plan = plan_lookups(batch, manifest)
            values = [
                {t: np.ones((ids.size, DIM), np.float32) for t, ids in s.items()} for s in plan.shard_ids
            ]

            def pool_fn(plan: Any = plan, values: Any = values, batch: Any = batch) -> None:
                req = tfs_pb2.PredictRequest()
                for k, arr in {**pool(plan, values, batch, manifest), **batch.dense}.items():
                    req.inputs[k].CopyFrom(from_ndarray(arr, DT.DT_FLOAT))

            stages: dict[str, Callable[[], Any]] = {
                "parse": partial(parse_message, tfs_pb2.PredictRequest, raw, limits, max_body),
                "decode": partial(_decode_all, msg),
                "features": partial(batch_from_tensors, msg.inputs, manifest),
                "plan": partial(plan_lookups, batch, manifest),
                "pool+encode": pool_fn,
            }
            row: dict[str, Any] = {"model": f"demo ({label})", "batch": n, "bytes": len(raw)}
            for name, fn in stages.items():
                row[name] = _us_per_example(fn, n, repeat)
            rows.append(row)
            print(row, flush=True)
        raw = passthrough_request(n)
        row = {"model": "pass-through (content)", "batch": n, "bytes": len(raw)}
        row["parse"] = _us_per_example(
            partial(parse_message, tfs_pb2.PredictRequest, raw, limits, max_body), n, repeat
        )
        rows.append(row)
        print(row, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["parse", "decode", "features", "plan", "pool+encode"]
    lines = [
        "| request | batch | message bytes | " + " | ".join(f"{c} µs/ex" for c in cols) + " | decode ÷ all |",
        "|---|---|---|" + "---|" * (len(cols) + 1),
    ]
    for r in rows:
        cells = [f"{r[c]:.3f}" if c in r else "-" for c in cols]
        total = r["parse"] + r.get("features", 0.0) + r.get("plan", 0.0) + r.get("pool+encode", 0.0)
        share = f"{100 * r['decode'] / total:.1f} %" if "decode" in r else "-"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['bytes']:,} | " + " | ".join(cells) + f" | {share} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 512, 4096])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--write", type=Path, default=None, help="rewrite this benchmark's section of the file")
    args = p.parse_args(argv)
    text = table(run(args.batches, args.repeat))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    batches = " ".join(map(str, args.batches))
    cmd = f"python -m benchmarks.grpc_decode_bench --batches {batches} --repeat {args.repeat}"
    body = (
        f"Command: `{cmd}`; process CPU time, best of {args.repeat}, µs per example; load average at the end: "
        f"{load}. `decode ÷ all`: the decode stage's share of parse + features + plan + pool+encode.\n\n{text}"
    )
    print(body)
    if args.write:
        begin, end = markers("grpc_decode_bench", str(args.write))
        write_section(args.write, begin, end, body, "## gRPC PredictRequest decode profile (issue 17 item 3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
