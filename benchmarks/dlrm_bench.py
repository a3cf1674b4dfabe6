"""A DLRM-style ranking model split vs whole: the entry input modes' request bytes and latency (issues 17 and 22).

    .venv/bin/python -m benchmarks.dlrm_bench [--rows 1780000] [--batches 512,2048] [--rounds 3] [--seconds 3]
                                              [--cache-mib 1024] [--write docs/benchmarks.md]
                                              [--profile perf|py-spy [--profile-seconds 8]]

The model: 13 dense features (bottom MLP 512-256-64) and 26 single-id sparse features, dim 64, over 26 tables with
Criteo-like cardinalities capped so that they hold ``--rows`` rows in all (default 1.78 M); the bottom output and the
26 embeddings concatenated into the top MLP 512-256-1 (sigmoid). Random weights (no training: the bench measures
serving). Exported by ``embedgate.export`` three ways and saved whole:

* ``dlrm``: the ``unique_rows`` entry (float32 rows) + 2 PS shards holding every row (what the gateway serves);
* ``dlrm_bf16``: the ``unique_rows`` entry with bfloat16 rows; ``dlrm_pooled``: the ``pooled`` entry (both exported
  with 64-row stand-in tables: only their entries are served, fed with requests built from the real rows);
* ``dlrm_whole``: the Keras model with its tables as one SavedModel.

One serve-local serves all of them (``--mmap-threshold``: its ``--malloc_mmap_threshold_bytes``, default 32 MiB, the
setting for an entry server taking multi-megabyte requests; docs/serve-local.md "Memory"); an ``embedgate gateway`` serves ``dlrm`` (and, with ``--cache-mib``, a second
gateway with a warm hot-row cache fed by a Kafka broker). Traffic, per batch size:

* ``random``: every feature's id drawn as ``floor(card * u**6)`` (skewed to small ids; about 5,900 distinct rows for
  13,312 (example, feature) slots at batch 512);
* ``one_user``: a ranking request: the 13 even-numbered (user-side) features constant across the batch, the 13 others
  drawn per candidate as above.

Targets, measured interleaved (every round runs every target once, rotated order; median and spread of per-round
ratios to ``whole``): ``whole`` and the three entry calls alone by the bare Python gRPC client
(``benchmarks.split_client`` with no lookups, so the baseline and the entry calls share one client), the gateway over
gRPC (the same bare client; cached and uncached) and REST (vegeta, when ``make bench-tools`` built it; to the uncached
gateway, ``gateway_rest``, and to each cached one, ``gateway_rest_cache`` and its ``_ref`` / ``_ab`` twins). With
``--ab-mmap-threshold N`` a second serve-local with ``--malloc_mmap_threshold_bytes=N`` serves the whole model and the
``dlrm`` entry too, and its two calls join the rounds (``whole_ab``, ``entry_dlrm_ab``; ratios to the first
serve-local's ``whole``): the malloc setting's A/B in one run; ``--ab-env NAME=VALUE`` starts that second serve-local
with an environment variable instead (or as well), e.g. ``EMBEDGATE_SERVE_FRONT=python`` for its Python gRPC front;
``--gateway-ab-env NAME=VALUE`` adds a second cached gateway and a second uncached one with that environment
(``gateway_grpc_cache_ab``, ``gateway_grpc_ab``). Request bytes are the serialized requests' sizes. Before timing,
each entry's predictions are checked against the whole model's (printed as the max abs difference).

``--profile``: after each traffic/batch's rounds, the cached gateway's load runs alone for ``--profile-seconds``
under ``perf`` (the gateway's threads, shared objects and symbols) or ``py-spy --gil`` (the Python frames that held
the GIL; ``make bench-tools`` installs py-spy), and the report prints where the gateway's CPU went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.loadgen import BIN, Result, split_client, vegeta
from benchmarks.report import markers, write_section
from embedgate.localserve.memory import ENTRY_MMAP_THRESHOLD

__all__ = ["CRITEO_CARDINALITIES", "build_dlrm", "main", "traffic"]

BEGIN, END = markers("dlrm_bench")
DIM = 64
DENSE = 13
# The 26 categorical features' cardinalities of the Criteo Kaggle display-advertising data set (public facts)
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
USER_SIDE = tuple(
    range(0, 26, 2)
)  # one_user traffic: these 13 features are the user's, constant in a request
SKEW = 6.0  # id = floor(card * u ** SKEW)


def cardinalities(rows: int) -> list[int]:
    """The Criteo cardinalities capped at the largest cap that keeps their sum <= ``rows``."""
    lo, hi = 1, max(CRITEO_CARDINALITIES)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in CRITEO_CARDINALITIES) <= rows:
            lo = mid
        else:
            hi = mid - 1
    return [min(c, lo) for c in CRITEO_CARDINALITIES]


def declaration(name: str) -> dict[str, Any]:
    return {
        "model_name": name,
        "sparse": [{"name": f"s{i}", "table": f"t{i}", "pooled": f"e{i}"} for i in range(26)],
        "dense": [{"name": "dense", "dim": DENSE}],
    }


def build_dlrm(cards: list[int], seed: int = 0) -> Any:
    """The Keras DLRM-style model (random weights): inputs ``s0..s25`` int64 [B] and ``dense`` float32 [B, 13]."""
    import keras

    keras.utils.set_random_seed(seed)
    dense = keras.Input((DENSE,), name="dense")
    b = dense
    for k, units in enumerate((512, 256, 64)):
        b = keras.layers.Dense(units, activation="relu", name=f"bottom{k}")(b)
    ids = [keras.Input((), dtype="int64", name=f"s{i}") for i in range(26)]
    init = keras.initializers.RandomNormal(stddev=0.05, seed=seed)
    embs = [
        keras.layers.Identity(name=f"e{i}")(
            keras.layers.Embedding(c, DIM, embeddings_initializer=init, name=f"t{i}")(x)
        )
        for i, (c, x) in enumerate(zip(cards, ids, strict=True))
    ]
    h = keras.layers.Concatenate()([b, *embs])
    for k, units in enumerate((512, 256)):
        h = keras.layers.Dense(units, activation="relu", name=f"top{k}")(h)
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)
    return keras.Model([*ids, dense], out, name="dlrm")


def traffic(kind: str, batch: int, cards: list[int], seed: int) -> dict[str, Any]:
    """Feature columns of one request: ``s<i>`` int64 [batch], ``dense`` float32 [batch, 13]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cols: dict[str, Any] = {}
    for i, c in enumerate(cards):
        n = 1 if kind == "one_user" and i in USER_SIDE else batch
        ids = np.floor(c * rng.random(n) ** SKEW).astype(np.int64)
        cols[f"s{i}"] = np.broadcast_to(ids, (batch,)).copy()
    cols["dense"] = rng.normal(size=(batch, DENSE)).astype(np.float32)
    return cols


def _save_whole(model: Any, dest: Path) -> None:
    import tensorflow as tf

    specs = {x.name: tf.TensorSpec(x.shape, x.dtype, name=x.name) for x in model.inputs}

    def serve(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ctr": model(inputs, training=False)}

    module = tf.Module()
    module.variables_ = [getattr(v, "value", v) for v in model.variables]
    fn = tf.function(serve, input_signature=[specs]).get_concrete_function()
    tf.saved_model.save(module, str(dest / "1"), signatures={"serving_default": fn})


def _export_all(model: Any, cards: list[int], out: Path) -> dict[str, Any]:
    """``dlrm`` (unique_rows, every row), ``dlrm_bf16`` and ``dlrm_pooled`` (64-row stand-in tables): manifests."""
    import numpy as np

    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model

    manifests = {}
    t0 = time.perf_counter()
    r = export_model(model, Declaration.model_validate(declaration("dlrm")), out, num_shards=2)
    manifests["dlrm"] = r.manifest
    print(
        f"dlrm exported in {time.perf_counter() - t0:.0f} s (self-check error {r.max_error:.2g})",
        file=sys.stderr,
    )
    stand_in = {
        f"t{i}": (np.arange(min(64, c), dtype=np.int64), model.get_layer(f"t{i}").embeddings.numpy()[:64])
        for i, c in enumerate(cards)
    }
    for name, mode, dtype in (("dlrm_bf16", "unique_rows", "bfloat16"), ("dlrm_pooled", "pooled", "float32")):
        r = export_model(
            model,
            Declaration.model_validate(declaration(name)),
            out,
            num_shards=1,
            tables=stand_in,
            entry_input=mode,
            entry_row_dtype=dtype,
        )
        manifests[name] = r.manifest
        print(f"{name} exported (self-check error {r.max_error:.2g})", file=sys.stderr)
    return manifests


def _entry_requests(
    cols: dict[str, Any], tables: dict[str, Any], manifests: dict[str, Any]
) -> dict[str, bytes]:
    """The serialized entry request of each export for ``cols``, built by the gateway's own code from the real rows."""
    from benchmarks.entry_inputs import entry_inputs_for
    from gateway.features import batch_from_columns
    from schemas.manifest import entry_model_name
    from schemas.wire import predict_request

    out = {}
    for name, m in manifests.items():
        batch = batch_from_columns({k: v.tolist() for k, v in cols.items()}, m)
        inputs = entry_inputs_for(batch, m, lambda t, ids: tables[t][ids])
        out[name] = predict_request(entry_model_name(name), "", inputs)
    return out


def _tensor_request(model: str, cols: dict[str, Any]) -> bytes:
    from schemas.proto import tfs_pb2
    from schemas.wire import predict_request_for

    return predict_request_for(tfs_pb2.ModelSpec(name=model), list(cols.items()))


def _check_equal(target: str, whole: bytes, entries: dict[str, bytes]) -> dict[str, float]:
    """Max abs difference of each entry's predictions from the whole model's (one call each)."""
    import grpc
    import numpy as np

    from schemas.proto import tfs_pb2
    from schemas.tensors import to_ndarray

    opts = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
    with grpc.insecure_channel(target, options=opts) as ch:
        call = ch.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        want = to_ndarray(call(whole, timeout=120).outputs["ctr"]).reshape(-1)
        return {
            name: float(np.max(np.abs(to_ndarray(call(req, timeout=120).outputs["ctr"]).reshape(-1) - want)))
            for name, req in entries.items()
        }


def _with_cpu(load: Callable[[], Result], pid: int, batch: int, out: list[float]) -> Callable[[], Result]:
    """``load``, appending the gateway CPU µs per example it cost (``/proc/<pid>/stat``, process tree) to ``out``."""
    from tests.support.stack import cpu_seconds

    def run() -> Result:
        before = cpu_seconds(pid)
        res = load()
        out.append((cpu_seconds(pid) - before) / max(1, res.requests) / batch * 1e6)
        return res

    return run


def _interleaved(targets: dict[str, Callable[[], Result]], rounds: int) -> list[dict[str, Result]]:
    from benchmarks.serving_bench import _interleaved as interleaved

    return interleaved(targets, rounds)


def _gateway_yaml(path: Path, model_dir: Path, backend: str, grpc_port: int, extra: dict[str, Any]) -> Path:
    import yaml

    cfg = {
        "log": {"access": False},
        "max_body_bytes": 256 * 1024 * 1024,
        "grpc_port": grpc_port,
        "models": [
            {
                "kind": "embedding",
                "name": "dlrm",
                "manifest": str(model_dir),
                "entry": backend,
                "shards": [{"replicas": [backend]}] * 2,
            }
        ],
        **extra,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    import tests.support.servers
    from benchmarks.serving_bench import _create_topic, _summary, _wait_cache_serving
    from benchmarks.split_client import write_requests
    from schemas.deltas import delta_topic
    from schemas.manifest import entry_model_name
    from tests.support.gateway import run_gateway
    from tests.support.native import env_set
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    # 26 tables of up to 2 M rows take serve-local longer to restore than a test model's 60 s start limit
    tests.support.servers._START_TIMEOUT = max(tests.support.servers._START_TIMEOUT, 900.0)

    cards = cardinalities(args.rows)
    report: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "command": "python -m benchmarks.dlrm_bench " + " ".join(sys.argv[1:]),
        "rows": sum(cards),
        "load_average_start": round(os.getloadavg()[0], 1),
    }
    with tempfile.TemporaryDirectory(prefix="dlrmbench-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        model = build_dlrm(cards)
        manifests = _export_all(model, cards, tmp / "out")
        _save_whole(model, tmp / "whole")
        tables = {f"t{i}": model.get_layer(f"t{i}").embeddings.numpy() for i in range(26)}
        del model
        print(f"built, exported and saved whole in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        served = {"dlrm_whole": tmp / "whole"}
        for name in manifests:
            served.update(exported_backends(tmp / "out" / name, shards=[] if name != "dlrm" else None))
        with serve_local(served, extra_args=_malloc_args(args.mmap_threshold)) as backend:
            stack = contextlib.ExitStack()
            ab_target = None
            if args.ab_mmap_threshold is not None or args.ab_env:
                ab_served = {k: v for k, v in served.items() if k in ("dlrm_whole", entry_model_name("dlrm"))}
                threshold = args.mmap_threshold if args.ab_mmap_threshold is None else args.ab_mmap_threshold
                with contextlib.ExitStack() as env:
                    for name, _, value in (a.partition("=") for a in args.ab_env):
                        env.enter_context(env_set(name, value))  # the environment the process starts with
                    ab_target = stack.enter_context(
                        serve_local(ab_served, extra_args=_malloc_args(threshold))
                    ).target
            grpc_targets = {"gateway_grpc": free_port()}
            pids: dict[str, int] = {}  # target -> the gateway process whose CPU it costs
            cached_urls: dict[str, str] = {}  # cached gateway -> its REST base URL
            gw = stack.enter_context(
                run_gateway(
                    _gateway_yaml(
                        tmp / "gw.yaml",
                        tmp / "out" / "dlrm",
                        backend.target,
                        grpc_targets["gateway_grpc"],
                        {},
                    )
                )
            )
            pids["gateway_grpc"] = pids["gateway_rest"] = gw.proc.pid
            if args.gateway_ab_env:  # the uncached gateway with the other environment too
                grpc_targets["gateway_grpc_ab"] = free_port()
                cfg = _gateway_yaml(
                    tmp / "gw_ab.yaml",
                    tmp / "out" / "dlrm",
                    backend.target,
                    grpc_targets["gateway_grpc_ab"],
                    {},
                )
                ab_env = dict(a.split("=", 1) for a in args.gateway_ab_env)
                pids["gateway_grpc_ab"] = stack.enter_context(run_gateway(cfg, env=ab_env)).proc.pid
            if args.cache_mib:
                from tests.support.kafka import kafka_broker

                broker = stack.enter_context(kafka_broker(tmp / "kafka"))
                asyncio.run(_create_topic(broker.bootstrap, delta_topic("dlrm"), 2))
                cache = {"cache": {"max_bytes": args.cache_mib << 20, "bootstrap_servers": broker.bootstrap}}
                cached: dict[str, dict[str, str]] = {"gateway_grpc_cache": {}}
                if args.reference:  # the same cached gateway on the Python reference path
                    cached["gateway_grpc_cache_ref"] = {"EMBEDGATE_NATIVE": "off"}
                if args.gateway_ab_env:  # the same cached gateway with another environment
                    cached["gateway_grpc_cache_ab"] = dict(a.split("=", 1) for a in args.gateway_ab_env)
                for name, gw_env in cached.items():
                    grpc_targets[name] = free_port()
                    cfg = _gateway_yaml(
                        tmp / f"{name}.yaml", tmp / "out" / "dlrm", backend.target, grpc_targets[name], cache
                    )
                    cgw = stack.enter_context(run_gateway(cfg, env=gw_env))
                    _wait_cache_serving(cgw.url, "dlrm")
                    pids[name] = pids[name.replace("grpc", "rest", 1)] = cgw.proc.pid  # its REST too
                    cached_urls[name] = cgw.url
            with stack:
                results: dict[str, Any] = {}
                for kind in args.traffic:
                    for b in args.batches:
                        key = f"{kind}/{b}"
                        cols = traffic(kind, b, cards, seed=b)
                        whole = _tensor_request("dlrm_whole", cols)
                        entries = _entry_requests(cols, tables, manifests)
                        diffs = _check_equal(backend.target, whole, entries)
                        files = {}
                        for name, raw in {
                            "whole": whole,
                            **{f"entry_{n}": r for n, r in entries.items()},
                        }.items():
                            files[name] = tmp / f"{name}_{kind}_{b}.bin"
                            write_requests(files[name], [], raw)
                        distinct = sum(len(np.unique(cols[f"s{i}"])) for i in range(26))
                        sizes = {"whole": len(whole), **{f"entry_{n}": len(r) for n, r in entries.items()}}
                        grpc_req = _tensor_request("dlrm", cols)
                        rest = json.dumps({"inputs": {k: v.tolist() for k, v in cols.items()}}).encode()
                        secs = args.seconds
                        # one bare Python gRPC client process (benchmarks.split_client) for the whole model, the
                        # entry calls and the gateway's gRPC alike, so the ratios compare like with like
                        for name in grpc_targets:
                            files[name] = tmp / f"{name}_{kind}_{b}.bin"
                            write_requests(files[name], [], grpc_req)
                        targets: dict[str, Callable[[], Result]] = {
                            name: partial(
                                split_client,
                                f"127.0.0.1:{grpc_targets[name]}" if name in grpc_targets else backend.target,
                                path,
                                clients=1,
                                seconds=secs,
                            )
                            for name, path in files.items()
                        }
                        if ab_target is not None:
                            for name in ("whole", "entry_dlrm"):
                                targets[f"{name}_ab"] = partial(
                                    split_client, ab_target, files[name], clients=1, seconds=secs
                                )
                        if (BIN / "vegeta").exists():
                            targets["gateway_rest"] = partial(
                                vegeta, f"{gw.url}/v1/models/dlrm:predict", rest, clients=1, seconds=secs
                            )
                            # REST to each gateway with a warm cache
                            for grpc_name, url in cached_urls.items():
                                rest_name = grpc_name.replace("grpc", "rest", 1)
                                targets[rest_name] = partial(
                                    vegeta, f"{url}/v1/models/dlrm:predict", rest, clients=1, seconds=secs
                                )
                        cpu: dict[str, list[float]] = {}
                        for name in list(targets):
                            if name in pids:
                                targets[name] = _with_cpu(
                                    targets[name], pids[name], b, cpu.setdefault(name, [])
                                )
                        print(
                            f"{key}: {distinct} distinct rows; diffs {diffs}; bytes {sizes}", file=sys.stderr
                        )
                        results[key] = {
                            "distinct_rows": distinct,
                            "slots": 26 * b,
                            "max_abs_diff_vs_whole": {k: float(f"{v:.3g}") for k, v in diffs.items()},
                            "bytes": sizes,
                            "bytes_ratio": {k: round(v / sizes["whole"], 2) for k, v in sizes.items()},
                            "p50": _summary(_interleaved(targets, args.rounds), "p50_ms", "whole"),
                            "gateway_cpu_us_per_example": {
                                k: [round(x, 2) for x in v] for k, v in cpu.items()
                            },
                        }
                        if args.profile and "gateway_grpc_cache" in targets:
                            load = partial(
                                split_client,
                                f"127.0.0.1:{grpc_targets['gateway_grpc_cache']}",
                                files["gateway_grpc_cache"],
                                clients=1,
                                seconds=args.profile_seconds,
                            )
                            results[key]["profile_gateway_grpc_cache"] = _profile(
                                args.profile, load, pids["gateway_grpc_cache"], args.profile_seconds, tmp
                            )
                            print(results[key]["profile_gateway_grpc_cache"], file=sys.stderr)
                report["results"] = results
    report["load_average_end"] = round(os.getloadavg()[0], 1)
    return report


def _profile(profiler: str, load: Callable[[], Result], pid: int, seconds: float, tmp: Path) -> str:
    """Where gateway ``pid``'s CPU goes while ``load`` runs alone (``--profile``): ``perf``: its threads, shared
    objects and symbols; ``py-spy``: the self and inclusive shares of the Python frames that held the GIL."""
    from benchmarks.gateway_perf_profile import _perf, _py_spy, _report, collapsed_shares

    data = tmp / f"{profiler}-{pid}-{time.monotonic_ns()}.data"
    rec = _perf(pid, data, seconds) if profiler == "perf" else _py_spy(pid, data, seconds, gil=True)
    try:
        load()
    finally:
        rec.wait(timeout=seconds + 120)
    if not data.exists():
        return f"{profiler} wrote nothing"
    if profiler == "py-spy":
        return collapsed_shares(data)
    return "\n\n".join(_report(data, sort, 25) for sort in ("comm", "comm,dso", "comm,sym"))


def _malloc_args(threshold: int) -> list[str]:
    return [f"--malloc_mmap_threshold_bytes={threshold}"]


def _table(report: dict[str, Any]) -> str:
    cols = [
        "entry_dlrm",
        "entry_dlrm_bf16",
        "entry_dlrm_pooled",
        "gateway_grpc",
        "gateway_grpc_cache",
        "gateway_rest",
        "gateway_rest_cache",
    ]
    for extra in ("gateway_grpc_ab", "gateway_grpc_cache_ref", "gateway_grpc_cache_ab"):
        if any(extra in r["p50"] for r in report["results"].values()):
            cols.insert(cols.index("gateway_rest"), extra)
    for extra in ("gateway_rest_cache_ref", "gateway_rest_cache_ab"):
        if any(extra in r["p50"] for r in report["results"].values()):
            cols.append(extra)
    if any("whole_ab" in r["p50"] for r in report["results"].values()):
        cols += ["whole_ab", "entry_dlrm_ab"]
    head = (
        "| traffic / batch | distinct rows / slots | request bytes ÷ whole: unique f32 / bf16 / pooled | p50 ÷ whole "
        "(median, spread over rounds): "
        + " / ".join(c.removeprefix("entry_") for c in cols)
        + " | whole p50 | gateway CPU µs/example, median over rounds |"
    )
    lines = [
        (
            f"Command: `{report['command']}`; {report['rows']:,} rows, dim {DIM}, 2 shards; "
            f"{report['machine']['cores']} cores; load average {report['load_average_start']} -> "
            f"{report['load_average_end']}."
        ),
        "",
        head,
        "|---|---|---|---|---|---|",
    ]
    for key, r in report["results"].items():
        br = r["bytes_ratio"]
        p50 = r["p50"]
        cells = []
        for c in cols:
            if c in p50:
                x = p50[c]
                cells.append(f"{x['ratio']}x ({x['ratio_min']}-{x['ratio_max']})")
            else:
                cells.append("-")
        lines.append(
            f"| {key} | {r['distinct_rows']:,} / {r['slots']:,} | {br['entry_dlrm']}x / {br['entry_dlrm_bf16']}x / "
            f"{br['entry_dlrm_pooled']}x ({r['bytes']['whole']:,} B whole) | {' / '.join(cells)} | "
            f"{p50['whole']['p50_ms']} ms | {_cpu_cell(r.get('gateway_cpu_us_per_example', {}))} |"
        )
    return "\n".join(lines) + "\n"


def _cpu_cell(cpu: dict[str, list[float]]) -> str:
    import statistics

    return (
        ", ".join(
            f"{k.removeprefix('gateway_')} {statistics.median(v):.2f}" for k, v in sorted(cpu.items()) if v
        )
        or "-"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows", type=int, default=1_780_000, help="rows over the 26 tables (Criteo cardinalities capped)"
    )
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048])
    p.add_argument("--traffic", type=lambda s: s.split(","), default=["one_user", "random"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument(
        "--cache-mib", type=int, default=1024, help="hot-row cache of the cached gateway (0: none)"
    )
    p.add_argument(
        "--reference",
        action="store_true",
        help="also a cached gateway with EMBEDGATE_NATIVE=off (column gateway_grpc_cache_ref)",
    )
    p.add_argument(
        "--gateway-ab-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also a cached and an uncached gateway with this environment variable (columns gateway_grpc_cache_ab, "
        "gateway_grpc_ab; repeatable), e.g. EMBEDGATE_MALLOC_MMAP_THRESHOLD_BYTES=0, glibc's dynamic thresholds",
    )
    p.add_argument(
        "--mmap-threshold",
        type=int,
        default=ENTRY_MMAP_THRESHOLD,
        help="serve-local's --malloc_mmap_threshold_bytes (default 33554432, an entry server's setting)",
    )
    p.add_argument(
        "--ab-mmap-threshold",
        type=int,
        default=None,
        help="also a serve-local with this --malloc_mmap_threshold_bytes for the whole model and the dlrm entry "
        "(columns whole_ab, dlrm_ab), e.g. 1048576, the PS setting",
    )
    p.add_argument(
        "--ab-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also a serve-local with this environment variable for the whole model and the dlrm entry (columns "
        "whole_ab, dlrm_ab; repeatable), e.g. EMBEDGATE_SERVE_FRONT=python, the Python gRPC front",
    )
    p.add_argument(
        "--profile",
        choices=["perf", "py-spy"],
        default=None,
        help="after each traffic/batch's rounds, run the cached gateway's load alone under this profiler and print "
        "where the gateway's CPU went (issue 17's profile; perf: threads, objects, symbols; py-spy: Python frames)",
    )
    p.add_argument("--profile-seconds", type=float, default=8.0, help="how long --profile's load runs")
    p.add_argument(
        "--write", type=Path, default=None, help="rewrite the dlrm_bench section of this Markdown file"
    )
    args = p.parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=1))
    if args.write is not None:
        write_section(args.write, BEGIN, END, _table(report), "## DLRM entry modes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
