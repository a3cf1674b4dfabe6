"""``embedgate gateway --config gateway.yaml [--host H] [--port P] [--grpc-port G] [--workers N]``: REST on uvicorn,
plus TF Serving's gRPC API on ``grpc_port`` when set (a ``grpc.aio`` server in the same event loop, run by the
lifespan; with several workers each worker serves it on the shared port through SO_REUSEPORT, gRPC's default).

With ``workers > 1`` this process becomes uvicorn's supervisor (it restarts a worker that dies) of N worker processes
that accept on one listening socket bound here. The socket is created with ``IPPROTO_TCP`` so that asyncio sets
``TCP_NODELAY`` on every accepted connection in the workers (a socket made by ``socket.socket(AF_INET)``, as uvicorn's
own ``bind_socket`` does, has ``proto`` 0 and asyncio then leaves Nagle on: ~40 ms delayed-ACK stalls on keep-alive
connections). Each worker rebuilds the settings validated here and creates its own app; ``PROMETHEUS_MULTIPROC_DIR``
points at a temporary directory made here and removed on exit, so ``/metrics`` of any worker aggregates all of them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
from typing import Any

__all__ = ["register"]

_SETTINGS_ENV = "_EMBEDGATE_WORKER_SETTINGS"  # the validated settings as JSON, for the worker processes
_UVICORN: dict[str, Any] = {
    "log_config": None,
    "access_log": False,
    "timeout_graceful_shutdown": 10,
    "timeout_keep_alive": 75,
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway", help="serve TF Serving's REST and gRPC APIs in front of TF Serving / PS backends"
    )
    p.add_argument("--config", required=True, help="gateway YAML config (every key also EMBEDGATE_<KEY>)")
    p.add_argument("--host", default=None, help="bind address (default: config host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="REST port (default: config port, 8501)")
    p.add_argument(
        "--grpc-port", type=int, default=None, help="gRPC port (default: config grpc_port; 0 = no gRPC API)"
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="processes sharing the port (default: config workers, 1)",
    )
    p.set_defaults(func=_run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _run(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from gateway.app import create_app
    from gateway.logs import configure_logging
    from schemas.gateway_settings import load_settings

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.grpc_port is not None:
        overrides["grpc_port"] = args.grpc_port
    if args.workers is not None:
        overrides["workers"] = args.workers
    try:
        settings = load_settings(args.config)
        if overrides:  # flags beat env and file
            settings = settings.model_copy(update=overrides)
        configure_logging(settings.log.format, settings.log.level)
        malloc = _configure_malloc(settings.malloc_mmap_threshold_bytes)
        if settings.tls is not None:
            _check_server_tls(settings.tls.cert_file, settings.tls.key_file, settings.tls.client_ca_file)
        if settings.backend_tls is not None:
            settings.backend_tls.read()  # unreadable or non-PEM files fail here, not in the lifespan
        app = create_app(settings)
    except (ValidationError, ValueError) as exc:
        print(f"embedgate gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("embedgate.gateway").info(
        "config",
        extra={
            "config": settings.model_dump(mode="json", exclude={"models"}),
            "models": [m.name for m in settings.models],
            "malloc": malloc,
        },
    )
    if settings.workers > 1:
        if settings.ops_port is not None:
            print("embedgate gateway: invalid configuration: ops_port needs workers: 1", file=sys.stderr)
            return 2
        del app  # built only to reject a bad config here; each worker builds its own
        return _run_workers(settings)
    from gateway.servers import run

    # public port (TLS when configured) + ops port when ops_port is set; uvicorn limits from settings.limits
    run(app, settings, **_ssl_args(settings), timeout_graceful_shutdown=10, timeout_keep_alive=75)
    return 0


def _configure_malloc(mmap_threshold: int) -> dict[str, int]:
    """glibc's mmap and trim thresholds for this process (``malloc_mmap_threshold_bytes``; before any thread starts)
    and, through the environment glibc reads at start, for the worker processes ``workers > 1`` spawns. Returns
    {glibc variable: value} of what was set here (empty: all from the environment, 0, or not glibc)."""
    from embedgate.localserve.memory import configure_malloc

    done = configure_malloc(mmap_threshold=mmap_threshold)
    for name, value in done.items():
        os.environ.setdefault(name, str(value))
    return done


def _ssl_args(settings: Any) -> dict[str, Any]:
    """uvicorn's TLS arguments for the REST port (none without ``tls``); ``client_ca_file``: only clients with a
    certificate signed by that CA get through."""
    import ssl

    tls = settings.tls
    if tls is None:
        return {}
    out: dict[str, Any] = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    if tls.client_ca_file is not None:
        out |= {"ssl_ca_certs": str(tls.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return out


def _listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for the workers to share; ``IPPROTO_TCP`` makes asyncio set TCP_NODELAY on accepts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _run_workers(settings: Any) -> int:
    import logging

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from gateway.metrics import MULTIPROC_ENV
    from gateway.servers import limit_options

    if settings.rest_front == "gate":  # the workers share the supervisor's socket: uvicorn listens on it
        logging.getLogger("embedgate.gateway").info(
            "rest started", extra={"rest_front": "python", "port": settings.port, "why": "workers > 1"}
        )
    metrics_dir = tempfile.mkdtemp(prefix="embedgate-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir  # before the workers import prometheus_client
    os.environ[_SETTINGS_ENV] = settings.model_dump_json()
    try:
        sock = _listen_socket(settings.host, settings.port)
    except OSError as exc:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        print(f"embedgate gateway: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    config = uvicorn.Config(
        "gateway.cli:_worker_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        **_UVICORN,
        loop=settings.event_loop,  # each worker's event loop
        **_ssl_args(settings),
        **limit_options(settings),
    )
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _worker_app() -> Any:
    """The app of one worker process (uvicorn's factory): settings from the supervisor, logging, create_app."""
    from gateway.app import create_app
    from gateway.logs import configure_logging
    from schemas.gateway_settings import GatewaySettings

    settings = GatewaySettings.model_validate_json(os.environ[_SETTINGS_ENV])
    configure_logging(settings.log.format, settings.log.level)
    return create_app(settings)


def _check_server_tls(cert: Any, key: Any, client_ca: Any) -> None:
    """Load the REST TLS files once so a bad file is a one-line error, not a traceback from uvicorn."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls.cert_file {cert} / tls.key_file {key}: cannot load: {exc}") from exc
    if client_ca is not None:
        try:
            ctx.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"tls.client_ca_file {client_ca}: cannot load: {exc}") from exc
