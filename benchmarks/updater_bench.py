"""Streaming update path: Kafka → ``embedgate updater`` → PS throughput and freshness, vs direct gRPC upserts.

    .venv/bin/python -m benchmarks.updater_bench [--rows 200000] [--dim 64] [--shards 2] [--repeat 3]
                                                 [--rates 10000,50000,100000,200000] [--sustain-seconds 8]
                                                 [--sustain-rounds 2] [--write docs/benchmarks.md] [--profile DIR]

Setup, all on 127.0.0.1 with free ports and bounded start-up waits: a real Kafka broker (``KafkaBroker`` in a temp
dir), a PS-only model with one empty table ``t`` (``--dim``, ``--shards`` shards, written by the exporter's
``write_ps_shard`` in a subprocess) served by ``serve-local`` (one process, one replica per shard), and
``embedgate updater --config <yaml>`` as a subprocess with default batching (metrics on a free port). Load comes
from ``benchmarks.updater_load`` subprocesses (their own interpreters); they report ``time.monotonic()`` stamps.

**Throughput**, ``--repeat`` rounds, the three phases of a round in a rotated order, each on fresh ids (every row an
insert), each ``--rows`` rows (values from ``updater_load.values``, the same in every phase):

(a) **baseline**: direct gRPC Predict ``upsert_t`` calls of 16384 rows (the updater's ``max_rows_per_call``) from
    their own process, shards concurrently (the updater idles);
(b) **drain**: the rows published (``DeltaPublisher``, ``--publish-rows`` per call) while the updater is stopped
    (SIGSTOP to its pid), then continued (SIGCONT); time from SIGCONT until the PS ``row_count``
    (polled every 25 ms) counts every row: the updater's own rate on a backlog;
(c) **publish → applied**: the same while the updater runs; time from the first publish call until every row is
    applied (publisher, broker, updater and PS share the CPU).

Every phase checks the PS ``row_count`` grew by exactly ``--rows``. Ratios (b)/(a) and (c)/(a) are taken per round;
the median round and the min..max over rounds are reported.

**Freshness under sustained load**, for each ``--rates`` value: ``updater_load sustain`` publishes that many rows/s
for ``--sustain-seconds`` (20 ms ticks, ids cycling over 200 000 keys) with a probe row every 25 ms; this process
polls the PS ``lookup`` signature every 10 ms for the probes not yet seen (one call per shard) and times each from
its ``publish`` call to visible. Every rate runs ``--sustain-rounds`` times (rates interleaved). Reported per rate:
achieved publish rate, probe p50 and p99 (the run with the median p99, and the range over runs), max, the p50 of the
first and the last third of the probes, and the catch-up (last publish → every row applied, worst run). **Lag
bounded** = the last third's p50 is within 0.25 s of the first third's and the catch-up is under 1 s; otherwise the
updater fell behind.

**CPU**: user + system CPU seconds (``/proc/<pid>/stat``) of the updater and of serve-local during each phase, per
10 000 rows; for the drain also the share of its wall time the updater was on a CPU (the rest it waited for PS
writes, Kafka or the OS scheduler). ``--profile DIR`` records py-spy stacks of the updater per phase (slows it).

Every loop is bounded in count and time (``--timeout`` per phase); the updater, serve-local, the broker and the load
processes are stopped (by pid) on every exit path. ``--write FILE`` rewrites the ``updater_bench`` section of
``FILE`` (between its markers) with the tables; other sections are kept as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.report import markers, write_section
from tests.support.stack import cpu_seconds

if TYPE_CHECKING:
    from tests.support.stack import UpdaterProc

__all__ = ["BEGIN", "END", "main"]

BEGIN, END = markers("updater_bench")

_REPO = Path(__file__).resolve().parent.parent
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_MODEL = "bench"
_TABLE = "t"
_ROWS_PER_CALL = (
    16384  # UpdaterSettings.batch.max_rows_per_call default, used by the updater and the baseline
)
_START_TIMEOUT_S = 90.0
_POLL_S = 0.025
_PROBE_POLL_S = 0.01
_MAX_ROWS = 2_000_000
_KEYS = 200_000


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _build_ps(root: Path, dim: int, shards: int) -> Any:
    """``root/bench/manifest.json`` + ``ps_<i>/1/`` with one empty table ``t`` of ``dim``; TF only in a child."""
    from schemas.manifest import Manifest

    manifest = Manifest.model_validate(
        {
            "model_name": _MODEL,
            "version": 1,
            "tables": [{"name": _TABLE, "dim": dim}],
            "sparse_features": [{"name": "f", "table": _TABLE}],
            "partition": {"num_shards": shards},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    model_dir = root / _MODEL
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(manifest.dumps())
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from embedgate.export.ps import write_ps_shard
        from schemas.manifest import Manifest
        m = Manifest.load({str(model_dir)!r})
        for s in range(m.num_shards):
            write_ps_shard(Path({str(model_dir)!r}) / f"ps_{{s}}" / "1", m.tables, {{}})
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    subprocess.run(
        [_python(), "-c", script], check=True, capture_output=True, env=env, cwd=_REPO, timeout=300
    )
    return manifest


# -- the updater's metrics ------------------------------------------------------------------------------------
def _scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=2) as resp:  # 127.0.0.1 only
        text = resp.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _loop_counters(url: str) -> dict[str, float]:
    """The updater's commits (one per loop iteration that applied something) and its apply-latency sum and count."""
    want = {
        "embedgate_updater_commits_total": "commits",
        "embedgate_updater_apply_latency_seconds_sum": "apply_s",
        "embedgate_updater_apply_latency_seconds_count": "groups",
        "embedgate_updater_rows_applied_total": "rows",
    }
    out = dict.fromkeys(want.values(), 0.0)
    for name, _labels, v in _scrape(url):
        if name in want:
            out[want[name]] += v
    return out


def _rows_applied(url: str) -> float:
    return sum(
        v
        for name, labels, v in _scrape(url)
        if name == "embedgate_updater_rows_applied_total" and labels.get("op") == "upsert"
    )


@contextlib.contextmanager
def _profiled(pid: int, path: Path | None) -> Iterator[None]:
    """py-spy (``.venv/bin/py-spy``) samples ``pid`` while the block runs; collapsed stacks to ``path``."""
    if path is None:
        yield
        return
    spy = Path(_python()).parent / "py-spy"
    if not spy.exists():
        raise RuntimeError(f"--profile needs py-spy at {spy}: .venv/bin/pip install py-spy")
    cmd = [str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking"]
    proc = subprocess.Popen(
        [*cmd, "--output", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.5)  # attached
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def _cpu(pids: dict[str, int], out: dict[str, float], rows: int) -> Iterator[None]:
    """``out["<name>_cpu_ms_per_10k"]``: CPU each of ``pids`` used while the block ran, per 10 000 rows."""
    before = {k: cpu_seconds(p, tree=False) for k, p in pids.items()}
    yield
    for k, p in pids.items():
        out[f"{k}_cpu_ms_per_10k"] = (cpu_seconds(p, tree=False) - before[k]) * 1000 * 10_000 / rows


# -- load processes ---------------------------------------------------------------------------------------------
async def _spawn_load(args: list[str]) -> asyncio.subprocess.Process:
    """``benchmarks.updater_load`` with ``args`` in a process of its own, its output piped."""
    return await asyncio.create_subprocess_exec(
        _python(),
        "-m",
        "benchmarks.updater_load",
        *args,
        cwd=_REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _load(args: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Run ``benchmarks.updater_load`` with ``args`` to its end; its JSON lines."""
    proc = await _spawn_load(args)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"updater_load {args[0]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


# -- PS gRPC helpers --------------------------------------------------------------------------------------------
class _Ps:
    def __init__(self, target: str, manifest: Any) -> None:
        import grpc.aio

        from schemas.proto import tfs_pb2

        self.manifest = manifest
        self._pb = tfs_pb2
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        self.predict = self._channel.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )

    def request(self, shard: int, signature: str) -> Any:
        from schemas.manifest import ps_model_name

        return self._pb.PredictRequest(
            model_spec=self._pb.ModelSpec(name=ps_model_name(_MODEL, shard), signature_name=signature)
        )

    async def row_count(self) -> int:
        from schemas.manifest import row_count_output

        total = 0
        for s in range(self.manifest.num_shards):
            resp = await self.predict(self.request(s, "row_count"), timeout=10)
            out = resp.outputs[row_count_output(_TABLE)]
            total += int(out.int64_val[0]) if out.int64_val else int.from_bytes(out.tensor_content, "little")
        return total

    async def first_columns(self, shard: int, ids: list[int]) -> list[float]:
        """Column 0 of the rows the PS serves for ``ids`` of one shard (one lookup call)."""
        import numpy as np

        from schemas.manifest import lookup_ids_input, lookup_values_output
        from schemas.tensors import from_ndarray

        req = self.request(shard, "lookup")
        req.inputs[lookup_ids_input(_TABLE)].CopyFrom(from_ndarray(np.asarray(ids, dtype=np.int64)))
        resp = await self.predict(req, timeout=5)
        out = resp.outputs[lookup_values_output(_TABLE)]
        flat = (
            np.frombuffer(out.tensor_content, dtype="<f4")
            if out.tensor_content
            else np.asarray(out.float_val, np.float32)
        )
        return [float(x) for x in flat.reshape(len(ids), -1)[:, 0]]

    async def close(self) -> None:
        await self._channel.close()


# -- phases -----------------------------------------------------------------------------------------------------
async def _wait_applied(upd: UpdaterProc, target: float, timeout_s: float) -> float:
    """Poll the rows-applied counter until it reaches ``target``; the monotonic time it was seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        applied = await asyncio.to_thread(_rows_applied, upd.metrics_url)
        if applied >= target:
            return time.monotonic()
        upd.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"updater applied {applied:.0f} of {target:.0f} rows within {timeout_s:.0f} s; "
                f"log tail:\n{upd.log_tail()}"
            )
        await asyncio.sleep(_POLL_S)


async def _wait_rows(ctx: _Ctx, target: int) -> float:
    """Poll the PS ``row_count`` until it reaches ``target`` (the phases write fresh ids); the monotonic time it was
    seen. The PS is asked rather than the updater's /metrics: rendering those costs the updater CPU."""
    deadline = time.monotonic() + ctx.args.timeout
    while True:
        count = await ctx.ps.row_count()
        if count >= target:
            return time.monotonic()
        ctx.upd.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"PS has {count} of {target} rows after {ctx.args.timeout:.0f} s; updater log tail:\n"
                f"{ctx.upd.log_tail()}"
            )
        await asyncio.sleep(_POLL_S)


@dataclass
class _Ctx:
    args: argparse.Namespace
    bootstrap: str
    ps_target: str
    manifest_dir: Path
    ps: _Ps
    upd: UpdaterProc
    ps_pid: int

    def load_args(self, mode: str, first_id: int) -> list[str]:
        a = self.args
        common = [mode, "--manifest", str(self.manifest_dir), "--first-id", str(first_id)]
        if mode == "baseline":
            return [*common, "--target", self.ps_target, "--rows", str(a.rows)]
        return [
            *common,
            "--bootstrap",
            self.bootstrap,
            "--rows",
            str(a.rows),
            "--publish-rows",
            str(a.publish_rows),
        ]


async def _check_added(ctx: _Ctx, before: int, what: str) -> None:
    added = await ctx.ps.row_count() - before
    if added != ctx.args.rows:
        raise RuntimeError(f"{what}: PS row_count grew by {added}, expected {ctx.args.rows}")


async def _baseline(ctx: _Ctx, first_id: int) -> dict[str, float]:
    before = await ctx.ps.row_count()
    cpu: dict[str, float] = {}
    with _cpu({"ps": ctx.ps_pid}, cpu, ctx.args.rows):
        (out,) = await _load(ctx.load_args("baseline", first_id), ctx.args.timeout)
    await _check_added(ctx, before, "baseline")
    seconds = out["t1"] - out["t0"]
    return {"seconds": seconds, "rows_per_s": ctx.args.rows / seconds, **cpu}


async def _publish_applied(ctx: _Ctx, first_id: int) -> dict[str, float]:
    before = await ctx.ps.row_count()
    load = asyncio.create_task(_load(ctx.load_args("publish", first_id), ctx.args.timeout))
    cpu: dict[str, float] = {}
    try:
        with _cpu({"updater": ctx.upd.proc.pid, "ps": ctx.ps_pid}, cpu, ctx.args.rows):
            t_done = await _wait_rows(ctx, before + ctx.args.rows)
    finally:
        (out,) = await load
    await _check_added(ctx, before, "publish -> applied")
    seconds = t_done - out["t0"]
    return {
        "seconds": seconds,
        "rows_per_s": ctx.args.rows / seconds,
        "publish_rows_per_s": ctx.args.rows / (out["t1"] - out["t0"]),
        "after_last_publish_s": t_done - out["t1"],
        **cpu,
    }


async def _drain(ctx: _Ctx, first_id: int) -> dict[str, float]:
    """The updater is stopped (SIGSTOP) while the rows are published, then continued; SIGCONT -> all applied.
    Publishing must take well under the group's session timeout (a warning says when it did not)."""
    before = await ctx.ps.row_count()
    loop0 = await asyncio.to_thread(_loop_counters, ctx.upd.metrics_url)
    os.kill(ctx.upd.proc.pid, signal.SIGSTOP)
    try:
        (out,) = await _load(ctx.load_args("publish", first_id), ctx.args.timeout)
        if out["t1"] - out["t0"] > 5.0:
            print("warning: publishing the backlog took > 5 s; the drain may include a group rejoin")
    finally:
        os.kill(ctx.upd.proc.pid, signal.SIGCONT)
    t0 = time.monotonic()
    cpu: dict[str, float] = {}
    with _cpu({"updater": ctx.upd.proc.pid, "ps": ctx.ps_pid}, cpu, ctx.args.rows):
        t_done = await _wait_rows(ctx, before + ctx.args.rows)
    await _check_added(ctx, before, "drain")
    await _wait_applied(ctx.upd, loop0["rows"] + ctx.args.rows, ctx.args.timeout)
    await asyncio.sleep(0.2)  # the commit after the last write
    loop1 = await asyncio.to_thread(_loop_counters, ctx.upd.metrics_url)
    seconds = t_done - t0
    iterations = max(1.0, loop1["commits"] - loop0["commits"])
    groups = max(1.0, loop1["groups"] - loop0["groups"])
    # share of the drain's wall time the updater was on a CPU (the rest it waited: PS writes, fetches, the OS)
    busy = cpu["updater_cpu_ms_per_10k"] * ctx.args.rows / 10_000 / 1000 / seconds
    return {
        "seconds": seconds,
        "rows_per_s": ctx.args.rows / seconds,
        "updater_busy": busy,
        # the sequential loop: iterations (commits), wall time per iteration, mean write of one group (shards of
        # an iteration are written concurrently)
        "iterations": iterations,
        "iteration_ms": seconds * 1000 / iterations,
        "group_write_ms": (loop1["apply_s"] - loop0["apply_s"]) * 1000 / groups,
        "groups_per_iteration": groups / iterations,
        **cpu,
    }


async def _sustain(ctx: _Ctx, rate: float, index: int) -> dict[str, Any]:
    """``rate`` rows/s for ``--sustain-seconds`` with probes; see the module docstring."""
    from schemas.partition import shard_for

    a = ctx.args
    n_shards = ctx.ps.manifest.num_shards
    base = await asyncio.to_thread(_rows_applied, ctx.upd.metrics_url)
    load_args = [
        "sustain",
        "--manifest",
        str(ctx.manifest_dir),
        "--bootstrap",
        ctx.bootstrap,
        "--rate",
        str(rate),
        "--seconds",
        str(a.sustain_seconds),
        "--keys",
        str(_KEYS),
        "--first-id",
        "500000000",  # one key space for every run: after the first, its rows are updates
        "--probe-first-id",
        str(900_000_000 + index * 1_000_000),
    ]
    proc = await _spawn_load(load_args)
    pending: dict[int, dict[int, tuple[float, float]]] = {s: {} for s in range(n_shards)}  # id -> value, t
    latencies: list[tuple[float, float]] = []  # (publish time, latency)
    done: dict[str, Any] = {}
    reading = True

    async def read() -> None:
        nonlocal reading
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                msg = json.loads(line)
                if "probe" in msg:
                    pid = int(msg["probe"])
                    shard = int(shard_for([pid], n_shards)[0])
                    pending[shard][pid] = (float(msg["value"]), float(msg["t"]))
                elif msg.get("done"):
                    done.update(msg)
        finally:
            reading = False

    async def poll(deadline: float) -> None:
        while reading or any(pending.values()):
            if time.monotonic() > deadline:
                left = sum(len(p) for p in pending.values())
                raise RuntimeError(f"sustain {rate:g}/s: {left} probes not visible in time")
            for s, probes in pending.items():
                if not probes:
                    continue
                ids = list(probes)
                got = await ctx.ps.first_columns(s, ids)
                now = time.monotonic()
                for pid, v in zip(ids, got, strict=True):
                    want, t_pub = probes[pid]
                    if v == want:
                        latencies.append((t_pub, now - t_pub))
                        del probes[pid]
            ctx.upd.check_alive()
            await asyncio.sleep(_PROBE_POLL_S)

    deadline = time.monotonic() + a.sustain_seconds + a.timeout
    cpu0 = cpu_seconds(ctx.upd.proc.pid, tree=False)
    try:
        await asyncio.wait_for(asyncio.gather(read(), poll(deadline)), a.sustain_seconds + a.timeout + 5)
        rc = await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if rc != 0 or not done:
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()[-2000:]
        raise RuntimeError(f"updater_load sustain exited {rc}: {err}")
    t_all = await _wait_applied(ctx.upd, base + done["rows"], a.timeout)
    cpu_ms_per_10k = (cpu_seconds(ctx.upd.proc.pid, tree=False) - cpu0) * 1000 * 10_000 / done["rows"]
    lat = [x for _, x in sorted(latencies)]  # in publish order
    third = max(1, len(lat) // 3)
    first_p50, last_p50 = statistics.median(lat[:third]), statistics.median(lat[-third:])
    ordered = sorted(lat)
    catch_up = max(0.0, t_all - done["t1"])
    return {
        "target_rows_per_s": rate,
        "achieved_rows_per_s": done["rows"] / (done["t1"] - done["t0"]),
        "seconds": done["t1"] - done["t0"],
        "probes": len(lat),
        "late_ticks": done["late_ticks"],
        "p50_s": statistics.median(ordered),
        "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_s": ordered[-1],
        "first_third_p50_s": first_p50,
        "last_third_p50_s": last_p50,
        "catch_up_s": catch_up,
        "bounded": last_p50 <= first_p50 + 0.25 and catch_up < 1.0,
        "updater_cpu_ms_per_10k": cpu_ms_per_10k,
        # one core's worth of CPU is 1000 ms per second: the share of a core the updater used at this rate
        "updater_core_share": cpu_ms_per_10k * done["rows"] / (done["t1"] - done["t0"]) / 10_000 / 1000,
    }


def _profile_path(args: argparse.Namespace, name: str, wanted: bool = True) -> Path | None:
    if args.profile is None or not wanted:
        return None
    args.profile.mkdir(parents=True, exist_ok=True)
    return Path(args.profile) / f"{name}.txt"


def _summary(runs: list[dict[str, float]], key: str) -> dict[str, float]:
    vals = sorted(r[key] for r in runs)
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1]}


async def _measure(
    args: argparse.Namespace,
    bootstrap: str,
    ps_target: str,
    ps_pid: int,
    manifest_dir: Path,
    manifest: Any,
    upd_factory: Any,
) -> dict[str, Any]:
    ps = _Ps(ps_target, manifest)
    rounds: list[dict[str, dict[str, float]]] = []
    sustained: list[list[dict[str, Any]]] = []
    try:
        with upd_factory() as upd:
            ctx = _Ctx(args, bootstrap, ps_target, manifest_dir, ps, upd, ps_pid)
            # warm-up: topic creation, group join, channels; bounded like everything else
            t_warm = time.monotonic()
            base = await asyncio.to_thread(_rows_applied, upd.metrics_url)
            await _load(
                ["publish", "--manifest", str(manifest_dir), "--bootstrap", bootstrap, "--rows", "1000"],
                _START_TIMEOUT_S,
            )
            await _wait_applied(upd, base + 1000, _START_TIMEOUT_S)
            warm_s = time.monotonic() - t_warm
            phases = {"baseline": _baseline, "drain": _drain, "publish_applied": _publish_applied}
            names = list(phases)
            for r in range(args.repeat):
                res: dict[str, dict[str, float]] = {}
                order = names[r % 3 :] + names[: r % 3]  # rotated: no phase always runs first
                for i, name in enumerate(order):
                    first = 10_000_000 * (r + 1) + 3_000_000 * i
                    with _profiled(upd.proc.pid, _profile_path(args, f"{name}-{r}", name != "baseline")):
                        res[name] = await phases[name](ctx, first)
                for name in ("drain", "publish_applied"):
                    res[name]["ratio"] = res[name]["rows_per_s"] / res["baseline"]["rows_per_s"]
                rounds.append(res)
                print(
                    f"round {r + 1}: baseline {res['baseline']['rows_per_s']:,.0f} rows/s, drain "
                    f"{res['drain']['ratio']:.2f}x, publish->applied {res['publish_applied']['ratio']:.2f}x",
                    flush=True,
                )
            runs: dict[float, list[dict[str, Any]]] = {rate: [] for rate in args.rates}
            for rnd in range(args.sustain_rounds):
                for i, rate in enumerate(args.rates):
                    with _profiled(upd.proc.pid, _profile_path(args, f"sustain-{rate:.0f}-{rnd}")):
                        one = await _sustain(ctx, rate, i + len(args.rates) * rnd)
                    runs[rate].append(one)
                    print(
                        f"sustain {rate:,.0f} rows/s: achieved {one['achieved_rows_per_s']:,.0f}, "
                        f"p50 {one['p50_s'] * 1000:.0f} ms, p99 {one['p99_s'] * 1000:.0f} ms, "
                        f"bounded {one['bounded']}",
                        flush=True,
                    )
            sustained = list(runs.values())
    finally:
        await ps.close()
    return {"rounds": rounds, "sustained": sustained, "warmup_s": warm_s}


def _report(args: argparse.Namespace, r: dict[str, Any], setup_s: float) -> dict[str, Any]:
    rounds = r["rounds"]
    b = _summary([x["baseline"] for x in rounds], "rows_per_s")
    out: dict[str, Any] = {
        "command": _command(args),
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        "setup_s": round(setup_s, 1),
        "warmup_s": round(r["warmup_s"], 2),
        "rows": args.rows,
        "dim": args.dim,
        "shards": args.shards,
        "rounds": len(rounds),
        "throughput": {"baseline": {k: round(v) for k, v in b.items()}},
    }
    for name in ("drain", "publish_applied"):
        rate = _summary([x[name] for x in rounds], "rows_per_s")
        ratio = _summary([x[name] for x in rounds], "ratio")
        out["throughput"][name] = {
            **{k: round(v) for k, v in rate.items()},
            "ratio": round(ratio["median"], 2),
            "ratio_min": round(ratio["min"], 2),
            "ratio_max": round(ratio["max"], 2),
        }
    for name in ("baseline", "drain", "publish_applied"):
        for k in (
            "updater_cpu_ms_per_10k",
            "ps_cpu_ms_per_10k",
            "updater_busy",
            "iterations",
            "iteration_ms",
            "group_write_ms",
            "groups_per_iteration",
        ):
            if k in rounds[0][name]:
                out["throughput"][name][k] = round(statistics.median(x[name][k] for x in rounds), 2)
    pubs = sorted(x["publish_applied"]["publish_rows_per_s"] for x in rounds)
    out["throughput"]["publish_only_rows_per_s"] = round(statistics.median(pubs))
    out["sustained"] = []
    for runs in r["sustained"]:
        p99 = sorted(x["p99_s"] for x in runs)
        mid = sorted(runs, key=lambda x: x["p99_s"])[(len(runs) - 1) // 2]  # the run with the median p99
        out["sustained"].append(
            {
                "target_rows_per_s": round(mid["target_rows_per_s"]),
                "runs": len(runs),
                "achieved_rows_per_s": round(statistics.median(x["achieved_rows_per_s"] for x in runs)),
                "probes": sum(x["probes"] for x in runs),
                "p50_ms": round(statistics.median(x["p50_s"] for x in runs) * 1000, 1),
                "p99_ms": round(mid["p99_s"] * 1000, 1),
                "p99_min_ms": round(p99[0] * 1000, 1),
                "p99_max_ms": round(p99[-1] * 1000, 1),
                "max_ms": round(max(x["max_s"] for x in runs) * 1000, 1),
                "first_third_p50_ms": round(mid["first_third_p50_s"] * 1000, 1),
                "last_third_p50_ms": round(mid["last_third_p50_s"] * 1000, 1),
                "catch_up_s": round(max(x["catch_up_s"] for x in runs), 2),
                "bounded_runs": sum(bool(x["bounded"]) for x in runs),
                "updater_cpu_ms_per_10k": round(
                    statistics.median(x["updater_cpu_ms_per_10k"] for x in runs), 1
                ),
                "updater_core_share": round(statistics.median(x["updater_core_share"] for x in runs), 2),
            }
        )
    return out


def _command(args: argparse.Namespace) -> str:
    return (
        f"python -m benchmarks.updater_bench --rows {args.rows} --dim {args.dim} --shards {args.shards}"
        f" --repeat {args.repeat} --rates {','.join(f'{x:g}' for x in args.rates)}"
        f" --sustain-seconds {args.sustain_seconds:g} --sustain-rounds {args.sustain_rounds}"
        + "".join(f" --updater-env {k}={v}" for k, v in args.updater_env)
    )


def _table(rep: dict[str, Any]) -> str:
    tp = rep["throughput"]
    b, d, p = tp["baseline"], tp["drain"], tp["publish_applied"]
    lines = [
        (
            f"`{rep['command']}` ({rep['cpus']} CPUs, load average {rep['load_1m']} at the end; dim {rep['dim']}, "
            f"{rep['shards']} shards, one replica each)"
        ),
        "",
        f"**Throughput, {rep['rows']} rows per phase, median of {rep['rounds']} interleaved rounds [min-max]**",
        "",
        "| phase | rows/s | vs direct gRPC (same round) | CPU per 10k rows: updater / PS |",
        "|---|---|---|---|",
        (
            f"| (a) direct gRPC upserts (baseline) | {b['median']:,} [{b['min']:,}-{b['max']:,}] | 1 | - / "
            f"{b['ps_cpu_ms_per_10k']:.0f} ms |"
        ),
        (
            f"| (b) updater: backlog drain | {d['median']:,} [{d['min']:,}-{d['max']:,}] | "
            f"{d['ratio']}x [{d['ratio_min']}-{d['ratio_max']}] | {d['updater_cpu_ms_per_10k']:.0f} / "
            f"{d['ps_cpu_ms_per_10k']:.0f} ms (updater on a CPU {d['updater_busy']:.0%} of the drain) |"
        ),
        (
            f"| (c) updater: publish → applied, while publishing | {p['median']:,} [{p['min']:,}-{p['max']:,}] | "
            f"{p['ratio']}x [{p['ratio_min']}-{p['ratio_max']}] | {p['updater_cpu_ms_per_10k']:.0f} / "
            f"{p['ps_cpu_ms_per_10k']:.0f} ms |"
        ),
        f"| (c) publishing alone (`DeltaPublisher`, acks=all) | {tp['publish_only_rows_per_s']:,} | | |",
        "",
        (
            f"Drain loop (medians): {d['iterations']:.0f} iterations of {d['iteration_ms']:.0f} ms, "
            f"{d['groups_per_iteration']:.1f} group writes each (concurrent), {d['group_write_ms']:.0f} ms per group "
            "write: the rest of an iteration is fetch (with its batch window), decode, coalesce, encode and commit."
        ),
        "",
        "**Freshness under sustained load (probe rows: publish call → visible through PS `lookup`)**",
        "",
        (
            "| target rows/s | achieved | p50 | p99 [min-max over runs] | max | p50 first → last third | catch-up (worst)"
            " | lag bounded | updater CPU |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rep["sustained"]:
        lines.append(
            f"| {s['target_rows_per_s']:,} | {s['achieved_rows_per_s']:,} | {s['p50_ms']:.0f} ms | "
            f"{s['p99_ms']:.0f} ms [{s['p99_min_ms']:.0f}-{s['p99_max_ms']:.0f}] | {s['max_ms']:.0f} ms | "
            f"{s['first_third_p50_ms']:.0f} → {s['last_third_p50_ms']:.0f} ms | {s['catch_up_s']:.2f} s | "
            f"{'yes' if s['bounded_runs'] == s['runs'] else '**no**'} ({s['bounded_runs']} of {s['runs']} runs) | "
            f"{s['updater_core_share']:.0%} of a core ({s['updater_cpu_ms_per_10k']:.0f} ms per 10k rows) |"
        )
    return "\n".join(lines)


def _write(rep: dict[str, Any], doc: Path) -> None:
    """Replace this benchmark's section of ``doc`` (append one when it has none)."""
    write_section(
        doc, BEGIN, END, _table(rep), "## Streaming updates: updater vs direct gRPC, freshness (issue 8)"
    )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or key.startswith("EMBEDGATE_"):
        raise argparse.ArgumentTypeError(
            "KEY=VALUE, not an EMBEDGATE_ setting (the YAML config is the only one)"
        )
    return key, value


def _rates(text: str) -> list[float]:
    rates = [float(x) for x in text.split(",") if x.strip()]
    if not rates or any(r <= 0 or r > 1_000_000 for r in rates) or len(rates) > 8:
        raise argparse.ArgumentTypeError("1-8 comma-separated rates in (0, 1000000] rows/s")
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows", type=int, default=200_000, help=f"rows per throughput phase (capped at {_MAX_ROWS})"
    )
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--publish-rows", type=int, default=10_000, help="rows per DeltaPublisher.publish call")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved throughput rounds (max 10)")
    ap.add_argument("--rates", type=_rates, default=[10_000.0, 50_000.0, 100_000.0, 200_000.0])
    ap.add_argument("--sustain-seconds", type=float, default=8.0, help="each sustained rate (max 60)")
    ap.add_argument(
        "--sustain-rounds", type=int, default=2, help="runs of every rate, rates interleaved (max 5)"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="limit of each measured phase, seconds")
    ap.add_argument("--write", type=Path, default=None, help="rewrite this doc's updater_bench section")
    ap.add_argument(
        "--updater-env",
        type=_env_pair,
        action="append",
        default=[],
        help="KEY=VALUE in the updater's environment only (repeatable), e.g. MALLOC_MMAP_THRESHOLD_=33554432",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="directory: py-spy profiles (collapsed stacks) of the updater during the drains and each rate",
    )
    args = ap.parse_args(argv)
    if args.rows < 1 or args.dim < 1 or args.shards < 1 or args.publish_rows < 1:
        ap.error("--rows, --dim, --shards and --publish-rows must be positive")
    args.rows = min(args.rows, _MAX_ROWS)
    args.repeat = min(max(args.repeat, 1), 10)
    args.sustain_seconds = min(max(args.sustain_seconds, 1.0), 60.0)
    args.sustain_rounds = min(max(args.sustain_rounds, 1), 5)

    signal.signal(signal.SIGTERM, _interrupt)  # run the finally blocks that stop updater, PS and broker
    # the idempotent producer retries NotLeaderForPartition while the topic's leader is elected: not news here
    logging.getLogger("aiokafka").setLevel(logging.ERROR)

    from embedgate.devkafka import KafkaBroker
    from schemas.manifest import ps_dir_name, ps_model_name
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import run_updater

    t_setup = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="updater-bench-") as tmp_s:
        tmp = Path(tmp_s)
        manifest = _build_ps(tmp / "models", args.dim, args.shards)
        model_dir = tmp / "models" / _MODEL
        served = {ps_model_name(_MODEL, i): model_dir / ps_dir_name(i) for i in range(args.shards)}
        with KafkaBroker(tmp / "kafka") as broker, serve_local(served) as ps_server:
            setup_s = time.perf_counter() - t_setup
            config = {
                "models": [
                    {
                        "kind": "embedding",
                        "name": _MODEL,
                        "manifest": str(model_dir),
                        "entry": ps_server.target,
                        "shards": [{"replicas": [ps_server.target]}] * args.shards,
                    }
                ],
                "bootstrap_servers": broker.bootstrap,
                "hps_topic_pattern": None,
                "group_id": "updater-bench",
                "metrics_port": free_port(),
            }

            def upd_factory() -> contextlib.AbstractContextManager[UpdaterProc]:
                return run_updater(config, tmp, ready_timeout_s=_START_TIMEOUT_S, env=dict(args.updater_env))

            results = asyncio.run(
                _measure(
                    args,
                    broker.bootstrap,
                    ps_server.target,
                    ps_server.proc.pid,
                    model_dir,
                    manifest,
                    upd_factory,
                )
            )
    rep = _report(args, results, setup_s)
    print()
    print(_table(rep))
    print()
    print("summary: " + json.dumps(rep))
    if args.write is not None:
        _write(rep, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
