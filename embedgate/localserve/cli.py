"""``embedgate serve-local``: a TF-Serving-compatible gRPC server for development, demos and tests.

Flags mirror ``tensorflow_model_server``'s (``--port=8500``, ``--model_config_file=...``); dashed spellings are
accepted too. Import-light: TensorFlow and grpc are imported when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {value}")
    return value


def register(subparsers: Any) -> None:
    from embedgate.localserve.memory import MMAP_THRESHOLD  # ctypes only: keeps the CLI import-light

    p = subparsers.add_parser(
        "serve-local",
        help="serve SavedModels over TF Serving's gRPC API (development stand-in for tensorflow_model_server)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--port", type=int, default=8500, help="gRPC port (default 8500)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--model_config_file",
        "--model-config-file",
        type=Path,
        default=None,
        help="TF Serving model config (text ModelServerConfig with model_config_list)",
    )
    p.add_argument(
        "--model_name",
        "--model-name",
        default="default",
        help="served name when using --model_base_path (default 'default')",
    )
    p.add_argument(
        "--model_base_path",
        "--model-base-path",
        type=Path,
        default=None,
        help="directory of numeric version dirs (single-model form)",
    )
    p.add_argument(
        "--file_system_poll_wait_seconds",
        "--file-system-poll-wait-seconds",
        type=float,
        default=1.0,
        help="seconds between scans for new/removed versions; <= 0 = scan once (default 1)",
    )
    p.add_argument(
        "--model_config_file_poll_wait_seconds",
        "--model-config-file-poll-wait-seconds",
        type=float,
        default=0.0,
        help="seconds between re-reads of --model_config_file; 0 = read once (default)",
    )
    p.add_argument(
        "--grpc_max_threads",
        "--grpc-max-threads",
        type=int,
        default=0,
        help="gRPC worker threads (default 4 x CPUs, at least 8)",
    )
    p.add_argument(
        "--enable_serialization_as_tensor_content",
        "--enable-serialization-as-tensor-content",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="encode Predict outputs in tensor_content instead of typed *_val fields",
    )
    p.add_argument(
        "--enable_batching",
        "--enable-batching",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="merge concurrent Predict calls of a model into one session run (docs/serve-local.md)",
    )
    p.add_argument(
        "--batching_parameters_file",
        "--batching-parameters-file",
        type=Path,
        default=None,
        help="TF Serving BatchingParameters text file (max_batch_size, batch_timeout_micros, ...); "
        "needs --enable_batching",
    )
    p.add_argument(
        "--rest_api_port",
        "--rest-api-port",
        type=int,
        default=0,
        help="accepted for command-line compatibility; must be 0 (no REST API here: use the gateway)",
    )
    p.add_argument(
        "--ssl_config_file",
        "--ssl-config-file",
        type=Path,
        default=None,
        help="TF Serving SSLConfig text proto (server_key, server_cert, custom_ca, client_verify): "
        "serve gRPC over TLS; client_verify: true requires client certificates signed by custom_ca",
    )
    p.add_argument(
        "--malloc_trim_interval_seconds",
        "--malloc-trim-interval-seconds",
        type=float,
        default=2.0,
        help="return free malloc memory to the OS (glibc malloc_trim) every this many seconds; <= 0 = never "
        "(default 2; docs/serve-local.md, Memory)",
    )
    p.add_argument(
        "--malloc_mmap_threshold_bytes",
        "--malloc-mmap-threshold-bytes",
        type=_bytes,
        default=MMAP_THRESHOLD,
        help="glibc malloc: blocks above this many bytes are mmap'ed and unmapped on free; the trim threshold is "
        "set to twice it; 0 = glibc's dynamic thresholds (default 1048576, for PS writes; an entry server taking "
        "multi-megabyte requests wants 33554432: docs/serve-local.md, Memory)",
    )
    p.add_argument("--log_level", "--log-level", default="INFO", help="Python log level (default INFO)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from embedgate.localserve.memory import configure_malloc

    malloc = configure_malloc(mmap_threshold=args.malloc_mmap_threshold_bytes)  # first: before any thread
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if malloc:
        logging.getLogger(__name__).info("malloc settings (docs/serve-local.md, Memory): %s", malloc)
    if args.rest_api_port:
        print(
            "serve-local: --rest_api_port must be 0: serve-local has no REST API (the gateway provides it)",
            file=sys.stderr,
        )
        return 2
    if args.model_config_file is not None and args.model_base_path is not None:
        print("serve-local: give either --model_config_file or --model_base_path, not both", file=sys.stderr)
        return 2
    from embedgate.localserve.errors import ConfigError
    from embedgate.localserve.model_config import load_config_file

    if args.model_config_file is not None:
        try:  # fail fast, before TensorFlow is imported
            load_config_file(args.model_config_file)
        except ConfigError as exc:
            print(f"serve-local: {exc}", file=sys.stderr)
            return 2
    ssl_config = None
    if args.ssl_config_file is not None:
        from embedgate.localserve.ssl_config import load_ssl_config_file

        try:
            ssl_config = load_ssl_config_file(args.ssl_config_file)
        except ConfigError as exc:
            print(f"serve-local: {exc}", file=sys.stderr)
            return 2
    batching = None
    if args.enable_batching:
        from embedgate.localserve.batching import BatchingParameters, load_batching_parameters

        try:
            batching = (
                load_batching_parameters(args.batching_parameters_file)
                if args.batching_parameters_file is not None
                else BatchingParameters()
            )
        except ConfigError as exc:
            print(f"serve-local: {exc}", file=sys.stderr)
            return 2
    elif args.batching_parameters_file is not None:
        print("serve-local: --batching_parameters_file needs --enable_batching", file=sys.stderr)
        return 2
    from embedgate.localserve.server import ServerOptions, run

    options = ServerOptions(
        host=args.host,
        port=args.port,
        model_config_file=args.model_config_file,
        model_name=args.model_name,
        model_base_path=args.model_base_path,
        file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
        model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
        grpc_max_threads=args.grpc_max_threads,
        malloc_trim_seconds=args.malloc_trim_interval_seconds,
        tensor_content=args.enable_serialization_as_tensor_content,
        ssl_config=ssl_config,
        batching=batching,
    )
    try:
        code = run(options)
    except (ConfigError, OSError) as exc:
        print(f"serve-local: {exc}", file=sys.stderr)
        return 2
    # Everything is closed; skip TensorFlow's slow interpreter teardown (seconds) so restarts are quick.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
