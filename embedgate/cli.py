"""``embedgate <command>``: the one entry point; every command module is imported lazily.

Each module listed in ``_COMMAND_MODULES`` defines ``register(subparsers)``, which adds its subcommands with
``parser.set_defaults(func=<callable(args) -> int>)``. Those modules must stay light at import (no TensorFlow, no
grpc servers): heavy imports happen inside the command function.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

_COMMAND_MODULES = (
    "embedgate.export.cli",  # export, demo-model, tables, placement, helm-values
    "embedgate.deploy.cli",  # deploy compose | helm
    "embedgate.localserve.cli",  # serve-local
    "gateway.cli",  # gateway
    "updater.cli",  # updater, publish
    "embedgate.devkafka",  # kafka (development broker)
    "embedgate.demo_stack",  # demo (what `make run` starts)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedgate",
        description="Serve recommendation models with sharded, streaming-updated embedding tables behind "
        "TF Serving's API.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
