"""The ``serve-local`` process: manager + pollers + gRPC server, stopped gracefully by SIGTERM/SIGINT."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from embedgate.localserve.batching import BatchingParameters
from embedgate.localserve.front import gate_wanted, native_front, upstream_dir
from embedgate.localserve.manager import Manager
from embedgate.localserve.model_config import ModelEntry, load_config_file, single_model
from embedgate.localserve.servable import Servable
from embedgate.localserve.service import add_services
from embedgate.localserve.source import Poller
from embedgate.localserve.ssl_config import SslConfig

__all__ = ["ServerOptions", "run"]

_log = logging.getLogger(__name__)
_MAX_MESSAGE = 2**31 - 1  # TF Serving's SetMaxMessageSize(INT32_MAX)


@dataclass(frozen=True)
class ServerOptions:
    """Parsed ``serve-local`` flags. Exactly one of ``model_config_file`` / (``model_name``, ``model_base_path``)."""

    host: str = "127.0.0.1"
    port: int = 8500
    model_config_file: Path | None = None
    model_name: str = "default"
    model_base_path: Path | None = None
    file_system_poll_wait_seconds: float = 1.0
    model_config_file_poll_wait_seconds: float = 0.0
    grpc_max_threads: int = 0  # 0 = 4 x CPUs (at least 8)
    tensor_content: bool = False
    batching: BatchingParameters | None = None  # --enable_batching (+ --batching_parameters_file)
    grace_seconds: float = 5.0
    malloc_trim_seconds: float = (
        2.0  # --malloc_trim_interval_seconds: malloc_trim(0) this often; <= 0 = never
    )
    ssl_config: SslConfig | None = None  # --ssl_config_file: TLS (and client certificates) on the gRPC port


def run(options: ServerOptions) -> int:
    """Load the models, serve until SIGTERM/SIGINT, stop gracefully. Returns the exit code."""
    entries = _entries(options)
    manager = Manager(functools.partial(Servable.load, batching=options.batching))
    manager.set_models(entries)
    manager.reconcile()  # initial load, before the port opens (as tensorflow_model_server does)

    fs_poller = Poller("fs-poll", options.file_system_poll_wait_seconds, manager.reconcile)

    def reload_config() -> None:
        assert options.model_config_file is not None
        manager.set_models(load_config_file(options.model_config_file))
        manager.reconcile()

    config_poller = Poller(
        "config-poll",
        options.model_config_file_poll_wait_seconds if options.model_config_file else 0,
        reload_config,
    )

    from embedgate.localserve.memory import trim_malloc

    def trim() -> None:
        trim_malloc()

    trimmer = Poller("malloc-trim", options.malloc_trim_seconds, trim)
    threads = options.grpc_max_threads or max(8, 4 * (os.cpu_count() or 1))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=None,
    )
    prediction = add_services(
        server, manager, tensor_content=options.tensor_content, reload=manager.reconcile
    )
    address = f"{options.host}:{options.port}"
    gated = gate_wanted(tls=options.ssl_config is not None)
    directory, upstream = upstream_dir() if gated else ("", "")
    if options.ssl_config is not None:
        bound = server.add_secure_port(address, options.ssl_config.server_credentials())
    else:
        bound = server.add_insecure_port(upstream if gated else address)
    if bound == 0:
        manager.close()
        raise OSError(f"cannot bind gRPC port {address}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    server.start()
    front = None
    if gated:
        try:
            front = native_front(options.host, options.port, directory, upstream, prediction.Predict, threads)
        except OSError as exc:
            server.stop(0)
            manager.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise OSError(f"cannot bind gRPC port {address}: {exc}") from exc
    fs_poller.start()
    config_poller.start()
    trimmer.start()
    _log.info(
        "Running gRPC ModelServer at %s%s (models: %s)",
        address,
        ""
        if options.ssl_config is None
        else " with TLS" + (", client certificates required" if options.ssl_config.client_verify else ""),
        ", ".join(manager.model_names()),
    )
    _log.info("gRPC front: %s", "native gate, Predict in whole messages" if front else "Python gRPC server")
    print(f"serve-local: listening on {address}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        _log.info("Shutting down: draining requests (up to %.1f s)", options.grace_seconds)
        if front is not None:
            front.close(options.grace_seconds)
        server.stop(options.grace_seconds).wait(options.grace_seconds + 1)
        fs_poller.stop()
        config_poller.stop()
        trimmer.stop()
        manager.close()
    return 0


def _entries(options: ServerOptions) -> list[ModelEntry]:
    if options.model_config_file is not None:
        return load_config_file(options.model_config_file)
    if options.model_base_path is None:
        from embedgate.localserve.errors import ConfigError

        raise ConfigError("give --model_config_file, or --model_name and --model_base_path")
    return single_model(options.model_name, options.model_base_path)
