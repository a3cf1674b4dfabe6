"""Load processes of ``benchmarks.updater_bench``: the direct gRPC baseline and the Kafka publisher, each run in its own
process so that neither shares an interpreter (and its GIL) with the bench's measuring loop.

    python -m benchmarks.updater_load baseline --target HOST:PORT --manifest DIR --first-id N --rows N
    python -m benchmarks.updater_load publish --bootstrap HOST:PORT --manifest DIR --first-id N --rows N
    python -m benchmarks.updater_load sustain --bootstrap HOST:PORT --manifest DIR --rate R --seconds S ...

Every mode prints JSON lines on stdout; times are ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process of
the machine), so the bench can compare them with its own clock. Rows are ``values(n, dim)``: the same rows for the
same ``n`` in every mode.

* ``baseline``: ``--rows`` fresh rows (ids ``first_id ..``) written straight to the PS with gRPC Predict
  ``upsert_<table>`` calls of ``--rows-per-call`` rows (the updater's ``batch.max_rows_per_call`` default), shards
  concurrently, one shard's calls one after another (what the updater's writer does), with the same version and
  (empty) stream-position inputs the updater sends. Prints ``{"t0", "t1", "calls"}``.
* ``publish``: the same rows published with ``DeltaPublisher`` in ``--publish-rows`` calls, as fast as it goes.
  Prints ``{"t0", "t1", "messages"}`` (first call started, last acknowledged).
* ``sustain``: ``--rate`` rows/s for ``--seconds``: every ``--tick-ms`` one ``publish`` call of the rows due since the
  start (a late call publishes what it missed, at most ``5 * rate * tick`` rows), ids cycling over ``--keys`` ids
  from ``--first-id`` (updates of existing rows once the key space went round). Every ``--probe-ms`` (25) the call also
  carries one **probe**: a fresh id (``--probe-first-id + k``) whose row is all ``k + 1``; each prints
  ``{"probe": id, "value": k + 1, "t": time before the publish call}`` as it is sent. Ends with ``{"done": true,
  "rows", "t0", "t1", "probes", "late_ticks"}``.

Bounded: at most ``--seconds`` (capped at 120) of publishing, every call with a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["main", "values"]

_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_CALL_TIMEOUT_S = 30.0


def values(n: int, dim: int) -> npt.NDArray[np.float32]:
    """The bench's rows: ``n`` x ``dim`` standard normal float32 (seed 0), the same in every process."""
    return np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _baseline(args: argparse.Namespace) -> None:
    import grpc.aio

    from schemas.manifest import Manifest, ps_model_name, upsert_signature
    from schemas.partition import shard_for
    from schemas.proto import tfs_pb2
    from schemas.tensors import from_ndarray

    manifest = Manifest.load(args.manifest)
    table = args.table
    ids = np.arange(args.first_id, args.first_id + args.rows, dtype=np.int64)
    vals = values(args.rows, manifest.table(table).dim)
    now_ms = int(time.time() * 1000)
    shards = shard_for(ids, manifest.num_shards)
    channel = grpc.aio.insecure_channel(
        args.target,
        options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ],
    )
    predict = channel.unary_unary(
        _PREDICT,
        request_serializer=tfs_pb2.PredictRequest.SerializeToString,
        response_deserializer=tfs_pb2.PredictResponse.FromString,
    )

    async def write_shard(s: int) -> int:
        s_ids, s_vals = ids[shards == s], vals[shards == s]
        calls = 0
        for start in range(0, len(s_ids), args.rows_per_call):
            chunk = s_ids[start : start + args.rows_per_call]
            req = tfs_pb2.PredictRequest(
                model_spec=tfs_pb2.ModelSpec(
                    name=ps_model_name(manifest.model_name, s), signature_name=upsert_signature(table)
                )
            )
            req.inputs["ids"].CopyFrom(from_ndarray(chunk))
            req.inputs["values"].CopyFrom(from_ndarray(s_vals[start : start + args.rows_per_call]))
            req.inputs["timestamps_ms"].CopyFrom(from_ndarray(np.full(len(chunk), now_ms, np.int64)))
            req.inputs["seqs"].CopyFrom(from_ndarray(np.zeros(len(chunk), np.int64)))
            req.inputs["stream_partitions"].CopyFrom(from_ndarray(np.zeros(0, dtype=object)))
            req.inputs["stream_offsets"].CopyFrom(from_ndarray(np.zeros(0, np.int64)))
            req.inputs["stream_expected"].CopyFrom(from_ndarray(np.zeros(0, np.int64)))
            await predict(req, timeout=_CALL_TIMEOUT_S)
            calls += 1
        return calls

    try:
        # one tiny call first: the channel's connection is not part of the measurement
        await asyncio.wait_for(channel.channel_ready(), _CALL_TIMEOUT_S)
        t0 = time.monotonic()
        calls = await asyncio.gather(*(write_shard(s) for s in range(manifest.num_shards)))
        t1 = time.monotonic()
    finally:
        await channel.close()
    _emit({"t0": t0, "t1": t1, "calls": sum(calls)})


async def _publish(args: argparse.Namespace) -> None:
    from schemas.manifest import Manifest
    from updater.producer import DeltaPublisher

    manifest = Manifest.load(args.manifest)
    ids = np.arange(args.first_id, args.first_id + args.rows, dtype=np.int64)
    vals = values(args.rows, manifest.table(args.table).dim)
    async with DeltaPublisher(args.bootstrap) as pub:
        await pub.partitions(f"embedgate.deltas.{manifest.model_name}", manifest.num_shards)
        messages = 0
        t0 = time.monotonic()
        for start in range(0, len(ids), args.publish_rows):
            sl = slice(start, start + args.publish_rows)
            res = await asyncio.wait_for(
                pub.publish(manifest, args.table, ids[sl], vals[sl]), _CALL_TIMEOUT_S
            )
            messages += res.messages
        t1 = time.monotonic()
    _emit({"t0": t0, "t1": t1, "messages": messages})


async def _sustain(args: argparse.Namespace) -> None:
    from schemas.manifest import Manifest
    from updater.producer import DeltaPublisher

    manifest = Manifest.load(args.manifest)
    dim = manifest.table(args.table).dim
    rate, tick = float(args.rate), args.tick_ms / 1000
    seconds = min(args.seconds, 120.0)
    pool = values(4096, dim)  # rows are reused: generating them is not the publisher's job here
    max_call = max(1, int(5 * rate * tick))
    async with DeltaPublisher(args.bootstrap) as pub:
        await pub.partitions(f"embedgate.deltas.{manifest.model_name}", manifest.num_shards)
        sent = probes = late = 0
        next_probe = 0.0
        t0 = time.monotonic()
        t_end = t0 + seconds
        now = t0
        while now < t_end:
            due = min(int(rate * (now - t0)) - sent, max_call)
            if due > 0:
                k = np.arange(sent, sent + due, dtype=np.int64)
                ids = args.first_id + k % args.keys
                rows = pool[k % len(pool)]
                probe: dict[str, Any] | None = None
                if now - t0 >= next_probe:
                    value = float(probes + 1)
                    probe = {"probe": args.probe_first_id + probes, "value": value}
                    ids = np.append(ids, np.int64(probe["probe"]))
                    rows = np.vstack([rows, np.full((1, dim), value, np.float32)])
                    probes += 1
                    next_probe += args.probe_ms / 1000
                t_call = time.monotonic()
                if probe is not None:
                    probe["t"] = t_call
                    _emit(probe)
                await asyncio.wait_for(pub.publish(manifest, args.table, ids, rows), _CALL_TIMEOUT_S)
                sent += due
            wake = t0 + (int((time.monotonic() - t0) / tick) + 1) * tick
            now = time.monotonic()
            if wake - now < 0:
                late += 1
            await asyncio.sleep(max(0.0, wake - now))
            now = time.monotonic()
        t1 = time.monotonic()
    _emit({"done": True, "rows": sent + probes, "t0": t0, "t1": t1, "probes": probes, "late_ticks": late})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["baseline", "publish", "sustain"])
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--table", default="t")
    ap.add_argument("--target", help="PS gRPC target (baseline)")
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (publish, sustain)")
    ap.add_argument("--first-id", type=int, default=0)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rows-per-call", type=int, default=16384)
    ap.add_argument("--publish-rows", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--tick-ms", type=float, default=20.0)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--probe-ms", type=float, default=25.0)
    ap.add_argument("--probe-first-id", type=int, default=900_000_000)
    args = ap.parse_args(argv)
    if args.rows < 1 or args.rate <= 0 or args.keys < 1 or args.tick_ms <= 0 or args.probe_ms <= 0:
        ap.error("--rows, --rate, --keys, --tick-ms and --probe-ms must be positive")
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    if args.mode == "baseline":
        if not args.target:
            ap.error("baseline needs --target")
        asyncio.run(_baseline(args))
    else:
        if not args.bootstrap:
            ap.error(f"{args.mode} needs --bootstrap")
        asyncio.run(_publish(args) if args.mode == "publish" else _sustain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
