"""Gateway CPU per example of an embedding request's stages, native vs Python reference (issue 17), without I/O.

The demo-like manifest of ``benchmarks.request_cpu_bench`` (7 single + 2 multi features over 8 tables, dim 16, 2
dense inputs, 2 shards; Zipf ids) in the ``unique_rows`` entry mode (what ``embedgate export`` writes), with a warm
hot-row cache (every row of the request held). Stages, each timed alone (process CPU time):

* ``rest_parse``: a REST row body -> FeatureBatch as the route does it (``_rest_parse``): natively the one-pass
  check ``native.check_predict`` (serde_json tree + limits) + ``native.request_features`` (native/src/features.rs)
  vs the reference ``parse_document`` (orjson + limits) + ``batch_from_instances``;
* ``rest_parse_py_features``: the same with the native check but the Python features (the route before the native
  feature parser: the body parsed again by orjson for ``batch_from_instances``), against the same reference;
* ``rest_parse_columns``: ``rest_parse`` for the same examples in the columnar form (``{"inputs": {...}}``);
* ``grpc_parse``: gRPC feature tensors -> FeatureBatch (``batch_from_tensors``; reference only here);
* ``plan``: ``gateway.embedding.plan_lookups`` (native) vs ``plan_lookups_reference``;
* ``cache_read``: ``CachedRowSource.lookup`` all hits, on a cache with the native ``SlotIndex`` vs a ``dict``;
* ``entry_request``: ``gateway.embedding.entry_request`` (the serialized entry request, from the plan each path
  made): natively written in one pass (``native.entry_request``: each shard's rows copied once into the request) vs
  ``entry_inputs`` + ``predict_request_for`` (rows concatenated, then joined);
* ``pooled_entry_request``: the same for a ``pooled`` entry (the manifest of an older export): pooling natively
  (``native.pool_feature``) vs numpy (``_combine``), then the framing.

Rounds alternate native and reference (``EMBEDGATE_NATIVE`` auto/off) for every stage and batch; the table gives the
median µs per example over rounds (min to max) and the ratio reference ÷ native per round.

    python -m benchmarks.embedding_path_bench [--batches 1,64,512,4096] [--rounds 5] [--seconds 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.report import markers, write_section
from benchmarks.request_cpu_bench import DIM, demo_like_manifest, instances
from gateway import native
from gateway.cache import CachedRowSource, RowCache, ShardRows
from gateway.core.requests import VersionSpec
from gateway.embedding import entry_request, plan_lookups, plan_lookups_reference
from gateway.features import FeatureBatch, batch_from_instances
from gateway.grpc_front.features import batch_from_tensors
from gateway.limits import parse_document
from gateway.routes.rest_codec import parse_predict, parse_predict_native
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import FeatureKind, Manifest
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray
from tests.support.native import native_mode

STAGES = (
    "rest_parse",
    "rest_parse_py_features",
    "rest_parse_columns",
    "grpc_parse",
    "plan",
    "cache_read",
    "entry_request",
    "pooled_entry_request",
)
NATIVE_STAGES = (
    "rest_parse",
    "rest_parse_columns",
    "plan",
    "cache_read",
    "entry_request",
    "pooled_entry_request",
)
HEADING = "## Embedding hot path: native vs Python reference, per stage (issue 17)"


def _manifest(mode: str = "unique_rows") -> Manifest:
    doc = demo_like_manifest().model_dump()
    doc["entry"]["input_mode"] = mode
    return Manifest.model_validate(doc)


def _tensors(rows: list[dict[str, Any]], m: Manifest) -> dict[str, tfs_pb2.TensorProto]:
    """The gRPC front's form of ``rows``: ids [B] / [B, L] padded with -1, weights beside them, dense [B, dim]."""
    out: dict[str, tfs_pb2.TensorProto] = {}
    for f in m.sparse_features:
        if f.kind is FeatureKind.SINGLE:
            out[f.name] = from_ndarray(np.array([x[f.name] for x in rows], np.int64))
            continue
        width = max(1, max(len(x[f.name]) for x in rows))
        ids = np.full((len(rows), width), -1, np.int64)
        weights = np.zeros((len(rows), width), np.float32)
        for i, x in enumerate(rows):
            ids[i, : len(x[f.name])] = x[f.name]
            if f.weights:
                weights[i, : len(x[f.weights])] = x[f.weights]
        out[f.name] = from_ndarray(ids)
        if f.weights:
            out[f.weights] = from_ndarray(weights)
    for d in m.dense_features:
        out[d.name] = from_ndarray(np.array([x[d.name] for x in rows], np.float32).reshape(len(rows), d.dim))
    return out


class _Ones:
    """A PS answering ones (the cache is warm, so only the first read reaches it)."""

    async def lookup(self, shard_ids: Any, version: VersionSpec, deadline: float) -> ShardRows:
        values = [{t: np.ones((ids.size, DIM), np.float32) for t, ids in s.items()} for s in shard_ids]
        return ShardRows(values, ("1",) * len(values))


def _run(coro: Coroutine[Any, Any, ShardRows]) -> ShardRows:
    """A coroutine that never suspends (an all-hit cache read), run without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: ShardRows = done.value
        return result
    raise RuntimeError("the cache read suspended: the cache is not warm")


def _per_call(fn: Callable[[], object], seconds: float) -> float:
    """Process CPU seconds per call of ``fn``, calls repeated for about ``seconds``."""
    fn()
    n, spent = 0, 0.0
    start = time.process_time()
    while spent < seconds or n < 3:
        fn()
        n += 1
        spent = time.process_time() - start
    return spent / n


_LIMITS = LimitsSettings()


def _rest_parse(body: bytes, m: Manifest, mode: str, py_features: bool = False) -> FeatureBatch:
    """What the REST route runs for a predict body of an embedding model (gateway/routes/v1.py): natively the one-pass
    check (``native.check_predict``) then the features from the checked body (``native.request_features``); on the
    reference ``parse_document`` (orjson + limits) then ``batch_from_instances`` (or ``batch_from_columns``).
    ``py_features``: the native check but the Python features (the route before native/src/features.rs: orjson +
    ``batch_from_instances``)."""
    if mode == "auto":
        parsed = parse_predict_native("demo", VersionSpec(), body, _LIMITS)
        if parsed is None:
            raise RuntimeError("the native path declined the benchmark body")
        if py_features:
            parsed[1]._checked = None  # what JsonInputs.features did before: parse the document again
        return parsed[1].features(m)
    return parse_predict("demo", VersionSpec(), parse_document(body, _LIMITS), body)[1].features(m)


def _stages(m: Manifest, batch_size: int, mode: str) -> dict[str, Callable[[], object]]:
    rows = instances(batch_size)
    body = json.dumps({"instances": rows}).encode()
    columns = json.dumps({"inputs": {k: [r[k] for r in rows] for k in rows[0]}}).encode()
    tensors = _tensors(rows, m)
    batch: FeatureBatch = batch_from_instances(orjson.loads(body)["instances"], m)
    with native_mode(mode):
        cache = RowCache("demo", {t.name: t.dim for t in m.tables}, 1 << 30, settle_s=0.0)
    cache.set_serving(True)
    source = CachedRowSource(_Ones(), cache)
    planner = plan_lookups if mode == "auto" else plan_lookups_reference
    with native_mode(mode):
        plan = planner(batch, m)
    asyncio.run(source.lookup(plan.shard_ids, VersionSpec(), 0.0))  # warm: every row held
    values = _run(source.lookup(plan.shard_ids, VersionSpec(), 0.0)).values
    spec = tfs_pb2.ModelSpec(name="demo_entry")
    pooled = _manifest("pooled")
    return {
        "rest_parse": lambda: _rest_parse(body, m, mode),
        "rest_parse_py_features": lambda: _rest_parse(body, m, mode, py_features=True),
        "rest_parse_columns": lambda: _rest_parse(columns, m, mode),
        "grpc_parse": lambda: batch_from_tensors(tensors, m),
        "plan": lambda: planner(batch, m),
        "cache_read": lambda: _run(source.lookup(plan.shard_ids, VersionSpec(), 0.0)),
        "entry_request": lambda: entry_request(spec, plan, values, batch, m),
        "pooled_entry_request": lambda: entry_request(spec, plan, values, batch, pooled),
    }


def run(batches: list[int], rounds: int, seconds: float) -> dict[int, dict[str, dict[str, list[float]]]]:
    """{batch: {path: {stage: [µs per example, one per round]}}}, path "native" or "reference"."""
    m = _manifest()
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for b in batches:
        fns = {path: _stages(m, b, mode) for path, mode in (("native", "auto"), ("reference", "off"))}
        res: dict[str, dict[str, list[float]]] = {p: {s: [] for s in STAGES} for p in fns}
        for r in range(rounds):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            for stage in STAGES:
                for path in order:
                    with native_mode("auto" if path == "native" else "off"):
                        res[path][stage].append(_per_call(fns[path][stage], seconds) / b * 1e6)
        out[b] = res
        print(f"batch {b}: done", file=sys.stderr, flush=True)
    return out


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f} to {max(xs):.3f})"


def table(results: dict[int, dict[str, dict[str, list[float]]]]) -> str:
    lines = [
        "| batch | stage | reference µs/example | native µs/example | reference ÷ native |",
        "|---|---|---|---|---|",
    ]
    for b, res in results.items():
        for stage in (*STAGES, "grpc_cached", "rest_cached"):
            if stage in STAGES:
                ref, nat = res["reference"][stage], res["native"][stage]
            else:  # a whole cached request's stages: its parse + plan + cache read + entry request, per round
                parse = "grpc_parse" if stage == "grpc_cached" else "rest_parse"
                parts = (parse, "plan", "cache_read", "entry_request")
                ref = [sum(v) for v in zip(*(res["reference"][s] for s in parts), strict=True)]
                nat = [sum(v) for v in zip(*(res["native"][s] for s in parts), strict=True)]
            ratio = [x / y for x, y in zip(ref, nat, strict=True)]
            native_part = stage in NATIVE_STAGES or stage.endswith("_cached")
            name = f"**{stage}**" if native_part else stage
            lines.append(f"| {b} | {name} | {_fmt(ref)} | {_fmt(nat)} | {_fmt(ratio)}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 512, 4096])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.2, help="CPU time per stage, batch, path and round")
    p.add_argument("--write", type=Path, default=None, help="rewrite this benchmark's section of the file")
    args = p.parse_args(argv)
    with native_mode("auto"):
        if native.path() != "native":
            print("embedgate_native is not built: run `make install`", file=sys.stderr)
            return 2
    load = os.getloadavg()[0]
    results = run(args.batches, args.rounds, args.seconds)
    cmd = (
        "python -m benchmarks.embedding_path_bench --batches "
        + ",".join(map(str, args.batches))
        + f" --rounds {args.rounds} --seconds {args.seconds}"
    )
    body = (
        f"Command: `{cmd}`; {os.cpu_count()} cores; load average (1 min) {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end. Median over rounds (min to max); **bold**: stages with a native "
        f"path, and the sum of a cached request's stages.\n\n{table(results)}"
    )
    print(body)
    if args.write:
        begin, end = markers("embedding_path_bench", str(args.write))
        write_section(args.write, begin, end, body, HEADING)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
