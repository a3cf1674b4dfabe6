"""``embedgate deploy compose | helm``: a complete deployment of exported models from their manifests.

Light at import (argparse only); the command imports the generators. Exit 2 with one line naming the problem for bad
flags or models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]

_COMPOSE_DEFAULT_FILTERS = ("entry=entry; True", "ps=ps_{i}; True")
_HELM_DEFAULT_FILTERS = ("ps=ps_{i}; True",)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "deploy", help="a docker compose project or Helm values for exported models, from their manifests"
    )
    sub = p.add_subparsers(dest="deploy_target", required=True, metavar="TARGET")
    c = sub.add_parser(
        "compose", help="compose.yaml + TF Serving, gateway and updater configs (docs/deployment.md)"
    )
    _common(c, default_filters=_COMPOSE_DEFAULT_FILTERS)
    c.add_argument("--image", default="embedgate:0.1.0", help="gateway/updater image (docker/Dockerfile)")
    c.add_argument(
        "--publish",
        default="127.0.0.1",
        metavar="ADDR",
        help="host address the gateway's ports 8500/8501 are published on (default 127.0.0.1; any other needs "
        "--tokens-file)",
    )
    c.add_argument(
        "--tokens-file",
        type=Path,
        default=None,
        help="bearer tokens file (docs/security.md), given to the gateway as a compose secret",
    )
    c.set_defaults(func=_compose)

    h = sub.add_parser("helm", help="<model>.values.yaml for deploy/helm/embedgate, one release per model")
    _common(h, default_filters=_HELM_DEFAULT_FILTERS)
    h.add_argument("--image", default="embedgate:0.1.0", metavar="REPO:TAG", help="gateway/updater image")
    vol = h.add_mutually_exclusive_group()
    vol.add_argument(
        "--pvc",
        default="embedgate-models",
        help="PersistentVolumeClaim holding <model>/ (default embedgate-models)",
    )
    vol.add_argument("--host-path", default=None, help="node directory holding <model>/ instead of a PVC")
    h.add_argument("--ps-replicas", type=int, default=2, help="pods per PS host (default 2)")
    h.add_argument(
        "--gateway-replicas", type=int, default=2, help="gateway pods (the HPA's minimum; default 2)"
    )
    h.add_argument("--gateway-max-replicas", type=int, default=10, help="the HPA's maximum (default 10)")
    h.add_argument(
        "--tokens-secret",
        default=None,
        metavar="SECRET",
        help="Kubernetes Secret whose key `tokens` is the bearer tokens file (default: none, ClusterIP behind the "
        "network policy)",
    )
    h.add_argument(
        "--kafka-bootstrap",
        default="kafka:9092",
        help="Kafka bootstrap servers in the cluster (default kafka:9092)",
    )
    h.set_defaults(func=_helm)


def _common(p: argparse.ArgumentParser, *, default_filters: tuple[str, ...]) -> None:
    p.add_argument(
        "--model-dir",
        action="append",
        required=True,
        type=Path,
        dest="model_dirs",
        metavar="DIR",
        help="an exported model, <out>/<model> holding manifest.json (repeatable)",
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        help="directory to write (created; the files of an earlier run are replaced or removed)",
    )
    p.add_argument(
        "--filter",
        action="append",
        default=None,
        dest="filters",
        metavar="HOST='PATTERN; EXPR'",
        help="a TF Serving host and a layout filter (the language of `embedgate placement`), e.g. "
        "ps-even='ps_{i}; i %% 2 == 0'; repeatable, a host named twice takes both; applies to every model "
        f"(default: {' '.join(repr(f) for f in default_filters)})",
    )
    p.set_defaults(default_filters=default_filters)
    p.add_argument(
        "--tf-serving-tag",
        default=None,
        help="tensorflow/serving image tag (default: the TensorFlow release the manifests record)",
    )
    p.add_argument(
        "--kafka-partitions",
        type=int,
        default=None,
        help="partitions of the delta topics (default max(4, shards)); at least the shard count",
    )
    p.add_argument(
        "--updater-replicas", type=int, default=1, help="updater consumers in one group (<= partitions)"
    )
    p.add_argument("--gateway-workers", type=int, default=1, help="gateway processes per container/pod")
    p.add_argument("--request-timeout-s", type=float, default=10.0, help="the gateway's request deadline")
    p.add_argument("--max-in-flight", type=int, default=256, help="requests the gateway processes at once")
    p.add_argument(
        "--cache-max-bytes",
        type=int,
        default=0,
        help="the gateway's hot-row cache per model (default 0: off)",
    )


def _fail(exc: Exception) -> int:
    print(f"embedgate: error: {exc}", file=sys.stderr)
    return 2


def _compose(args: argparse.Namespace) -> int:
    from embedgate.deploy.compose import ComposeOptions, compose_files
    from embedgate.deploy.files import check_config, write_tree
    from embedgate.deploy.plan import load_models, parse_hosts, tf_serving_tag

    try:
        models = load_models(args.model_dirs)
        hosts = parse_hosts(args.filters or args.default_filters, models)
        opts = ComposeOptions(
            tf_serving_tag=tf_serving_tag(models, args.tf_serving_tag),
            image=args.image,
            publish=args.publish,
            tokens_file=args.tokens_file,
            kafka_partitions=args.kafka_partitions,
            updater_replicas=args.updater_replicas,
            gateway_workers=args.gateway_workers,
            request_timeout_s=args.request_timeout_s,
            max_in_flight=args.max_in_flight,
            cache_max_bytes=args.cache_max_bytes,
        )
        files = compose_files(models, hosts, opts, args.out)
        written = write_tree(args.out, files)
        check_config(args.out / "config" / "gateway.yaml", "gateway")
        check_config(args.out / "config" / "updater.yaml", "updater")
    except ValueError as exc:
        return _fail(exc)
    _report(written, models, opts.tf_serving_tag)
    return 0


def _helm(args: argparse.Namespace) -> int:
    from embedgate.deploy.files import write_tree
    from embedgate.deploy.helm import HelmOptions, helm_files
    from embedgate.deploy.plan import load_models, parse_hosts, tf_serving_tag

    repo, sep, tag = args.image.rpartition(":")
    if not sep or not repo or "/" in tag:
        return _fail(ValueError(f"--image {args.image!r}: expected REPOSITORY:TAG"))
    try:
        models = load_models(args.model_dirs)
        hosts = parse_hosts(args.filters or args.default_filters, models, entry_hosts=False)
        opts = HelmOptions(
            tf_serving_tag=tf_serving_tag(models, args.tf_serving_tag),
            image_repository=repo,
            image_tag=tag,
            persistent_volume_claim=args.pvc,
            host_path=args.host_path,
            ps_replicas=args.ps_replicas,
            gateway_replicas=args.gateway_replicas,
            gateway_max_replicas=args.gateway_max_replicas,
            gateway_workers=args.gateway_workers,
            request_timeout_s=args.request_timeout_s,
            max_in_flight=args.max_in_flight,
            tokens_secret=args.tokens_secret,
            cache_max_bytes=args.cache_max_bytes,
            updater_replicas=args.updater_replicas,
            kafka_bootstrap=args.kafka_bootstrap,
            kafka_partitions=args.kafka_partitions,
        )
        written = write_tree(args.out, helm_files(models, hosts, opts))
    except ValueError as exc:
        return _fail(exc)
    _report(written, models, opts.tf_serving_tag)
    return 0


def _report(written: list[Path], models: list[Any], tag: str) -> None:
    for path in written:
        print(path)
    recorded = ", ".join(f"{m.name}: {m.manifest.tensorflow_version or 'not recorded'}" for m in models)
    print(f"TF Serving image tensorflow/serving:{tag} (TensorFlow of the exports: {recorded})")
