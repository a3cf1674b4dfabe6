"""``make soak``: a bounded soak of the whole stack, checked key by key. Not part of ``make test`` (minutes long).

    .venv/bin/python -m benchmarks.soak [--duration 180] [--keys 2000] [--predict-rps 30] [--write]

Stack, every part real, each its own process on 127.0.0.1 with free ports (tests/support helpers):

* the demo model (``embedgate demo-model --small``, entry + 2 PS shards), built into a temp dir;
* a Kafka broker (``embedgate.devkafka``);
* serve-local **A** (entry, ``ps_0``, ``ps_1``) and serve-local **B** (``ps_0``, ``ps_1``): both shards have two
  replicas;
* ``embedgate updater`` writing to both replicas of each shard;
* ``embedgate gateway`` with REST and gRPC, reading the shards from A and B.

Traffic for ``--duration`` seconds:

* **updates**: every ``--publish-interval`` s a ``DeltaPublisher`` call of ``--publish-rows`` random rows of
  ``item_emb`` over ids ``0..--keys-1``, one call in ``--delete-every`` a delete of some of those ids instead; each
  call carries a strictly newer timestamp; a call counts as published once Kafka acknowledged it (a failed call is
  published again and counted in ``publish_retries``);
* **predicts**: ``--predict-rps`` requests/s (half REST ``:predict``, half gRPC ``Predict``), 1-4 examples each with
  ``item_id`` and ``history`` drawn from the updated ids, so they read rows being rewritten; each must succeed (HTTP
  200 / gRPC OK, one prediction per example);
* at ``--restart-at`` x duration, replica **B** is SIGKILLed and started again on the same export and port: it comes
  back with its export's rows only, and the updater must find it behind and replay it by itself.

After the traffic stops, the soak waits (``--settle-timeout``) until every replica of every shard holds, for every
published id, the newest published row (the table's default row after a delete), then checks it key by key:
``lost`` = a replica holds something never published for that id (e.g. the export's row), ``stale`` = an older
published row. Resident memory (``VmRSS``, process tree) of the gateway, the updater and each serve-local is sampled
every ``--sample-every`` s; see :func:`memory_growth` for the criterion.

Exits 1 on any violation (a failed predict, a lost or stale key, memory growth, a process that died); prints a
summary; ``--write`` puts it into docs/reliability.md between ``<!-- soak:begin -->`` and ``<!-- soak:end -->``.
Every loop is bounded in time; every process is stopped on every exit path (context managers, by pid).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.report import write_section

__all__ = ["MemoryVerdict", "main", "memory_growth"]

_REPO = Path(__file__).resolve().parent.parent
_MODEL = "soak"
_TABLE = "item_emb"
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_BEGIN, _END = "<!-- soak:begin -->", "<!-- soak:end -->"
_CATCHUPS = "embedgate_updater_replica_catchups_total"


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


# -- memory criterion -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryVerdict:
    name: str
    samples: int
    first_mb: float  # median RSS of the first third after warm-up
    last_mb: float  # median RSS of the last third
    max_mb: float
    allowed_mb: float
    ok: bool

    @property
    def growth_mb(self) -> float:
        return self.last_mb - self.first_mb


def memory_growth(
    name: str,
    samples: list[tuple[float, int]],
    *,
    since: float,
    slack_mb: float,
    slack_ratio: float,
    min_samples: int = 9,
) -> MemoryVerdict | None:
    """Judge one process's RSS samples ``(time, bytes)`` taken at or after ``since`` (the end of its warm-up).

    The samples are cut into thirds; growth = median of the last third - median of the first third. It is a
    violation when growth > ``max(slack_mb, slack_ratio * first)``. Medians ignore single spikes (a GC cycle, a
    large batch); comparing thirds instead of first/last sample makes a steady leak show (~2/3 of what it leaked
    over the judged window) while a process that only reached its working set during warm-up stays flat.
    None when fewer than ``min_samples`` samples remain (too short to judge)."""
    rss = [b / 2**20 for t, b in samples if t >= since and b > 0]
    if len(rss) < min_samples:
        return None
    third = len(rss) // 3
    first, last = statistics.median(rss[:third]), statistics.median(rss[-third:])
    allowed = max(slack_mb, slack_ratio * first)
    return MemoryVerdict(name, len(rss), first, last, max(rss), allowed, last - first <= allowed)


# -- requests ---------------------------------------------------------------------------------------------------------
def _instances(model_dir: Path) -> list[dict[str, Any]]:
    body = json.loads((model_dir / "example_request.json").read_text())
    return [dict(i) for i in body["instances"]]


def _batch(pool: list[dict[str, Any]], keys: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for _ in range(rng.randint(1, 4)):
        inst = dict(rng.choice(pool))
        inst["item_id"] = rng.randrange(keys)
        inst["history"] = [rng.randrange(keys) for _ in range(rng.randint(0, 5))]
        out.append(inst)
    return out


def _grpc_request(manifest: Any, instances: list[dict[str, Any]]) -> Any:
    """A PredictRequest with one tensor per feature (docs/gateway.md "gRPC API"): ids [B] or [B, L] padded with -1,
    weights [B, L], dense [B, dim]. Built on our wire protos (no TensorFlow in this process)."""
    from schemas.manifest import FeatureKind
    from schemas.proto import tfs_pb2

    def put(name: str, arr: npt.NDArray[Any]) -> None:
        t = req.inputs[name]
        t.dtype = tfs_pb2.DT_INT64 if arr.dtype == np.int64 else tfs_pb2.DT_FLOAT
        for d in arr.shape:
            t.tensor_shape.dim.add().size = d
        t.tensor_content = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes()

    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name=manifest.model_name))
    b = len(instances)
    for f in manifest.sparse_features:
        if f.kind is FeatureKind.SINGLE:
            put(f.name, np.array([int(i[f.name]) for i in instances], np.int64))
            continue
        width = max(1, *(len(i.get(f.name, [])) for i in instances))
        ids = np.full((b, width), -1, np.int64)
        w = np.zeros((b, width), np.float32)
        for r, inst in enumerate(instances):
            vals = inst.get(f.name, [])
            ids[r, : len(vals)] = vals
            if f.weights:
                w[r, : len(vals)] = inst.get(f.weights, [1.0] * len(vals))
        put(f.name, ids)
        if f.weights:
            put(f.weights, w)
    for d in manifest.dense_features:
        put(d.name, np.array([i[d.name] for i in instances], np.float32).reshape(b, d.dim))
    return req


# -- state ------------------------------------------------------------------------------------------------------------
@dataclass
class Counts:
    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failed += 1
        self.errors[what] = self.errors.get(what, 0) + 1


@dataclass
class Published:
    """The newest acknowledged row per id (None = deleted) and every row ever published per id (to tell stale from
    lost)."""

    newest: dict[int, bytes | None] = field(default_factory=dict)
    history: dict[int, set[bytes]] = field(default_factory=dict)
    calls: int = 0
    rows: int = 0
    deletes: int = 0
    retries: int = 0

    def record(self, ids: list[int], rows: list[bytes] | None) -> None:
        self.calls += 1
        self.rows += len(ids)
        if rows is None:
            self.deletes += len(ids)
        for i, k in enumerate(ids):
            row = None if rows is None else rows[i]
            self.newest[k] = row
            if row is not None:
                self.history.setdefault(k, set()).add(row)


# -- the run ----------------------------------------------------------------------------------------------------------
@dataclass
class Soak:
    args: argparse.Namespace
    work: Path
    manifest: Any = None
    model_dir: Path = Path()
    a: Any = None
    b: Any = None
    b_port: int = 0
    gateway: Any = None
    grpc_port: int = 0
    updater: Any = None
    broker: Any = None
    replicas: Any = None  # tests.support.replicas.TwoReplicas once started
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    published: Published = field(default_factory=Published)
    rest: Counts = field(default_factory=Counts)
    grpc: Counts = field(default_factory=Counts)
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    events: dict[str, float] = field(default_factory=dict)
    b_restarts: int = 0
    catchups: float = 0.0  # the updater's catch-ups at the end ...
    catchups_before: float = 0.0  # ... and just before B was killed
    t0: float = 0.0

    # -- setup --------------------------------------------------------------------------------------------------
    def build_model(self) -> None:
        from schemas.manifest import Manifest

        out = self.work / "models"
        cmd = [_python(), "-m", "embedgate", "demo-model", "--out", str(out), "--name", _MODEL, "--small"]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        subprocess.run(cmd, check=True, cwd=_REPO, env=env, capture_output=True, timeout=600)
        self.model_dir = out / _MODEL
        self.manifest = Manifest.load(self.model_dir)

    def start(self) -> None:
        import yaml

        from tests.support.gateway import run_gateway
        from tests.support.ports import free_port
        from tests.support.replicas import start_two_replicas

        _say("starting Kafka, serve-local A and B, the updater, the gateway ...")
        self.replicas = start_two_replicas(self.stack, self.work, self.model_dir, self.manifest.num_shards)
        self.broker, self.a, self.b = self.replicas.broker, self.replicas.a, self.replicas.b
        self.b_port, self.updater, model = self.replicas.b_port, self.replicas.updater, self.replicas.model
        cfg = self.work / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [model]}))
        self.grpc_port = free_port()
        self.gateway = self.stack.enter_context(
            run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(self.grpc_port)})
        )

    def restart_b(self) -> None:
        """SIGKILL replica B and start it again on the same export and port (bounded waits in serve_local)."""
        self.replicas.kill_b()
        self.events["b_killed"] = time.monotonic() - self.t0
        self.b = self.replicas.start_b()
        self.events["b_back"] = time.monotonic() - self.t0
        self.b_restarts += 1

    # -- traffic ------------------------------------------------------------------------------------------------
    async def publish_loop(self, end: float) -> None:
        from aiokafka.errors import KafkaError

        from updater.producer import DeltaPublisher

        a = self.args
        rng = np.random.default_rng(a.seed)
        dim = self.manifest.table(_TABLE).dim
        last_ts = 0
        n = 0
        async with DeltaPublisher(self.broker.bootstrap) as pub:
            while time.monotonic() < end:
                t_next = time.monotonic() + a.publish_interval
                ids = rng.choice(a.keys, size=min(a.publish_rows, a.keys), replace=False).astype(np.int64)
                delete = a.delete_every > 0 and n % a.delete_every == a.delete_every - 1
                ids = ids[: max(1, len(ids) // 4)] if delete else ids
                vals = None if delete else rng.normal(0, 0.05, (len(ids), dim)).astype(np.float32)
                for attempt in range(a.publish_attempts):
                    last_ts = max(int(time.time() * 1000), last_ts + 1)
                    try:
                        await pub.publish(
                            self.manifest, _TABLE, ids, vals, delete=delete, timestamp_ms=last_ts
                        )
                        break
                    except KafkaError as exc:
                        self.published.retries += 1
                        if attempt == a.publish_attempts - 1:
                            raise RuntimeError(f"publish not acknowledged after {attempt + 1} tries") from exc
                        await asyncio.sleep(0.5)
                self.published.record(ids.tolist(), None if vals is None else [r.tobytes() for r in vals])
                n += 1
                await asyncio.sleep(max(0.0, t_next - time.monotonic()))

    async def rest_worker(self, end: float, rate: float, seed: int) -> None:
        import httpx

        rng = random.Random(seed)
        pool = _instances(self.model_dir)
        url = f"{self.gateway.url}/v1/models/{_MODEL}:predict"
        period = 1.0 / rate
        t_next = time.monotonic()
        async with httpx.AsyncClient(timeout=self.args.request_timeout) as client:
            while time.monotonic() < end:
                batch = _batch(pool, self.args.keys, rng)
                t = time.monotonic()
                try:
                    r = await client.post(url, json={"instances": batch})
                    if r.status_code != 200:
                        self.rest.fail(f"HTTP {r.status_code}: {r.text[:120]}")
                    elif len(r.json().get("predictions", [])) != len(batch):
                        self.rest.fail("wrong number of predictions")
                    else:
                        self.rest.ok += 1
                        self.rest.latencies_ms.append((time.monotonic() - t) * 1000)
                except httpx.HTTPError as exc:
                    self.rest.fail(f"{type(exc).__name__}: {exc}"[:120])
                t_next += period
                await asyncio.sleep(max(0.0, t_next - time.monotonic()))

    async def grpc_worker(self, end: float, rate: float, seed: int) -> None:
        import grpc

        from schemas.proto import tfs_pb2

        rng = random.Random(seed)
        pool = _instances(self.model_dir)
        period = 1.0 / rate
        t_next = time.monotonic()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as ch:
            call = ch.unary_unary(
                _PREDICT,
                request_serializer=tfs_pb2.PredictRequest.SerializeToString,
                response_deserializer=tfs_pb2.PredictResponse.FromString,
            )
            while time.monotonic() < end:
                batch = _batch(pool, self.args.keys, rng)
                req = _grpc_request(self.manifest, batch)
                t = time.monotonic()
                try:
                    resp = await call(req, timeout=self.args.request_timeout)
                    out = next(iter(resp.outputs.values()), None)
                    if out is None or not out.tensor_shape.dim or out.tensor_shape.dim[0].size != len(batch):
                        self.grpc.fail("wrong number of predictions")
                    else:
                        self.grpc.ok += 1
                        self.grpc.latencies_ms.append((time.monotonic() - t) * 1000)
                except grpc.aio.AioRpcError as exc:
                    self.grpc.fail(f"{exc.code().name}: {exc.details()}"[:120])
                t_next += period
                await asyncio.sleep(max(0.0, t_next - time.monotonic()))

    def processes(self) -> dict[str, int]:
        return {
            "gateway": self.gateway.proc.pid,
            "updater": self.updater.pid,
            "serve-local A": self.a.proc.pid,
            "serve-local B": self.b.proc.pid,
            "kafka": self.broker.proc.pid,
        }

    async def sample_loop(self, end: float) -> None:
        from tests.support.stack import rss_bytes

        while time.monotonic() < end:
            now = time.monotonic() - self.t0
            for name, pid in self.processes().items():
                self.rss.setdefault(name, []).append((now, rss_bytes(pid)))
            self.updater.check_alive()
            for name, proc in (("gateway", self.gateway.proc), ("serve-local A", self.a.proc)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}")
            await asyncio.sleep(self.args.sample_every)

    async def restart_later(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        # replicas start without a stream position, so catch-ups also happen at start-up: count those after the kill
        self.catchups_before = await asyncio.to_thread(self.updater.metric, _CATCHUPS)
        _say(
            f"t={time.monotonic() - self.t0:.0f}s: SIGKILL replica B (pid {self.b.proc.pid}), start it again"
        )
        await asyncio.to_thread(self.restart_b)
        _say(f"t={time.monotonic() - self.t0:.0f}s: replica B back (pid {self.b.proc.pid})")

    async def traffic(self) -> None:
        a = self.args
        self.t0 = time.monotonic()
        end = self.t0 + a.duration
        per_worker = a.predict_rps / 4  # 2 REST + 2 gRPC workers
        tasks = [
            self.publish_loop(end),
            self.sample_loop(end),
            self.restart_later(self.t0 + a.restart_at * a.duration),
            *(self.rest_worker(end, per_worker, a.seed + i) for i in range(2)),
            *(self.grpc_worker(end, per_worker, a.seed + 10 + i) for i in range(2)),
        ]
        await asyncio.gather(*tasks)

    # -- final check --------------------------------------------------------------------------------------------
    def replica_views(self, ids: npt.NDArray[np.int64]) -> dict[str, npt.NDArray[np.float32]]:
        from schemas.manifest import ps_model_name
        from schemas.partition import shard_for
        from tests.support.stack import ps_lookup

        m = self.manifest
        shards = shard_for(ids, m.num_shards)
        dim = m.table(_TABLE).dim
        out = {}
        for name, target in (("A", self.a.target), ("B", self.b.target)):
            view = np.full((len(ids), dim), np.nan, np.float32)
            for s in range(m.num_shards):
                mask = shards == s
                if mask.any():
                    view[mask] = ps_lookup(target, ps_model_name(m.model_name, s), m, _TABLE, ids[mask])
            out[name] = view
        return out

    def check(self) -> dict[str, Any]:
        """Wait (bounded) until every replica holds the newest row of every published id; then count lost/stale."""
        ids = np.array(sorted(self.published.newest), np.int64)
        default = np.full(
            self.manifest.table(_TABLE).dim, self.manifest.table(_TABLE).default_value, np.float32
        )
        want = np.stack(
            [
                default if (row := self.published.newest[k]) is None else np.frombuffer(row, np.float32)
                for k in ids.tolist()
            ]
        )
        deadline = time.monotonic() + self.args.settle_timeout
        t = time.monotonic()
        while True:
            views = self.replica_views(ids)
            if all(np.array_equal(v, want) for v in views.values()) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        settle_s = time.monotonic() - t
        lost: dict[str, int] = {}
        stale: dict[str, int] = {}
        examples: list[str] = []
        for name, view in views.items():
            bad = np.flatnonzero(~(view == want).all(axis=1))
            lost[name] = stale[name] = 0
            for i in bad.tolist():
                k = int(ids[i])
                if view[i].tobytes() in self.published.history.get(k, set()):
                    stale[name] += 1
                else:
                    lost[name] += 1
                if len(examples) < 5:
                    examples.append(
                        f"replica {name} id {k}: has {view[i][:3].tolist()}.. want {want[i][:3].tolist()}.."
                    )
        return {"keys": len(ids), "lost": lost, "stale": stale, "examples": examples, "settle_s": settle_s}


def _say(msg: str) -> None:
    print(msg, flush=True)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _summary(soak: Soak, result: dict[str, Any], verdicts: list[MemoryVerdict], violations: list[str]) -> str:
    a, p, ev = soak.args, soak.published, soak.events
    command = (
        f"`.venv/bin/python -m benchmarks.soak --duration {a.duration:.0f} --keys {a.keys} --predict-rps "
        f"{a.predict_rps:g} --publish-rows {a.publish_rows} --publish-interval {a.publish_interval:g}`"
    )
    rows: list[tuple[str, str]] = [
        ("verdict", f"**{'PASS' if not violations else 'FAIL: ' + '; '.join(violations)}**"),
        (
            "updates published (acknowledged)",
            (
                f"{p.calls} calls, {p.rows} rows ({p.deletes} deletes) over {len(p.newest)} ids; "
                f"{p.retries} publish retries"
            ),
        ),
        (
            "replica B SIGKILLed + restarted",
            (
                f"{soak.b_restarts}x: killed at t={ev.get('b_killed', -1):.0f} s, serving again at "
                f"t={ev.get('b_back', -1):.0f} s; the updater found a replica behind and replayed it "
                f"{soak.catchups - soak.catchups_before:.0f}x after the kill ({soak.catchups:.0f}x in all, "
                f"`{_CATCHUPS}`)"
            ),
        ),
    ]
    for name, c in (("REST", soak.rest), ("gRPC", soak.grpc)):
        rows.append(
            (
                f"predicts {name}",
                (
                    f"{c.ok} ok, {c.failed} failed; p50 {_pct(c.latencies_ms, 50):.1f} ms, "
                    f"p99 {_pct(c.latencies_ms, 99):.1f} ms"
                ),
            )
        )
    rows.append(
        (
            f"final state, key by key ({result['keys']} ids x replicas A, B)",
            (
                f"lost {result['lost']}, stale {result['stale']}; converged {result['settle_s']:.1f} s after the "
                "traffic stopped"
            ),
        )
    )
    for v in verdicts:
        rows.append(
            (
                f"RSS {v.name}",
                f"{v.first_mb:.0f} MB -> {v.last_mb:.0f} MB (medians of the first and last third), growth "
                f"{v.growth_mb:+.1f} MB, allowed {v.allowed_mb:.0f} MB; max {v.max_mb:.0f} MB; {v.samples} samples"
                + ("" if v.ok else " **GROWTH**"),
            )
        )
    for name, errs in (("REST", soak.rest.errors), ("gRPC", soak.grpc.errors)):
        for what, count in sorted(errs.items(), key=lambda x: -x[1])[:3]:
            rows.append((f"{name} error", f"{count}x `{what}`"))
    rows += [("wrong key", ex) for ex in result["examples"]]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = f"`make soak` run {when} on the shared 2-core development machine (other jobs running): {command}.\n\n"
    return head + "| check | result |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def _write(doc: Path, text: str) -> None:
    write_section(doc, _BEGIN, _END, text, None)


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="embedgate-soak-") as tmp:
        yield Path(tmp)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks.soak", description=__doc__.split("\n\n")[0])
    env = os.environ.get
    p.add_argument(
        "--duration", type=float, default=float(env("SOAK_DURATION", "180")), help="seconds of traffic"
    )
    p.add_argument("--keys", type=int, default=2000, help="ids 0..keys-1 of item_emb are updated and read")
    p.add_argument("--publish-rows", type=int, default=64, help="rows per publish call")
    p.add_argument("--publish-interval", type=float, default=0.2, help="seconds between publish calls")
    p.add_argument("--delete-every", type=int, default=7, help="every Nth call deletes (0: never)")
    p.add_argument("--publish-attempts", type=int, default=20, help="tries per publish call")
    p.add_argument("--predict-rps", type=float, default=30.0, help="predict requests/s, half REST half gRPC")
    p.add_argument("--request-timeout", type=float, default=10.0, help="seconds per predict")
    p.add_argument(
        "--restart-at", type=float, default=0.35, help="restart replica B at this fraction of the run"
    )
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument(
        "--warmup", type=float, default=0.2, help="fraction of the run (at least 30 s) not judged for RSS"
    )
    p.add_argument("--rss-slack-mb", type=float, default=16.0, help="allowed RSS growth in MB ...")
    p.add_argument(
        "--rss-slack-ratio", type=float, default=0.02, help="... or this fraction of the RSS, if larger"
    )
    p.add_argument("--settle-timeout", type=float, default=120.0, help="seconds to wait for the final state")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--workdir", type=Path, default=None, help="keep models, logs and data here (default: temp dir)"
    )
    p.add_argument("--write", action="store_true", help="write the summary into docs/reliability.md")
    args = p.parse_args(argv)
    if args.duration < 30 or not 0 < args.restart_at < 0.8 or args.keys < 1 or args.predict_rps <= 0:
        p.error("need --duration >= 30, 0 < --restart-at < 0.8, --keys >= 1, --predict-rps > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    with _workdir(args.workdir) as work:
        soak = Soak(args, work)
        _say(f"building the demo model into {work} ...")
        soak.build_model()
        violations: list[str] = []
        with soak.stack:
            soak.start()
            _say(f"traffic for {args.duration:.0f} s ...")
            asyncio.run(soak.traffic())
            _say("traffic stopped; checking every published key on every replica ...")
            result = soak.check()
            soak.updater.check_alive()
            soak.catchups = soak.updater.metric(_CATCHUPS)
        warm = max(30.0, args.warmup * args.duration)
        verdicts = []
        for name, samples in soak.rss.items():
            if name == "kafka":
                continue  # a JVM with a fixed -Xmx: its RSS follows the collector, not our code
            # B is judged on its life after the restart (from a new process, it reloads the export and is replayed)
            since = soak.events.get("b_back", 0.0) + 30.0 if name == "serve-local B" else warm
            v = memory_growth(
                name, samples, since=since, slack_mb=args.rss_slack_mb, slack_ratio=args.rss_slack_ratio
            )
            if v is not None:
                verdicts.append(v)
        failed = soak.rest.failed + soak.grpc.failed
        if failed:
            violations.append(f"{failed} failed predicts")
        if sum(result["lost"].values()) or sum(result["stale"].values()):
            violations.append(f"lost {result['lost']}, stale {result['stale']}")
        violations += [f"RSS growth of {v.name}" for v in verdicts if not v.ok]
        if soak.b_restarts != 1:
            violations.append("replica B was not restarted")
        if soak.catchups - soak.catchups_before < 1:
            violations.append("the updater never replayed the restarted replica")
        text = _summary(soak, result, verdicts, violations)
        print("\n" + text)
        if args.write:
            _write(_REPO / "docs" / "reliability.md", text)
            _say("written to docs/reliability.md")
        return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
