"""Where a live cached gateway's CPU goes (issue 17's profile): ``perf record -g`` of the gateway process under one
client at each batch, gRPC (ghz) then REST (vegeta), on the small demo model with a warm hot-row cache.

Prints, per batch and front, the gateway CPU per request and per example (``/proc/<pid>/stat`` of its process tree
over the same run) and ``perf report``'s largest shared objects and symbols. Needs ``perf`` (Linux) and ``make
bench-tools``. Python frames show as ``libpython``: pair it with ``benchmarks.embedding_path_bench`` for the Python
stages.

    python -m benchmarks.gateway_perf_profile [--batches 64,512,4096] [--seconds 4] [--fronts grpc,rest]
                                              [--profiler perf|py-spy|py-spy-gil|threads] [--env EMBEDGATE_NATIVE=off]

``--profiler py-spy`` samples the gateway's Python stacks instead (``py-spy record``, from the venv) and prints each
frame's self and inclusive share of the samples (threads summed), so the Python frames ``perf`` shows as
``libpython`` get names. py-spy does not always tell a waiting thread from a running one: frames that wait
(``select``, ``Condition.wait``, the executor's ``_worker`` queue get) are idle time, not CPU. ``--profiler
py-spy-gil`` samples only the thread holding the interpreter lock (py-spy ``--gil``): the Python CPU alone, without
the waits.

``--profiler threads`` runs no profiler: it prints the CPU each of the gateway's threads spent per request
(``/proc/<pid>/task``; the event loop is the first ``python``, the native gate and backend client are
``embedgate-gate`` / ``embedgate-clien``), so a run costs what the gateway costs unobserved. A thread that should be
idle but spends CPU per request (a worker woken for every request) shows there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.loadgen import Result, ghz, protoset, vegeta
from benchmarks.serving_bench import (
    _create_topic,
    _gateway_config,
    _gateway_grpc_request,
    _wait_cache_serving,
)
from tests.support.stack import cpu_seconds, stat_cpu_seconds


def _report(data: Path, sort: str, lines: int) -> str:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio", "-g", "none"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    return "\n".join([x for x in out.splitlines() if x.strip() and not x.startswith("#")][:lines])


def _py_spy(pid: int, data: Path, secs: float, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """``py-spy record`` of ``pid`` for ``secs`` into ``data`` (collapsed stacks); ``gil``: only the thread holding
    the GIL is sampled (Python's own CPU, without the threads that wait)."""
    exe = Path(sys.executable).with_name("py-spy")
    rate = ["-r", "250", "-d", str(int(max(1, secs)))] + (["--gil"] if gil else [])
    return subprocess.Popen(
        [str(exe), "record", *rate, "-f", "raw", "-o", str(data), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds so far of each thread of ``pid``, by (thread id, name) (``/proc/<pid>/task``). Linux only."""
    out: dict[tuple[int, str], float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        out[(int(task.name), name)] = stat_cpu_seconds(task / "stat")
    return out


def _threads_line(before: dict[tuple[int, str], float], after: dict[tuple[int, str], float], n: int) -> str:
    used = sorted(((v - before.get(k, 0.0), k) for k, v in after.items()), reverse=True)
    return "per thread, ms per request: " + ", ".join(
        f"{name} {1e3 * cpu / max(1, n):.3f}" for cpu, (_, name) in used if cpu > 0
    )


def _perf(pid: int, data: Path, secs: float) -> subprocess.Popen[bytes]:
    cmd = ["perf", "record", "-F", "999", "-g", "-o", str(data), "-p", str(pid), "--", "sleep", str(secs)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def collapsed_shares(data: Path, top: int = 30) -> str:
    """Self and inclusive shares of the frames in py-spy's collapsed output ``data`` (one ``stack count`` a line)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in data.read_text().splitlines():
        if not line.strip():
            continue
        stack, n_text = line.rsplit(" ", 1)
        n = int(n_text)
        frames = stack.split(";")
        total += n
        own[frames[-1]] += n
        for f in set(frames[1:]):  # the first frame is the thread
            incl[f] += n
    out = [f"{total} samples; self:"]
    out += [f"{100 * n / max(1, total):5.1f} % {f}" for f, n in own.most_common(top)]
    out.append("inclusive:")
    out += [f"{100 * n / max(1, total):5.1f} % {f}" for f, n in incl.most_common(2 * top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.kafka import kafka_broker
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[64, 512, 4096])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--fronts", type=lambda s: s.split(","), default=["grpc", "rest"])
    p.add_argument("--profiler", choices=["perf", "py-spy", "py-spy-gil", "threads"], default="perf")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the gateway (repeatable)")
    args = p.parse_args(argv)
    if args.profiler == "perf" and shutil.which("perf") is None:
        raise SystemExit("perf is missing (Debian: apt-get install linux-perf)")
    recorders: dict[str, Callable[[int, Path, float], subprocess.Popen[bytes]]] = {
        "perf": _perf,
        "py-spy": _py_spy,
        "py-spy-gil": partial(_py_spy, gil=True),
    }
    record = recorders.get(args.profiler)
    env = dict(e.split("=", 1) for e in args.env)
    secs = min(args.seconds, 30.0)
    with tempfile.TemporaryDirectory(prefix="perfprofile-") as tmp_s:
        tmp = Path(tmp_s)
        demo = build_demo(tmp / "demo", small=True)
        m = demo.manifest
        proto_set = protoset(tmp / "tfs.protoset")
        with serve_local(exported_backends(demo.model_dir)) as backend, contextlib.ExitStack() as stack:
            broker = stack.enter_context(kafka_broker(tmp / "kafka"))
            asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
            port = free_port()
            cache = {"cache": {"max_bytes": 64 << 20, "bootstrap_servers": broker.bootstrap}}
            cfg = _gateway_config(tmp, demo, backend.target, port, cache, "cached.yaml", embedding_only=True)
            gw = stack.enter_context(run_gateway(cfg, ready_timeout=180, env=env))
            _wait_cache_serving(gw.url, m.model_name)
            pid = gw.proc.pid
            before = cpu_seconds(pid)
            time.sleep(3)
            print(f"idle gateway CPU: {(cpu_seconds(pid) - before) / 3 * 1e3:.1f} ms per second", flush=True)
            for b in args.batches:
                instances, _ = make_examples(b, 5_000, seed=b)
                req = _gateway_grpc_request(instances, m)
                body = json.dumps({"instances": instances}).encode()
                url = f"{gw.url}/v1/models/{m.model_name}:predict"
                loads: dict[str, Callable[[], Result]] = {
                    "grpc": partial(ghz, f"127.0.0.1:{port}", req, proto_set, clients=1, seconds=secs),
                    "rest": partial(vegeta, url, body, clients=1, seconds=secs),
                }
                for front in args.fronts:
                    load = loads[front]
                    load()  # warm
                    data = tmp / f"{args.profiler}-{b}-{front}.data"
                    start = cpu_seconds(pid)
                    threads = thread_cpu(pid)
                    prof = None if record is None else record(pid, data, secs)
                    res = load()
                    if prof is not None:
                        prof.wait(timeout=secs + 120)
                    cpu = (cpu_seconds(pid) - start) / max(1, res.requests)
                    print(
                        f"\n=== batch {b} {front}: p50 {res.p50_ms} ms, {res.requests} requests, gateway CPU "
                        f"{cpu * 1e3:.2f} ms per request, {cpu / b * 1e6:.2f} µs per example",
                        flush=True,
                    )
                    if args.profiler == "threads":
                        print(_threads_line(threads, thread_cpu(pid), res.requests), flush=True)
                    elif args.profiler == "perf":
                        print(_report(data, "dso", 8))
                        print(_report(data, "dso,sym", 25), flush=True)
                    else:
                        print(collapsed_shares(data), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
