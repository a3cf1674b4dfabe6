"""``embedgate updater --config updater.yaml`` and ``embedgate publish ...``.

Heavy imports (aiokafka, grpc) happen inside the command functions; registering the commands is cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from updater.kafka_security import add_security_arguments, security_from_args

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("updater", help="apply Kafka embedding deltas to every PS replica")
    p.add_argument("--config", type=Path, required=True, help="updater YAML (see docs/updater.md)")
    p.add_argument(
        "--replay-since",
        metavar="WHEN",
        default=None,
        help="on startup, seek back to WHEN and re-apply from there (overrides replay_since): an ISO-8601 "
        "timestamp (2026-11-22T04:00:00Z), a duration ago (90s, 15m, 2h, 1d), or 'export' (the newest PS "
        "export's time); restores rows a restarted PS lost",
    )
    p.set_defaults(func=_run_updater)

    p = subparsers.add_parser("publish", help="publish absolute embedding rows (or deletes) to Kafka")
    p.add_argument(
        "--bootstrap", "--bootstrap-servers", default="127.0.0.1:9092", help="Kafka bootstrap servers"
    )
    p.add_argument(
        "--topic", default=None, help="delta topic (default the model's own: embedgate.deltas.<model>)"
    )
    p.add_argument(
        "--manifest", type=Path, required=True, help="manifest.json or the model directory holding it"
    )
    p.add_argument("--table", required=True, help="embedding table")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--id",
        type=int,
        action="append",
        dest="ids",
        help="a PS id (repeatable); refused for a table behind a lookup layer: use --key",
    )
    src.add_argument(
        "--key",
        action="append",
        dest="keys",
        help="a raw value of the model's own (repeatable), for a table behind StringLookup / IntegerLookup / "
        "Hashing: mapped to its PS key exactly as the gateway maps a request's value",
    )
    src.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="HPS table dir (key + emb_vector files), .npz (ids/values) or .npy (values for ids 0..n-1)",
    )
    p.add_argument(
        "--values", default=None, help="comma-separated row for --id (dim floats; repeated per id)"
    )
    p.add_argument(
        "--fill", type=float, default=None, help="row of dim copies of this value for --id / --key"
    )
    p.add_argument("--delete", action="store_true", help="delete the ids instead of upserting rows")
    p.add_argument(
        "--format",
        choices=["binary", "json", "hps"],
        default="binary",
        help="message encoding; hps = HugeCTR HPS format on topic hps_et.<model>.<table> (upserts only)",
    )
    p.add_argument("--producer-id", default=None, help="producer id written into each message")
    add_security_arguments(p)
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds before giving up on Kafka (exit 1, nothing retried)",
    )
    p.set_defaults(func=_run_publish)


def _run_updater(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from schemas.updater_settings import UpdaterSettings, parse_replay_since
    from updater.errors import ConfigError

    try:
        settings = UpdaterSettings.from_yaml(args.config)
    except (ValueError, TypeError, ValidationError) as exc:
        print(f"embedgate updater: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.replay_since is not None:  # the flag wins over the file and EMBEDGATE_REPLAY_SINCE
        try:
            parse_replay_since(args.replay_since, now=time.time())
        except ValueError as exc:
            print(f"embedgate updater: --replay-since: {exc}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"replay_since": args.replay_since.strip()})
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    from aiokafka.errors import KafkaError

    from schemas.tls import TLSFileError
    from updater.kafka_security import client_kwargs, connect_failures

    try:  # certificate, key and password files: fail now with the file's name
        if settings.backend_tls is not None:
            settings.backend_tls.read()
        client_kwargs(settings.kafka_security())
    except TLSFileError as exc:
        print(f"embedgate updater: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        with connect_failures() as causes:
            return asyncio.run(_serve(settings))
    except ConfigError as exc:
        print(f"embedgate updater: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:
        # nothing was committed past what every replica acknowledged; a restart resumes from there
        print(
            f"embedgate updater: Kafka at {settings.bootstrap_servers}: {_kafka_error(exc, causes)}",
            file=sys.stderr,
        )
        return 1


def _kafka_error(exc: BaseException, causes: list[str]) -> str:
    """``exc`` plus the last connection failure aiokafka logged (e.g. a SASL or TLS failure), on one line."""
    text = f"{exc!r}"
    if causes:
        text += f" (last failure: {causes[-1]})"
    return text


async def _serve(settings: Any) -> int:
    from updater.consumer import Updater

    updater = Updater(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, updater.stop)
    port = None
    if settings.metrics_port:
        from updater.errors import ConfigError

        try:
            port = updater.metrics.serve(settings.metrics_port, settings.metrics_host)
        except OSError as exc:
            raise ConfigError(
                f"metrics_port: cannot serve /metrics on {settings.metrics_host}:{settings.metrics_port}: {exc}"
            ) from exc
    logging.getLogger("embedgate.updater").info(
        "updater consuming %s (hps %s) from %s as group %s; metrics on %s",
        settings.delta_topics,
        settings.hps_pattern,
        settings.bootstrap_servers,
        settings.consumer_group,
        f"{settings.metrics_host}:{port}" if port else "off",
    )
    try:
        await updater.run()
    finally:
        updater.metrics.close()
    logging.getLogger("embedgate.updater").info("updater stopped: offsets committed, group left")
    return 0


def _run_publish(args: argparse.Namespace) -> int:
    import numpy as np

    from schemas.manifest import Manifest, ManifestError

    try:
        manifest = Manifest.load(args.manifest)
        spec = manifest.table(args.table)
    except ManifestError as exc:
        print(f"embedgate publish: {exc}", file=sys.stderr)
        return 2
    except KeyError:
        tables = ", ".join(t.name for t in manifest.tables)
        print(
            f"embedgate publish: model {manifest.model_name!r} has no table {args.table!r} (tables: {tables})",
            file=sys.stderr,
        )
        return 2
    values = None
    try:
        if args.ids is not None or args.keys is not None:
            ids = _ids_or_keys(args, manifest)
            if not args.delete:
                if (args.values is None) == (args.fill is None):
                    raise ValueError("give exactly one of --values or --fill with --id / --key (or --delete)")
                if args.values is not None:
                    row = np.asarray([float(x) for x in args.values.split(",")], dtype=np.float32)
                else:
                    row = np.full(spec.dim, args.fill, dtype=np.float32)
                if row.size == spec.dim:
                    values = np.tile(row, (len(ids), 1))
                elif row.size == spec.dim * len(ids):
                    values = row.reshape(len(ids), spec.dim)
                else:
                    raise ValueError(
                        f"--values has {row.size} numbers; table {args.table!r} has dim {spec.dim}"
                    )
        else:
            from updater.producer import load_rows

            ids, rows = load_rows(args.source, spec.dim)
            values = None if args.delete else rows
        security = security_from_args(args)
        from updater.kafka_security import client_kwargs

        client_kwargs(security)  # loads the CA / client certificate and reads the password file: fail here
    except ValueError as exc:
        print(f"embedgate publish: {exc}", file=sys.stderr)
        return 2
    if args.format == "hps" and args.delete:
        print("embedgate publish: the HPS format has no delete", file=sys.stderr)
        return 2
    # aiokafka's connection noise goes only to connect_failures' collector; one line is printed below
    logging.getLogger("aiokafka").propagate = False
    from aiokafka.errors import KafkaError

    from updater.kafka_security import connect_failures

    causes: list[str] = []
    try:
        with connect_failures() as causes:
            return asyncio.run(
                asyncio.wait_for(_publish(args, manifest, ids, values, security), args.timeout)
            )
    except (KafkaError, OSError, TimeoutError) as exc:
        if isinstance(exc, TimeoutError):
            what = f"timed out after {args.timeout:g} s"
            if causes:
                what += f" ({causes[-1]})"
        elif isinstance(exc, KafkaError):
            what = _kafka_error(exc, causes)
        else:
            what = f"{exc!r}"
        print(
            f"embedgate publish: Kafka at {args.bootstrap}: {what}; nothing is known to be published",
            file=sys.stderr,
        )
        return 1


def _ids_or_keys(args: argparse.Namespace, manifest: Any) -> Any:
    """The PS ids of ``--id`` or ``--key``; ValueError (exit 2) for the wrong one for the table's keying."""
    import numpy as np

    from gateway.lookup_mapping import load_lookups
    from updater.producer import model_keys, table_mappings

    model_dir = args.manifest if args.manifest.is_dir() else args.manifest.parent  # lookups.json sits there
    mapping = table_mappings(manifest, load_lookups(model_dir)).get(args.table)
    if args.keys is None:
        if mapping is not None:
            example = "cat_01" if mapping.takes_strings else "42"
            raise ValueError(
                f"table {args.table!r} is keyed through lookup layer {mapping.layer!r} ({mapping.kind.value}): no "
                f"client reads a row published under a raw --id; publish the model's own value with --key (e.g. "
                f"--key {example}), mapped as the gateway maps it"
            )
        return np.asarray(args.ids, dtype=np.int64)
    if mapping is None:
        raise ValueError(
            f"table {args.table!r} has no lookup layer in front of it: its rows are keyed by --id"
        )
    raw: list[Any] = list(args.keys)
    if not mapping.takes_strings:
        try:
            raw = [int(k) for k in raw]
        except ValueError:
            raise ValueError(
                f"table {args.table!r} is keyed through integer layer {mapping.layer!r}: --key takes integers"
            ) from None
    return model_keys(args.table, mapping, raw)


async def _publish(args: argparse.Namespace, manifest: Any, ids: Any, values: Any, security: Any) -> int:
    from updater.producer import DeltaPublisher

    async with DeltaPublisher(
        args.bootstrap,
        topic=args.topic,
        producer_id=args.producer_id,
        encoding="json" if args.format == "json" else "binary",
        security=security,
    ) as pub:
        if args.format == "hps":
            result = await pub.publish_hps(manifest, args.table, ids, values)
        else:
            result = await pub.publish(manifest, args.table, ids, values, delete=args.delete)
    op = "deletes" if args.delete else "rows"
    print(
        f"published {result.rows} {op} of {manifest.model_name}.{args.table} in {result.messages} messages "
        f"to {result.topic} (rows per shard: {result.rows_per_shard})"
    )
    return 0
