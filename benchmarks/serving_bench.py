"""What the split costs a client: the gateway vs the whole model vs a bare split client, with real load generators.

    .venv/bin/python -m benchmarks.serving_bench [--batches 1,64,512,4096] [--rounds 3] [--seconds 4] [--full]
                                                 [--write docs/benchmarks.md]

Setup, all on 127.0.0.1: the demo model (``--full``: the ``make run`` demo; default the small one), exported as entry
+ 2 PS shards AND saved whole as one SavedModel (``demo_whole``, the Keras model with its embedding tables inside);
one serve-local process serves all of them (so both sides share the same backend and its TensorFlow); one
``embedgate gateway`` in front of the split model, with a pass-through model ``whole`` -> ``demo_whole``.

Measured, per batch size, interleaved (every round runs every target once, in a rotated order; rounds repeat):

* ``whole``: ghz, gRPC Predict of the whole SavedModel (the baseline the split must approach);
* ``split_bare``: ``benchmarks.split_client`` (own process), the PS lookups + entry call with inputs pooled once;
* ``gateway_rest``: vegeta, REST ``:predict`` of the instances through the gateway;
* ``gateway_grpc``: ghz, gRPC Predict of the features through the gateway (when the gateway has a gRPC port);
* ``gateway_grpc_cache``: the same through a second gateway with a hot-row cache (``--cache-mib``, fed by a Kafka
  broker); the requests repeat, so the cache is warm.

Latency is p50/p99 at one client; throughput is requests/s at each of ``--clients`` client counts (default 1,2,4,8)
at batch 64 (every target, the cached gateway included; 4 clients is the headline). Pass-through: gateway (REST and gRPC) vs direct gRPC to ``demo_whole`` at 8
clients. Ratios are per round, then the median and the min-max spread over rounds are reported. Prints one JSON document; ``--write FILE`` also rewrites the section
between the ``serving_bench`` markers of FILE and two PNG plots beside it (``img/serving_latency.png``: latency vs
batch size; ``img/serving_throughput.png``: throughput vs clients).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Result, ghz, protoset, split_client, vegeta
from benchmarks.report import markers, write_section

__all__ = ["main"]

_REPO = Path(__file__).resolve().parent.parent
BEGIN, END = markers("serving_bench")
TARGET_CLIENTS = 4  # issue 7: throughput at 4 clients >= 0.7x the whole model's


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _save_whole(keras_path: Path, dest: Path) -> dict[str, Any]:
    """The whole Keras model as one SavedModel (version 1 under ``dest``); returns its input specs (name -> dtype)."""
    import keras
    import tensorflow as tf

    import embedgate.export.layers  # noqa: F401  (registers the demo's custom layers)

    model = keras.models.load_model(keras_path)
    specs = {x.name: tf.TensorSpec(x.shape, x.dtype, name=x.name) for x in model.inputs}

    def serve(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ctr": model(inputs, training=False)}

    module = tf.Module()
    module.variables_ = [getattr(v, "value", v) for v in model.variables]
    module.model = model
    tf.saved_model.save(
        module,
        str(dest / "1"),
        signatures={"serving_default": tf.function(serve, input_signature=[specs]).get_concrete_function()},
    )
    return {name: spec.dtype.name for name, spec in specs.items()}


def _official_request(name: str, arrays: dict[str, Any]) -> bytes:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    req = predict_pb2.PredictRequest()
    req.model_spec.name = name
    req.model_spec.signature_name = "serving_default"
    for k, v in arrays.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    return bytes(req.SerializeToString())


def _split_requests(instances: list[dict[str, Any]], manifest: Any, path: Path, backend: str) -> None:
    """The bare client's requests: lookups per shard (ids planned by the gateway's own code) + entry, pooled once."""
    import grpc
    import numpy as np

    from benchmarks.split_client import write_requests
    from gateway.embedding import entry_inputs, plan_lookups
    from gateway.features import batch_from_instances
    from schemas.manifest import entry_model_name, lookup_ids_input, lookup_values_output, ps_model_name
    from schemas.proto import tfs_pb2
    from schemas.tensors import from_ndarray, to_ndarray
    from schemas.wire import predict_request

    batch = batch_from_instances(instances, manifest)
    plan = plan_lookups(batch, manifest)
    lookups = []
    values = []
    with grpc.insecure_channel(backend) as ch:
        predict = ch.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        for i in range(manifest.num_shards):
            req = tfs_pb2.PredictRequest()
            req.model_spec.name = ps_model_name(manifest.model_name, i)
            req.model_spec.signature_name = "lookup"
            for t in manifest.tables:
                ids = plan.shard_ids[i][t.name].astype(np.int64)
                req.inputs[lookup_ids_input(t.name)].CopyFrom(from_ndarray(ids))
            lookups.append(req.SerializeToString())
            resp = predict(req, timeout=30)
            values.append(
                {
                    t.name: to_ndarray(resp.outputs[lookup_values_output(t.name)]).reshape(-1, t.dim)
                    for t in manifest.tables
                }
            )
    # the entry's inputs as the gateway builds them (pooled rows, or unique rows + indices: the manifest's mode)
    entry = predict_request(
        entry_model_name(manifest.model_name), "", entry_inputs(plan, values, batch, manifest)
    )
    write_requests(path, lookups, entry)


def _gateway_grpc_request(instances: list[dict[str, Any]], manifest: Any) -> bytes:
    """The features as the gateway's gRPC front takes them (docs/gateway.md, "gRPC"): ids int64 [B] for a single id,
    -1-padded [B, L] for a list, weights float32 [B, L], dense float32 [B, dim]."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from schemas.manifest import FeatureKind

    req = predict_pb2.PredictRequest()
    req.model_spec.name = manifest.model_name
    req.model_spec.signature_name = "serving_default"
    b = len(instances)
    for f in manifest.sparse_features:
        if f.kind is FeatureKind.SINGLE:
            ids = np.array([int(x[f.name]) for x in instances], np.int64)
            req.inputs[f.name].CopyFrom(tf.make_tensor_proto(ids))
            continue
        lists = [list(x.get(f.name, [])) for x in instances]
        width = max(1, max(len(v) for v in lists))
        padded = np.full((b, width), -1, np.int64)
        for i, v in enumerate(lists):
            padded[i, : len(v)] = v
        req.inputs[f.name].CopyFrom(tf.make_tensor_proto(padded))
        if f.weights is not None:
            w = np.zeros((b, width), np.float32)
            for i, x in enumerate(instances):
                ws = x.get(f.weights, [1.0] * len(lists[i]))
                w[i, : len(ws)] = ws
            req.inputs[f.weights].CopyFrom(tf.make_tensor_proto(w))
    for d in manifest.dense_features:
        vals = np.array([x[d.name] for x in instances], np.float32).reshape(b, d.dim)
        req.inputs[d.name].CopyFrom(tf.make_tensor_proto(vals))
    return bytes(req.SerializeToString())


def _summary(rounds: list[dict[str, Result]], key: str, baseline: str) -> dict[str, Any]:
    """Median and spread of each target's ``key`` and of its per-round ratio to ``baseline``."""
    out: dict[str, Any] = {}
    for target in rounds[0]:
        vals = [r[target].as_dict()[key] for r in rounds]
        ratios = [r[target].as_dict()[key] / r[baseline].as_dict()[key] for r in rounds]
        out[target] = {
            key: round(statistics.median(vals), 3),
            "min": round(min(vals), 3),
            "max": round(max(vals), 3),
            "ratio": round(statistics.median(ratios), 2),
            "ratio_min": round(min(ratios), 2),
            "ratio_max": round(max(ratios), 2),
            "errors": sum(r[target].errors for r in rounds),
        }
    return out


@dataclass(frozen=True)
class _Loads:
    """The requests of one batch size and where each target sends them; :meth:`at` gives every target's load
    generator at ``clients`` clients (``grpc_targets``: target name -> a gateway's gRPC address)."""

    backend: str
    proto_set: Path
    seconds: float
    whole_req: bytes
    split_file: Path
    rest_url: str
    rest_body: bytes
    grpc_req: bytes
    grpc_targets: dict[str, str]

    def at(self, clients: int) -> dict[str, Callable[[], Result]]:
        c, secs = clients, self.seconds
        out: dict[str, Callable[[], Result]] = {
            "whole": partial(ghz, self.backend, self.whole_req, self.proto_set, clients=c, seconds=secs),
            "split_bare": partial(split_client, self.backend, self.split_file, clients=c, seconds=secs),
            "gateway_rest": partial(vegeta, self.rest_url, self.rest_body, clients=c, seconds=secs),
        }
        for name, address in self.grpc_targets.items():
            out[name] = partial(ghz, address, self.grpc_req, self.proto_set, clients=c, seconds=secs)
        return out


def _interleaved(targets: dict[str, Callable[[], Result]], rounds: int) -> list[dict[str, Result]]:
    names = list(targets)
    out = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        out.append({n: targets[n]() for n in order})
        print(
            f"  round {r + 1}: " + ", ".join(f"{n} {v.p50_ms} ms/{v.rps} rps" for n, v in out[-1].items()),
            file=sys.stderr,
            flush=True,
        )
    return [{n: res[n] for n in names} for res in out]


def _gateway_config(
    tmp: Path,
    demo: Any,
    backend: str,
    grpc_port: int | None,
    extra: dict[str, Any],
    name: str = "gateway.yaml",
    *,
    embedding_only: bool = False,
) -> Path:
    """The gateway's config file ``tmp / name``: the demo's embedding model, and (unless ``embedding_only``) the
    whole model and the entry as pass-through models on the same backend."""
    import yaml

    from schemas.manifest import entry_model_name

    m = demo.manifest
    cfg: dict[str, Any] = {
        "log": {"access": False},
        "max_body_bytes": 256 * 1024 * 1024,
        "models": [
            {
                "kind": "embedding",
                "name": m.model_name,
                "manifest": str(demo.model_dir),
                "entry": backend,
                "shards": [{"replicas": [backend]}] * m.num_shards,
            },
            {"kind": "passthrough", "name": "whole", "target": backend, "backend_name": "demo_whole"},
            {
                "kind": "passthrough",
                "name": "entry",
                "target": backend,
                "backend_name": entry_model_name(m.model_name),
            },
        ],
        **extra,
    }
    if embedding_only:
        cfg["models"] = cfg["models"][:1]
    if grpc_port is not None:
        cfg["grpc_port"] = grpc_port
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


def _wait_cache_serving(url: str, model: str, limit_s: float = 60.0) -> None:
    """Until the gateway's /readyz says its hot-row cache serves ``model`` (bounded: SystemExit after ``limit_s``)."""
    import httpx

    stop = time.monotonic() + limit_s
    while time.monotonic() < stop:
        doc = httpx.get(f"{url}/readyz", timeout=5).json()
        if doc.get("cache", {}).get("models", {}).get(model, {}).get("serving"):
            return
        time.sleep(0.5)
    raise SystemExit(f"the cached gateway's cache did not start serving within {limit_s:g} s: {doc}")


def _gateway_settings_keys() -> set[str]:
    from schemas.gateway_settings import GatewaySettings

    return set(GatewaySettings.model_fields)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    report: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "command": "python -m benchmarks.serving_bench " + " ".join(sys.argv[1:]),
        "load_average_start": round(os.getloadavg()[0], 1),
    }
    with tempfile.TemporaryDirectory(prefix="servingbench-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        demo = build_demo(tmp / "demo", small=not args.full)
        m = demo.manifest
        whole_inputs = _save_whole(demo.keras_path, tmp / "whole")
        print(f"demo built and saved whole in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        served = {**exported_backends(demo.model_dir), "demo_whole": tmp / "whole"}
        vocab = 100_000 if args.full else 5_000
        proto_set = protoset(tmp / "tfs.protoset")
        with serve_local(served, extra_args=tuple(args.serve_local_arg)) as backend:
            has_grpc = "grpc_port" in _gateway_settings_keys()
            grpc_port = free_port() if has_grpc else None
            cfg = _gateway_config(tmp, demo, backend.target, grpc_port, json.loads(args.gateway_extra))
            stack = contextlib.ExitStack()
            cache_port: int | None = None
            if args.cache_mib and grpc_port is not None:
                from tests.support.kafka import kafka_broker

                broker = stack.enter_context(kafka_broker(tmp / "kafka"))
                # the delta topic exists in a deployment (the updater creates it); the cache serves once assigned
                asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
                cache_port = free_port()
                cache = {"max_bytes": args.cache_mib << 20, "bootstrap_servers": broker.bootstrap}
                ccfg = _gateway_config(tmp, demo, backend.target, cache_port, {"cache": cache}, "cached.yaml")
                cached_gw = stack.enter_context(run_gateway(ccfg))
                _wait_cache_serving(cached_gw.url, m.model_name)
                report["cached_gateway_rss_mb_start"] = round(_rss_mb(cached_gw.proc.pid), 1)
            with stack, run_gateway(cfg) as gw:
                report["gateway_rss_mb_start"] = round(_rss_mb(gw.proc.pid), 1)
                latency: dict[str, Any] = {}
                grpc_targets = {
                    name: f"127.0.0.1:{port}"
                    for name, port in (("gateway_grpc", grpc_port), ("gateway_grpc_cache", cache_port))
                    if port is not None
                }
                for b in args.batches:
                    instances, _ = make_examples(b, vocab, seed=b)
                    keras_in = demo.keras_inputs(instances)
                    keras_in = {k: np.asarray(v).astype(whole_inputs[k]) for k, v in keras_in.items()}
                    whole_req = _official_request("demo_whole", keras_in)
                    rest_body = json.dumps({"instances": instances}).encode()
                    split_file = tmp / f"split_{b}.bin"
                    _split_requests(instances, m, split_file, backend.target)
                    loads = _Loads(
                        backend=backend.target,
                        proto_set=proto_set,
                        seconds=args.seconds,
                        whole_req=whole_req,
                        split_file=split_file,
                        rest_url=f"{gw.url}/v1/models/{m.model_name}:predict",
                        rest_body=rest_body,
                        grpc_req=_gateway_grpc_request(instances, m) if grpc_targets else b"",
                        grpc_targets=grpc_targets,
                    )
                    print(f"batch {b}: latency at 1 client", file=sys.stderr, flush=True)
                    latency[str(b)] = _summary(_interleaved(loads.at(1), args.rounds), "p50_ms", "whole")
                    if b == args.throughput_batch:
                        by_clients: dict[str, Any] = {}
                        for c in args.clients:
                            print(f"batch {b}: throughput at {c} clients", file=sys.stderr, flush=True)
                            by_clients[str(c)] = _summary(
                                _interleaved(loads.at(c), args.rounds), "rps", "whole"
                            )
                        report["throughput_by_clients"] = {"batch": b, "clients": by_clients}
                        headline = TARGET_CLIENTS if TARGET_CLIENTS in args.clients else args.clients[-1]
                        report["throughput"] = {"batch": b, "clients": headline, **by_clients[str(headline)]}
                report["latency_p50"] = latency
                # pass-through: the whole model through the gateway vs directly
                instances, _ = make_examples(args.throughput_batch, vocab, seed=7)
                keras_in = {
                    k: np.asarray(v).astype(whole_inputs[k]) for k, v in demo.keras_inputs(instances).items()
                }
                direct = _official_request("demo_whole", keras_in)
                via = _official_request("whole", keras_in)
                rest = json.dumps({"inputs": {k: v.tolist() for k, v in keras_in.items()}}).encode()
                pt: dict[str, Callable[[], Result]] = {
                    "direct_grpc": lambda: ghz(
                        backend.target, direct, proto_set, clients=8, seconds=args.seconds
                    ),
                    "gateway_rest": lambda: vegeta(
                        f"{gw.url}/v1/models/whole:predict", rest, clients=8, seconds=args.seconds
                    ),
                }
                if grpc_port is not None:
                    pt["gateway_grpc"] = lambda: ghz(
                        f"127.0.0.1:{grpc_port}", via, proto_set, clients=8, seconds=args.seconds
                    )
                print("pass-through at 8 clients", file=sys.stderr, flush=True)
                rounds = _interleaved(pt, args.rounds)
                report["passthrough"] = {
                    "clients": 8,
                    "batch": args.throughput_batch,
                    "rps": _summary(rounds, "rps", "direct_grpc"),
                    "p99_ms": _summary(rounds, "p99_ms", "direct_grpc"),
                }
                report["gateway_rss_mb_after"] = round(_rss_mb(gw.proc.pid), 1)
                report["load_average_end"] = round(os.getloadavg()[0], 1)
    return report


def _load_line(report: dict[str, Any]) -> str:
    start, end = report.get("load_average_start"), report.get("load_average_end")
    return f"Load average (1 min, other jobs included) at the start / end of the run: {start} / {end}."


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['machine']['cores']} cores; command: `{report['command']}`; load generators: ghz (gRPC),",
        "vegeta (HTTP), benchmarks.split_client (own process). Median over rounds, [min-max] in brackets.",
        _load_line(report),
        "",
        "**Latency p50 at one client (ms) and ratio to the whole model**",
        "",
    ]
    targets = list(next(iter(report["latency_p50"].values())))
    lines.append("| batch | " + " | ".join(targets) + " |")
    lines.append("|---" * (len(targets) + 1) + "|")
    for b, row in report["latency_p50"].items():
        cells = [
            f"{row[t]['p50_ms']} ms ({row[t]['ratio']}x [{row[t]['ratio_min']}-{row[t]['ratio_max']}])"
            for t in targets
        ]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    if "throughput_by_clients" in report:
        tc = report["throughput_by_clients"]
        counts = list(tc["clients"])
        lines += [
            "",
            f"**Throughput vs clients, batch {tc['batch']} (requests/s, ratio to whole; target at {TARGET_CLIENTS})**",
            "",
        ]
        lines.append(
            "| target | " + " | ".join(f"{c} client{'s' if c != '1' else ''}" for c in counts) + " |"
        )
        lines.append("|---" * (len(counts) + 1) + "|")
        for t in tc["clients"][counts[0]]:
            cells = []
            for c in counts:
                x = tc["clients"][c][t]
                cells.append(
                    f"{x['rps']} [{x['min']}-{x['max']}] ({x['ratio']}x [{x['ratio_min']}-{x['ratio_max']}])"
                )
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    pt = report["passthrough"]
    lines += [
        "",
        f"**Pass-through, {pt['clients']} clients, batch {pt['batch']}: gateway vs direct gRPC**",
        "",
    ]
    lines.append("| path | req/s | ratio | p99 ms | ratio |")
    lines.append("|---|---|---|---|---|")
    for t in pt["rps"]:
        r, p = pt["rps"][t], pt["p99_ms"][t]
        lines.append(
            f"| {t} | {r['rps']} | {r['ratio']}x [{r['ratio_min']}-{r['ratio_max']}] | {p['p99_ms']} | "
            f"{p['ratio']}x |"
        )
    lines += [
        "",
        f"Gateway RSS: {report['gateway_rss_mb_start']} MB after start, {report['gateway_rss_mb_after']} MB after the run.",
        "",
        "![p50 latency vs batch size](img/serving_latency.png)",
    ]
    if "throughput_by_clients" in report:
        lines += ["", "![throughput vs clients](img/serving_throughput.png)"]
    return "\n".join(lines)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    batches = [int(b) for b in report["latency_p50"]]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for t in next(iter(report["latency_p50"].values())):
        ys = [report["latency_p50"][str(b)][t]["p50_ms"] for b in batches]
        lo = [report["latency_p50"][str(b)][t]["min"] for b in batches]
        hi = [report["latency_p50"][str(b)][t]["max"] for b in batches]
        ax.plot(batches, ys, marker="o", label=t)
        ax.fill_between(batches, lo, hi, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (examples per request)")
    ax.set_ylabel("p50 latency, one client (ms)")
    ax.set_title("demo model: gateway vs bare split client vs whole model")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    if "throughput_by_clients" not in report:
        return
    tc = report["throughput_by_clients"]
    counts = [int(c) for c in tc["clients"]]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for t in tc["clients"][str(counts[0])]:
        rows = [tc["clients"][str(c)][t] for c in counts]
        ax.plot(counts, [r["rps"] for r in rows], marker="o", label=t)
        ax.fill_between(counts, [r["min"] for r in rows], [r["max"] for r in rows], alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel(f"requests/s, batch {tc['batch']}")
    ax.set_title("demo model: throughput vs clients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.parent / "serving_throughput.png")
    plt.close(fig)


def _write(report: dict[str, Any], doc: Path) -> None:
    write_section(doc, BEGIN, END, _table(report), "## Embedding predict: gateway vs whole model")
    _plot(report, doc.parent / "img" / "serving_latency.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 512, 4096])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="per measurement (capped at 60)")
    p.add_argument(
        "--clients",
        type=lambda v: sorted({int(x) for x in v.split(",")}),
        default=[1, 2, 4, 8],
        help=f"client counts of the throughput measurement (comma-separated; {TARGET_CLIENTS} is issue 7's target)",
    )
    p.add_argument("--throughput-batch", type=int, default=64)
    p.add_argument(
        "--full", action="store_true", help="the full demo model (vocab 100 000) instead of the small one"
    )
    p.add_argument(
        "--serve-local-arg", action="append", default=[], help="extra serve-local flag (repeatable)"
    )
    p.add_argument(
        "--cache-mib",
        type=int,
        default=64,
        help="also measure a second gateway with a hot-row cache of this size (gRPC; a broker feeds it); 0 = off",
    )
    p.add_argument(
        "--gateway-extra", default="{}", help="JSON merged into the gateway config, e.g. a cache section"
    )
    p.add_argument(
        "--write", type=Path, default=None, help="rewrite this doc's serving_bench section (+ PNG)"
    )
    args = p.parse_args(argv)
    args.seconds = min(args.seconds, 60.0)
    args.rounds = max(1, min(args.rounds, 10))
    report = run(args)
    json.dump(report, sys.stdout, indent=2)
    print()
    if args.write is not None:
        _write(report, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
