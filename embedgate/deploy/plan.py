"""What a generated deployment is made of, read from the exported models: their manifests, the hosts the layout
filters place their servables on, and the TF Serving release their TensorFlow calls for.

Hosts come from ``--filter 'HOST=PATTERN; EXPR'`` (the filter language of ``embedgate placement``,
:mod:`embedgate.export.placement`; a host named several times takes every filter given for it). A filter applies to
every model: host ``ps-even`` with ``ps_{i}; i % 2 == 0`` serves the even shards of each model. Pure apart from
reading the manifests; errors are :class:`DeployError` naming the flag, model or host.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embedgate.export.placement import (
    Filter,
    PlacementError,
    Servable,
    check_host_name,
    matching,
    parse_filter,
)
from schemas.manifest import Manifest, ManifestError

__all__ = [
    "DEFAULT_TF_SERVING_TAG",
    "MODELS_ROOT",
    "TF_SERVING_IMAGE",
    "DeployError",
    "Host",
    "Model",
    "load_models",
    "parse_hosts",
    "tf_serving_tag",
]

TF_SERVING_IMAGE = "tensorflow/serving"
# The TensorFlow the exporter pins (pyproject.toml, extra "tf"): the release for manifests that record none.
DEFAULT_TF_SERVING_TAG = "2.21.0"
MODELS_ROOT = "/models"  # where every container mounts the exported models: /models/<model dir name>
_RELEASE = re.compile(r"^\d+\.\d+\.\d+$")


class DeployError(ValueError):
    """Flags or models that cannot make a consistent deployment; the message names the flag, model or host."""


@dataclass(frozen=True)
class Model:
    """One exported model: its directory (``<out>/<name>``), manifest and mount point in the containers."""

    model_dir: Path
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.manifest.model_name

    @property
    def mount(self) -> str:
        """The model directory inside every container (the gateway's and updater's ``manifest:``)."""
        return f"{MODELS_ROOT}/{self.model_dir.name}"


@dataclass(frozen=True)
class Host:
    """A TF Serving host and what it serves: ``servables[model name]`` (entry first, then shards in order)."""

    name: str
    filters: tuple[Filter, ...]
    servables: dict[str, list[Servable]]

    def served_names(self) -> list[str]:
        """Every served model name of the host, model by model (the order of ``--model-dir``)."""
        return [s.name for ss in self.servables.values() for s in ss]

    def shards_of(self, model: str) -> list[int]:
        return [
            int(s.sub_graph[len("ps_") :]) for s in self.servables.get(model, []) if s.sub_graph != "entry"
        ]

    def has_entry(self, model: str) -> bool:
        return any(s.sub_graph == "entry" for s in self.servables.get(model, []))


def load_models(model_dirs: Sequence[Path]) -> list[Model]:
    """Each ``--model-dir``'s manifest; refuses none, an unreadable manifest and two models of one name or dir name."""
    if not model_dirs:
        raise DeployError("no --model-dir given: name at least one exported model directory (<out>/<model>)")
    models: list[Model] = []
    for d in model_dirs:
        md = Path(d).resolve()
        try:
            manifest = Manifest.load(md)
        except ManifestError as exc:
            raise DeployError(f"--model-dir {d}: {exc}") from None
        model = Model(md, manifest)
        for other in models:
            if other.name == model.name or other.model_dir.name == md.name:
                raise DeployError(
                    f"--model-dir {d}: model {model.name!r} in {md.name}/ clashes with {other.model_dir}: "
                    "every model needs its own name and directory name"
                )
        models.append(model)
    return models


def parse_hosts(texts: Sequence[str], models: Sequence[Model], *, entry_hosts: bool = True) -> list[Host]:
    """Hosts from ``HOST=PATTERN; EXPR`` texts, in order of first mention, with the servables each selects.

    ``entry_hosts`` False (Helm: the chart runs the entry itself): refuse a filter that selects an entry. Refuses a
    host that serves nothing, a shard on no host, and (with ``entry_hosts``) an entry on no host or on several.
    """
    filters: dict[str, list[Filter]] = {}
    for text in texts:
        name, sep, rest = text.partition("=")
        if not sep or ";" in name or not rest.strip():
            raise DeployError(
                f"--filter {text!r}: expected HOST='PATTERN; EXPR', e.g. ps-even='ps_{{i}}; i % 2 == 0'"
            )
        try:
            check_host_name(name.strip())
            filters.setdefault(name.strip(), []).append(parse_filter(rest))
        except PlacementError as exc:
            raise DeployError(f"--filter {text!r}: {exc}") from None
    hosts = []
    for name, fs in filters.items():
        try:
            placed = {m.name: matching(m.model_dir, fs, base_path_root=MODELS_ROOT) for m in models}
        except PlacementError as exc:
            raise DeployError(f"host {name!r}: {exc}") from None
        placed = {model: ss for model, ss in placed.items() if ss}
        if not placed:
            raise DeployError(
                f"host {name!r}: its filters {[f.text for f in fs]} select nothing of any model"
            )
        host = Host(name, tuple(fs), placed)
        if not entry_hosts and any(host.has_entry(m.name) for m in models):
            raise DeployError(
                f"host {name!r}: its filters select an entry; the Helm chart runs the entry as its own Deployment, "
                "filters place PS shards only"
            )
        hosts.append(host)
    _check_coverage(hosts, models, entry_hosts=entry_hosts)
    return hosts


def _check_coverage(hosts: Sequence[Host], models: Sequence[Model], *, entry_hosts: bool) -> None:
    for m in models:
        missing = sorted(set(range(m.manifest.num_shards)) - {i for h in hosts for i in h.shards_of(m.name)})
        if missing:
            raise DeployError(
                f"model {m.name!r}: shards {missing} are on no host; every shard needs at least one "
                "(add a --filter, e.g. ps='ps_{i}; True')"
            )
        if not entry_hosts:
            continue
        entries = [h.name for h in hosts if h.has_entry(m.name)]
        if not entries:
            raise DeployError(
                f"model {m.name!r}: its entry is on no host (add e.g. --filter entry='entry; True')"
            )
        if len(entries) > 1:
            raise DeployError(
                f"model {m.name!r}: its entry is on hosts {entries}; the gateway calls one entry address, "
                "place it on one host"
            )


def tf_serving_tag(models: Sequence[Model], override: str | None) -> str:
    """The TF Serving image tag: ``override``, else the TensorFlow release the manifests record (they must agree:
    one TF Serving release serves them all), else :data:`DEFAULT_TF_SERVING_TAG` for manifests that record none."""
    if override is not None:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", override):
            raise DeployError(f"--tf-serving-tag {override!r} is not a Docker image tag")
        return override
    recorded = {m.manifest.tensorflow_version for m in models} - {None}
    if len(recorded) > 1:
        by_model = {m.name: m.manifest.tensorflow_version for m in models}
        raise DeployError(
            f"the models were exported with different TensorFlow releases {by_model}: re-export them with one, "
            "or pass --tf-serving-tag with a release that loads them all"
        )
    if not recorded:
        return DEFAULT_TF_SERVING_TAG
    (version,) = recorded
    if version is None or not _RELEASE.match(version):
        raise DeployError(
            f"TensorFlow {version!r} (from the manifests) has no matching tensorflow/serving release tag: "
            "pass --tf-serving-tag"
        )
    return version
