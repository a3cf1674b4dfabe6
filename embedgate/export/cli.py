"""``embedgate export | demo-model | tables | placement``. Light at import: TensorFlow is imported in the commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from schemas.manifest import PsLayout

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export", help="export a Keras model as entry + sharded PS SavedModels + manifest"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="trained Keras model (.keras file)")
    src.add_argument(
        "--dense-model",
        type=Path,
        help="decomposed export: dense sub-model (.keras) taking one pooled embedding per sparse feature (named "
        "after it) plus the dense features; needs --tables",
    )
    p.add_argument(
        "--tables",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --dense-model: DIR/<table>/ (HPS key + emb_vector), DIR/<table>.npy or DIR/<table>.npz per table",
    )
    p.add_argument(
        "--declaration", required=True, type=Path, help="YAML declaration of sparse and dense inputs"
    )
    p.add_argument("--out", required=True, type=Path, help="output root; writes <out>/<model_name>/")
    p.add_argument("--shards", type=int, default=2, help="number of PS shards (default 2)")
    p.add_argument("--version", type=int, default=None, help="version number (default: next)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing version")
    p.add_argument(
        "--ps-layout",
        choices=["slab", "hash"],
        default="slab",
        help="how PS shards hold rows: slab (default; dense rows + id -> slot index) or hash (the layout of earlier "
        "releases, one hash-table entry per row; deprecated, kept for one release)",
    )
    p.add_argument(
        "--no-self-check",
        dest="self_check",
        action="store_false",
        help="skip running the staged entry + PS against the model on sample inputs before publishing",
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="serve table NAME from an HPS directory (or .npy/.npz file) instead of the Embedding weights "
        "(repeatable)",
    )
    p.add_argument(
        "--entry-input",
        choices=["unique_rows", "pooled"],
        default="unique_rows",
        help="how the entry takes sparse features: unique_rows (default: each distinct row once per table plus "
        "int32 indices, pooled inside the entry) or pooled (one pooled row per feature, pooled by the gateway; the "
        "format of exports made before the choice existed); docs/export.md#entry-signature",
    )
    p.add_argument(
        "--entry-row-dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="unique_rows only: dtype of the rows on the wire (the entry casts them to float32 before pooling; "
        "the self-check prints the largest prediction error against the model)",
    )
    p.add_argument(
        "--entry-only",
        action="store_true",
        help="write only a new entry version with the model's dense weights, running with the current PS version "
        "(its tables keep streaming); refused when tables, dims, partitioning or lookup vocabularies differ "
        "(docs/export.md#entry-and-ps-versions)",
    )
    p.add_argument(
        "--keep-entry-versions",
        type=int,
        default=3,
        help="with --entry-only: entry versions kept on disk (older ones are removed; default 3)",
    )
    _add_stream_cut_arguments(p)
    p.set_defaults(func=_export)

    p = subparsers.add_parser("demo-model", help="train and export the demo CTR model")
    p.add_argument(
        "--out", required=True, type=Path, help="output root; writes <out>/<name>/ and <out>/<name>.keras"
    )
    p.add_argument("--name", default="demo")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--vocab", type=int, default=100_000, help="ids in the user and item tables")
    p.add_argument("--steps", type=int, default=300, help="training steps (batch 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="small and fast (tests)")
    p.set_defaults(func=_demo)

    p = subparsers.add_parser("tables", help="embedding tables as HPS files (key + emb_vector)")
    tsub = p.add_subparsers(dest="tables_command", required=True, metavar="ACTION")
    e = tsub.add_parser("export", help="write the exported rows of a model's tables as HPS directories")
    e.add_argument("--model-dir", required=True, type=Path, help="<out>/<model> (holds manifest.json)")
    e.add_argument("--dest", required=True, type=Path, help="writes <dest>/<table>/{key,emb_vector}")
    e.add_argument("--table", action="append", default=None, help="only this table (repeatable)")
    e.add_argument("--version", type=int, default=None, help="default: the manifest's version")
    e.set_defaults(func=_tables_export)
    i = tsub.add_parser("import", help="publish a new version whose tables hold rows from HPS directories")
    i.add_argument("--model-dir", required=True, type=Path)
    i.add_argument(
        "--table",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="an HPS directory, .npy ([n, dim], ids 0..n-1) or .npz (keys, vectors); repeatable",
    )
    i.add_argument("--version", type=int, default=None, help="default: next")
    i.add_argument("--overwrite", action="store_true")
    i.set_defaults(func=_tables_import)
    mo = tsub.add_parser(
        "import-monolith",
        help="convert a Monolith hash-table checkpoint (TFRecord of EntryDump) into an HPS table directory",
    )
    mo.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="a <prefix>-NNNNN-of-NNNNN file, the <prefix> of all shards, or a directory holding them",
    )
    mo.add_argument("--dest", required=True, type=Path, help="HPS directory to write (key + emb_vector)")
    mo.add_argument(
        "--dim", type=int, default=None, help="expected values per entry (default: the first entry's)"
    )
    mo.set_defaults(func=_tables_import_monolith)

    p = subparsers.add_parser("placement", help="TF Serving model config for one host from layout filters")
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument(
        "--filter",
        action="append",
        required=True,
        dest="filters",
        metavar="'PATTERN; EXPR'",
        help="e.g. 'entry; True' or 'ps_{i}; i %% 2 == 1' (repeatable; any match selects)",
    )
    p.add_argument("--name-prefix", default=None, help="served-name prefix (default: the model name)")
    p.add_argument("--base-path-root", default=None, help="directory holding the model dir on the host")
    p.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    p.set_defaults(func=_placement)

    h = subparsers.add_parser(
        "helm-values", help="the Helm chart's model and psHosts values from layout filters, one host each"
    )
    h.add_argument("--model-dir", required=True, type=Path)
    h.add_argument(
        "--host",
        action="append",
        required=True,
        dest="hosts",
        metavar="NAME='ps_{i}; EXPR'",
        help="a PS host and its filter (repeatable; a name given twice takes both filters)",
    )
    h.set_defaults(func=_helm_values)


def _add_stream_cut_arguments(p: Any) -> None:
    from updater.kafka_security import add_security_arguments

    cut = p.add_argument_group("stream cut (docs/export.md#stream-cut)")
    cut.add_argument(
        "--stream-cut",
        default="none",
        metavar="auto|none|TOPIC:PARTITION=OFFSET,...",
        help="the Kafka position the exported tables contain; every PS table starts there and manifest.json records "
        "it. auto: the end offsets of the model's delta topic now (run it after the trainer's publishes were "
        "acknowledged and its tables hold those rows, before it publishes more); none (default): no cut",
    )
    cut.add_argument(
        "--bootstrap",
        "--bootstrap-servers",
        default="127.0.0.1:9092",
        help="Kafka bootstrap servers for --stream-cut auto",
    )
    cut.add_argument(
        "--stream-topic",
        action="append",
        default=None,
        metavar="TOPIC",
        help="topic the auto cut covers (repeatable; default the model's own: embedgate.deltas.<model>)",
    )
    cut.add_argument(
        "--kafka-timeout", type=float, default=60.0, help="seconds before giving up on Kafka (exit 1)"
    )
    add_security_arguments(p)


class _KafkaUnavailable(Exception):
    """--stream-cut auto could not read the end offsets; the message is the one line to print."""


def _stream_cut(args: argparse.Namespace) -> dict[str, int] | None:
    """The cut --stream-cut asks for (None: none). ValueError for bad flags, _KafkaUnavailable for Kafka."""
    from embedgate.export.streamcut import format_stream_cut, kafka_stream_cut, parse_stream_cut

    text = args.stream_cut.strip()
    if text == "none":
        return None
    if text != "auto":
        return parse_stream_cut(text)
    from embedgate.export.declaration import load_declaration
    from schemas.deltas import delta_topic
    from updater.kafka_security import client_kwargs, connect_failures, security_from_args

    topics = args.stream_topic or [delta_topic(load_declaration(args.declaration).model_name)]
    security = security_from_args(args)
    client_kwargs(security)  # reads the CA / certificate / password files: a bad one fails here, exit 2
    import logging

    from aiokafka.errors import KafkaError

    logging.getLogger("aiokafka").propagate = False  # connect_failures keeps the cause for the one line below
    causes: list[str] = []
    try:
        with connect_failures() as causes:
            cut, missing = kafka_stream_cut(
                args.bootstrap, topics, security=security, timeout_s=args.kafka_timeout
            )
    except (KafkaError, OSError, TimeoutError) as exc:
        what = f"timed out after {args.kafka_timeout:g} s" if isinstance(exc, TimeoutError) else repr(exc)
        if causes:
            what += f" (last failure: {causes[-1]})"
        raise _KafkaUnavailable(
            f"--stream-cut auto: Kafka at {args.bootstrap}: {what}; nothing exported"
        ) from None
    for t in missing:
        print(
            f"stream cut: topic {t} does not exist yet (nothing published): no position for it",
            file=sys.stderr,
        )
    print(f"stream cut: {format_stream_cut(cut) or '(empty)'}")
    return cut


def _pairs(items: list[str]) -> dict[str, Path]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"embedgate: --table expects NAME=DIR, got {item!r}")
        out[name] = Path(path)
    return out


def _fail(exc: Exception) -> int:
    print(f"embedgate: error: {exc}", file=sys.stderr)
    return 2


def _quiet_tf() -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _export_entry_only(args: argparse.Namespace) -> int:
    from embedgate.export.entry_refresh import export_entry

    if args.model is None or args.table or args.version is not None or args.stream_cut.strip() != "none":
        return _fail(
            ValueError(
                "--entry-only takes --model, --declaration and --out (no --dense-model, --table, --version "
                "or --stream-cut: the PS version and its cut stay as they are)"
            )
        )
    try:
        r = export_entry(
            args.model,
            args.declaration,
            args.out,
            self_check=args.self_check,
            keep_entry_versions=args.keep_entry_versions,
        )
    except ValueError as exc:
        return _fail(exc)
    print(
        f"exported {r.model_dir} entry version {r.version}, running with PS version {r.manifest.ps_version}"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    _quiet_tf()
    from embedgate.export.exporter import export_model

    if args.entry_only:
        return _export_entry_only(args)

    try:
        cut = _stream_cut(args)  # first: a bad flag or an unreachable Kafka fails before the slow export
    except ValueError as exc:
        return _fail(exc)
    except _KafkaUnavailable as exc:
        print(f"embedgate: error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.dense_model is not None:
            from embedgate.export.decomposed import export_decomposed

            if args.tables is None or args.table:
                raise ValueError("--dense-model needs --tables DIR (and takes no --table NAME=DIR)")
            r = export_decomposed(
                args.dense_model,
                args.tables,
                args.declaration,
                args.out,
                num_shards=args.shards,
                version=args.version,
                overwrite=args.overwrite,
                self_check=args.self_check,
                stream_cut=cut,
                ps_layout=PsLayout(args.ps_layout),
                entry_input=args.entry_input,
                entry_row_dtype=args.entry_row_dtype,
            )
        else:
            if args.tables is not None:
                raise ValueError("--tables DIR goes with --dense-model; with --model use --table NAME=DIR")
            r = export_model(
                args.model,
                args.declaration,
                args.out,
                num_shards=args.shards,
                version=args.version,
                overwrite=args.overwrite,
                tables=_pairs(args.table),
                self_check=args.self_check,
                stream_cut=cut,
                ps_layout=PsLayout(args.ps_layout),
                entry_input=args.entry_input,
                entry_row_dtype=args.entry_row_dtype,
            )
    except ValueError as exc:
        return _fail(exc)
    print(
        f"exported {r.model_dir} version {r.version}: entry + {r.manifest.num_shards} PS shards, "
        f"tables {', '.join(f'{t.name}({t.rows}x{t.dim})' for t in r.manifest.tables)}; "
        f"entry input {r.manifest.entry.input_mode.value}"
        + (
            f" ({r.manifest.entry.row_dtype.value} rows)"
            if r.manifest.entry.input_mode == "unique_rows"
            else ""
        )
    )
    if r.self_check is not None:
        rep = r.self_check
        outs = ", ".join(f"{k} {v:.3g}" for k, v in rep.output_error.items())
        rows = ", ".join(f"{k} {v:.3g}" for k, v in rep.row_error.items())
        print(
            f"self-check: largest prediction error against the model: outputs {outs}; rows {rows} "
            f"(tolerance rtol {rep.tolerance[0]:g}, atol {rep.tolerance[1]:g} x max(1, |output|))"
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    _quiet_tf()
    from embedgate.export.demo import build_demo

    a = build_demo(
        args.out,
        model_name=args.name,
        num_shards=args.shards,
        vocab=args.vocab,
        train_steps=args.steps,
        seed=args.seed,
        small=args.small,
    )
    print(
        f"demo model at {a.model_dir} (version {a.manifest.version}); held-out AUC {a.auc:.3f}; "
        f"built in {a.seconds:.1f} s; Keras model {a.keras_path}; request body {a.model_dir / 'example_request.json'}"
    )
    return 0


def _tables_export(args: argparse.Namespace) -> int:
    _quiet_tf()
    from embedgate.export.artifact import export_tables

    try:
        counts = export_tables(args.model_dir, args.dest, tables=args.table, version=args.version)
    except ValueError as exc:
        return _fail(exc)
    for name, n in counts.items():
        print(f"{args.dest / name}: {n} rows")
    return 0


def _tables_import(args: argparse.Namespace) -> int:
    _quiet_tf()
    from embedgate.export.artifact import import_tables

    try:
        r = import_tables(args.model_dir, _pairs(args.table), version=args.version, overwrite=args.overwrite)
    except ValueError as exc:
        return _fail(exc)
    print(f"published {r.model_dir} version {r.version}")
    return 0


def _helm_values(args: argparse.Namespace) -> int:
    from embedgate.export.placement import helm_values

    pairs = []
    for item in args.hosts:
        name, sep, text = item.partition("=")
        if not sep:
            return _fail(ValueError(f"--host {item!r}: expected NAME='ps_{{i}}; EXPR'"))
        pairs.append((name.strip(), text))
    try:
        sys.stdout.write(helm_values(args.model_dir, pairs))
    except ValueError as exc:
        return _fail(exc)
    return 0


def _tables_import_monolith(args: argparse.Namespace) -> int:
    from embedgate.export.monolith import read_monolith_table
    from embedgate.export.tables import write_table

    try:
        t = read_monolith_table(args.checkpoint, dim=args.dim)
        write_table(args.dest, t.keys, t.vectors)
    except ValueError as exc:
        return _fail(exc)
    print(
        f"{args.dest}: {len(t.keys)} rows of dim {t.vectors.shape[1]} from {len(t.files)} checkpoint file(s)"
    )
    return 0


def _placement(args: argparse.Namespace) -> int:
    from embedgate.export.placement import model_config, select

    try:
        text = model_config(
            select(
                args.model_dir, args.filters, name_prefix=args.name_prefix, base_path_root=args.base_path_root
            )
        )
    except ValueError as exc:
        return _fail(exc)
    if args.out is None:
        sys.stdout.write(text)
    else:
        tmp = args.out.with_name(f".{args.out.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(args.out)
    return 0
