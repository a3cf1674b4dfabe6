"""Pieces of the whole stack (serve-local backends, the updater process, PS reads) shared by integration tests, fault
tests and the soak, so each builds its stack from the same parts instead of its own copy.

Usage::

    backends = exported_backends(model_dir)                       # {"demo_entry": .../entry, "demo_ps_0": ...}
    model = embedding_model(model_dir, entry=a.target, shards=[[a.target], [a.target, b.target]])
    with run_updater({"models": [model], "bootstrap_servers": ...}, workdir) as upd:
        upd.metric("embedgate_updater_rows_applied_total")
    rows = ps_lookup(b.target, "demo_ps_1", manifest, "item_emb", ids)   # the PS ``lookup`` signature
    rss_bytes(pid)                                                         # resident memory of a process tree

The updater runs as its own process (``embedgate updater --config``), as in production: a test can SIGKILL it. Only
the wire protos of ``schemas.proto`` are used here (no TensorFlow, no updater internals).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from tests.support.ports import free_port

__all__ = [
    "UpdaterProc",
    "embedding_model",
    "exported_backends",
    "metric_sum",
    "ps_lookup",
    "rss_bytes",
    "run_updater",
]

_REPO = Path(__file__).resolve().parents[2]
_PREDICT = "/tensorflow.serving.PredictionService/Predict"


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


# -- configuration ----------------------------------------------------------------------------------------------------
def exported_backends(
    model_dir: Path, *, entry: bool = True, shards: Sequence[int] | None = None
) -> dict[str, Path]:
    """Served name -> base path of an exported model's entry (``entry``) and PS shards (``shards``, default all), the
    ``models`` argument of :func:`tests.support.servers.serve_local`."""
    from schemas.manifest import Manifest, entry_model_name, ps_dir_name, ps_model_name

    manifest = Manifest.load(model_dir)
    name = manifest.model_name
    out = {entry_model_name(name): model_dir / "entry"} if entry else {}
    for i in range(manifest.num_shards) if shards is None else shards:
        out[ps_model_name(name, i)] = model_dir / ps_dir_name(i)
    return out


def embedding_model(model_dir: Path, *, entry: str, shards: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The ``models:`` entry of gateway and updater settings for an exported model: ``entry`` target and the replica
    targets of each shard (``shards[i]`` = replicas of shard ``i``)."""
    from schemas.manifest import Manifest

    return {
        "kind": "embedding",
        "name": Manifest.load(model_dir).model_name,
        "manifest": str(model_dir),
        "entry": entry,
        "shards": [{"replicas": list(r)} for r in shards],
    }


# -- the updater process --------------------------------------------------------------------------------------------
@dataclass
class UpdaterProc:
    """``embedgate updater`` running as a child process; its Prometheus metrics on ``metrics_port``."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` with the log tail if the updater exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the updater exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"
            )

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 when there is none)."""
        return metric_sum(self.metrics_text(), name, labels)

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 20.0) -> int:
        """Send ``sig`` and reap the process (SIGKILL after ``timeout_s``); returns its exit status."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) process would not act on SIGTERM
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


@contextmanager
def run_updater(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    tag: str = "updater",
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[UpdaterProc]:
    """Write ``config`` (updater settings; ``metrics_port`` set to a free port unless given) to
    ``<workdir>/<tag>.yaml``, start ``embedgate updater`` on it, wait (bounded) until its metrics endpoint answers;
    SIGTERM it on exit (SIGKILL if it does not stop within 30 s). ``EMBEDGATE_*`` variables of this process are not
    passed on, so the YAML alone configures it; ``env`` adds variables (e.g. ``PYTHONMALLOC``). Output goes to
    ``<workdir>/<tag>.log``."""
    settings = dict(config)
    if not settings.get("metrics_port"):
        settings["metrics_port"] = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / f"{tag}.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    log_path = workdir / f"{tag}.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDGATE_")} | dict(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [_python(), "-m", "embedgate", "updater", "--config", str(cfg), *extra_args],
            cwd=_REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
        )
    upd = UpdaterProc(proc, log_path, int(settings["metrics_port"]))
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            upd.check_alive()
            try:
                upd.metrics_text()
                break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"updater metrics not up within {ready_timeout_s} s:\n{upd.log_tail()}")
            time.sleep(0.1)
        yield upd
    finally:
        upd.kill(signal.SIGTERM, timeout_s=30)


# -- reading the PS -------------------------------------------------------------------------------------------------
def ps_lookup(
    target: str, served_name: str, manifest: Any, table: str, ids: npt.ArrayLike, *, timeout_s: float = 10.0
) -> npt.NDArray[np.float32]:
    """Rows of ``ids`` in ``table`` as the PS servable ``served_name`` at ``target`` holds them (its ``lookup``
    signature; every other table gets an empty id list). Rows never written or deleted read the table's default."""
    import grpc

    from schemas.manifest import lookup_ids_input, lookup_values_output
    from schemas.proto import tfs_pb2

    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name=served_name, signature_name="lookup"))
    for t in manifest.tables:
        arr = np.ascontiguousarray(np.asarray(ids if t.name == table else [], dtype="<i8").reshape(-1))
        tensor = req.inputs[lookup_ids_input(t.name)]
        tensor.dtype = tfs_pb2.DT_INT64
        tensor.tensor_shape.dim.add().size = len(arr)
        tensor.tensor_content = arr.tobytes()
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        resp = call(req, timeout=timeout_s)
    out = resp.outputs[lookup_values_output(table)]
    shape = [d.size for d in out.tensor_shape.dim]
    if out.tensor_content:
        return np.frombuffer(out.tensor_content, dtype="<f4").reshape(shape).copy()
    return np.asarray(out.float_val, dtype=np.float32).reshape(shape)


# -- memory -----------------------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _pids(pid: int, tree: bool) -> list[int]:
    """``pid``, and with ``tree`` its descendants too (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        if tree:
            todo.extend(_children(p))
    return out


def metric_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples of ``name`` in Prometheus exposition ``text`` whose labels include ``labels`` (0.0 when there
    is none)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in (labels or {}).items()):
            total += float(m.group(2))
    return total


def rss_bytes(pid: int, *, tree: bool = True) -> int:
    """Resident set size of ``pid`` (``VmRSS`` in ``/proc/<pid>/status``), plus its descendants' with ``tree``;
    0 for a process that is gone. Linux only."""
    total = 0
    for p in _pids(pid, tree):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """User + system CPU seconds ``pid`` has used so far (``utime`` + ``stime`` of ``/proc/<pid>/stat``), plus its
    live descendants' with ``tree``; 0 for a process that is gone. Linux only."""
    return sum(stat_cpu_seconds(f"/proc/{p}/stat") for p in _pids(pid, tree))


def stat_cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds of one ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` file; 0 when it is
    gone. Linux only."""
    try:
        with open(stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields 14 and 15 of stat (utime, stime), counted after the command name
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
