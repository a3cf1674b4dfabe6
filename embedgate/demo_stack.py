"""``embedgate demo run|stop``: the demo stack `make run` starts, every part real and on 127.0.0.1.

``run`` builds the demo model when it is missing (``embedgate demo-model``), then starts, each as its own process
with its log under ``<workdir>/logs``:

1. a single-node Apache Kafka broker (``embedgate.devkafka.KafkaBroker``);
2. ``embedgate serve-local`` serving ``demo_entry``, ``demo_ps_0`` .. ``demo_ps_<n-1>`` on the backend port (8600);
3. ``embedgate updater`` consuming the delta topic and writing to the PS shards;
4. ``embedgate gateway`` serving TF Serving's APIs on TF Serving's ports: gRPC 8500, REST 8501;
5. unless ``--no-trainer``: a small online trainer (:mod:`embedgate.train.demo`) that keeps training the demo model
   on a synthetic click stream whose preferences drift, publishes the rows it changes with ``StreamRows`` and writes
   a new entry version every minute, so predictions move on their own. Benchmarks and tests that need a PS only they
   write to pass ``--no-trainer`` (``DemoStack(trainer=False)``). The trainer is optional: if it exits, its log tail
   is printed and the rest keeps running.

It waits until the gateway is ready, prints what to try, and supervises: Ctrl-C (or SIGTERM, or ``embedgate demo
stop`` from another shell) stops every process it started, in reverse order; if one of them dies, the rest are
stopped and its log tail is printed. Nothing else is touched: processes are tracked by the pids this command started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["DemoStack", "register"]

_MODEL = "demo"
_READY_TIMEOUT_S = 120.0


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    optional: bool = False  # its exit is reported, the rest keeps running


@dataclass
class DemoStack:
    """Owns the demo's processes. Not thread-safe; one per ``embedgate demo run``."""

    workdir: Path
    grpc_port: int = 8500  # the gateway's gRPC API (TF Serving's gRPC port)
    rest_port: int = 8501  # the gateway's REST API (TF Serving's REST port)
    backend_port: int = 8600  # serve-local (entry + PS shards), reached only by the gateway and the updater
    kafka_port: int = 9092
    metrics_port: int = 9464
    children: list[_Child] = field(default_factory=list)
    broker: Any = None
    trainer: bool = True  # start the online trainer (embedgate.train.demo)

    @property
    def models_dir(self) -> Path:
        return self.workdir / "models"

    @property
    def model_dir(self) -> Path:
        return self.models_dir / _MODEL

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    # -- steps ------------------------------------------------------------------------------------------------
    def ensure_model(self, rebuild: bool) -> None:
        if rebuild or not (self.model_dir / "manifest.json").exists():
            print(f"building the demo model into {self.model_dir} (one time) ...", flush=True)
            shutil.rmtree(self.model_dir, ignore_errors=True)
            cmd = [
                sys.executable,
                "-m",
                "embedgate",
                "demo-model",
                "--out",
                str(self.models_dir),
                "--name",
                _MODEL,
            ]
            subprocess.run(cmd, check=True)

    def start_kafka(self) -> str:
        from embedgate.devkafka import KafkaBroker

        self.broker = KafkaBroker(self.workdir / "kafka", port=self.kafka_port)
        self.broker.start()
        return str(self.broker.bootstrap)

    def write_configs(self, bootstrap: str) -> tuple[Path, Path, Path]:
        from embedgate.export.placement import SERVED_VERSIONS
        from schemas.manifest import Manifest, entry_model_name, ps_dir_name, ps_model_name

        manifest = Manifest.load(self.model_dir)
        served = {entry_model_name(_MODEL): self.model_dir / "entry"}
        for i in range(manifest.num_shards):
            served[ps_model_name(_MODEL, i)] = self.model_dir / ps_dir_name(i)
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        models_config = conf / "models.config"
        models_config.write_text(
            "model_config_list {\n"
            + "".join(
                f'  config {{\n    name: "{name}"\n    base_path: "{path.resolve()}"\n'
                f'    model_platform: "tensorflow"\n'
                f"    model_version_policy {{ latest {{ num_versions: {SERVED_VERSIONS} }} }}\n  }}\n"
                for name, path in served.items()
            )
            + "}\n"
        )
        target = f"127.0.0.1:{self.backend_port}"
        model_yaml = (
            "models:\n"
            f"  - kind: embedding\n    name: {_MODEL}\n    manifest: {self.model_dir.resolve()}\n"
            f"    entry: '{target}'\n    shards:\n"
            + "".join(f"      - replicas: ['{target}']\n" for _ in range(manifest.num_shards))
        )
        gateway_yaml = conf / "gateway.yaml"
        gateway_yaml.write_text(model_yaml)
        updater_yaml = conf / "updater.yaml"
        updater_yaml.write_text(
            model_yaml + f"bootstrap_servers: '{bootstrap}'\nmetrics_port: {self.metrics_port}\n"
        )
        return models_config, gateway_yaml, updater_yaml

    def spawn(self, name: str, *args: str, module: str = "embedgate", optional: bool = False) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=_repo_root(),
                start_new_session=True,
            )
        self.children.append(_Child(name, proc, log, optional))
        print(f"started {name} (pid {proc.pid}), log {log}", flush=True)

    def start_trainer(self, bootstrap: str) -> None:
        """The online trainer, when asked for and the demo's Keras model is there."""
        if not self.trainer:
            return
        if not (self.models_dir / f"{_MODEL}.keras").is_file():
            print(
                f"no {self.models_dir / (_MODEL + '.keras')}: the online trainer is not started", flush=True
            )
            return
        self.spawn(
            "trainer",
            "--models",
            str(self.models_dir),
            "--name",
            _MODEL,
            "--bootstrap",
            bootstrap,
            module="embedgate.train.demo",
            optional=True,
        )

    def wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.rest_port}/readyz"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_children()
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the gateway was not ready within {_READY_TIMEOUT_S:.0f} s; see {self.logs}")

    def check_children(self) -> None:
        for child in list(self.children):
            if child.proc.poll() is not None:
                tail = child.log.read_text(errors="replace").splitlines()[-25:]
                if child.optional:
                    print(
                        f"{child.name} exited with code {child.proc.returncode}; the rest keeps running. Last log "
                        "lines:\n" + "\n".join(tail),
                        flush=True,
                    )
                    self.children.remove(child)
                    continue
                raise RuntimeError(
                    f"{child.name} exited with code {child.proc.returncode}; last log lines:\n"
                    + "\n".join(tail)
                )

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                child.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(timeout=5)
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def banner(self) -> str:
        body = self.model_dir / "example_request.json"
        rest = f"http://127.0.0.1:{self.rest_port}"
        return f"""
embedgate demo is up.
  REST (TF Serving API) {rest}     OpenAPI docs {rest}/docs     metrics {rest}/metrics
  gRPC (TF Serving API) 127.0.0.1:{self.grpc_port}     health: grpc.health.v1.Health
  backends (serve-local) 127.0.0.1:{self.backend_port}     Kafka 127.0.0.1:{self.kafka_port}

Predict:
  curl -s {rest}/v1/models/{_MODEL}:predict -d @{body}
Publish a changed embedding for item 3, the first example's item (then predict again):
  .venv/bin/embedgate publish --bootstrap 127.0.0.1:{self.kafka_port} --manifest {self.model_dir} \\
      --table item_emb --id 3 --fill 0.5
{self._trainer_line()}Ctrl-C stops everything.
"""

    def _trainer_line(self) -> str:
        if not any(c.name == "trainer" for c in self.children):
            return ""
        return (
            f"An online trainer keeps training (log {self.logs / 'trainer.log'}): it streams the rows it changes and\n"
            "refreshes the entry every minute, so the prediction above moves on its own; watch it with\n"
            f"  watch -n 2 curl -s http://127.0.0.1:{self.rest_port}/v1/models/{_MODEL}:predict "
            f"-d @{self.model_dir / 'example_request.json'}\n"
        )


def _run(args: argparse.Namespace) -> int:
    stack = DemoStack(
        workdir=Path(args.workdir).resolve(),
        grpc_port=args.grpc_port,
        rest_port=args.rest_port,
        backend_port=args.backend_port,
        kafka_port=args.kafka_port,
        metrics_port=args.metrics_port,
        trainer=args.trainer,
    )
    pid_file = stack.workdir / "demo.pid"
    stack.workdir.mkdir(parents=True, exist_ok=True)
    stopping = False

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    pid_file.write_text(str(os.getpid()))
    try:
        stack.ensure_model(args.rebuild)
        bootstrap = stack.start_kafka()
        models_config, gateway_yaml, updater_yaml = stack.write_configs(bootstrap)
        stack.spawn(
            "serve-local",
            "serve-local",
            "--port",
            str(stack.backend_port),
            "--model_config_file",
            str(models_config),
            "--file_system_poll_wait_seconds",
            "1",
        )
        stack.spawn("updater", "updater", "--config", str(updater_yaml))
        stack.spawn(
            "gateway",
            "gateway",
            "--config",
            str(gateway_yaml),
            "--host",
            "127.0.0.1",
            "--port",
            str(stack.rest_port),
            "--grpc-port",
            str(stack.grpc_port),
        )
        stack.wait_ready()
        stack.start_trainer(bootstrap)
        print(stack.banner(), flush=True)
        while not stopping:
            stack.check_children()
            time.sleep(0.5)
        print("stopping the demo stack ...", flush=True)
        return 0
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"embedgate demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()


def _stop(args: argparse.Namespace) -> int:
    pid_file = Path(args.workdir) / "demo.pid"
    try:
        pid = int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        print("no demo stack is running")
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    print(f"sent SIGTERM to the demo stack (pid {pid})")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run the demo stack (make run)")
    sub = parser.add_subparsers(dest="demo_command", required=True)
    default_dir = str(_repo_root() / "var" / "demo")
    run = sub.add_parser(
        "run", help="build the demo model if missing and run Kafka, serve-local, updater, gateway"
    )
    run.add_argument(
        "--workdir", default=default_dir, help="models, configs, logs and Kafka data (default var/demo)"
    )
    run.add_argument("--grpc-port", type=int, default=8500, help="the gateway's gRPC port")
    run.add_argument("--rest-port", type=int, default=8501, help="the gateway's REST port")
    run.add_argument("--backend-port", type=int, default=8600, help="serve-local's gRPC port (entry + PS)")
    run.add_argument("--kafka-port", type=int, default=9092)
    run.add_argument("--metrics-port", type=int, default=9464, help="updater metrics")
    run.add_argument("--rebuild", action="store_true", help="rebuild the demo model")
    run.add_argument(
        "--no-trainer",
        dest="trainer",
        action="store_false",
        help="do not start the online trainer (a PS that only you write to: benchmarks, tests)",
    )
    run.set_defaults(func=_run)
    stop = sub.add_parser("stop", help="stop a demo stack started by `embedgate demo run`")
    stop.add_argument("--workdir", default=default_dir)
    stop.set_defaults(func=_stop)
