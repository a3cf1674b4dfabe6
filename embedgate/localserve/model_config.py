"""Which models to serve: TF Serving's ``model_config_list`` text format, or the single-model flags.

The text is parsed with ``google.protobuf.text_format`` into the official
``tensorflow_serving.config.model_server_config_pb2.ModelServerConfig`` and validated into :class:`ModelEntry`
values (pure data; reading the file is the only I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from embedgate.localserve.errors import ConfigError

__all__ = [
    "ModelEntry",
    "PolicyKind",
    "VersionPolicy",
    "entries_from_proto",
    "load_config_file",
    "parse_config_text",
    "single_model",
]


class PolicyKind(StrEnum):
    LATEST = "latest"
    ALL = "all"
    SPECIFIC = "specific"


@dataclass(frozen=True)
class VersionPolicy:
    """``model_version_policy``: latest ``num_versions`` (default 1), all, or the listed ``versions``."""

    kind: PolicyKind = PolicyKind.LATEST
    num_versions: int = 1
    versions: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ModelEntry:
    """One served model: its name, the base path holding numeric version dirs, the policy and the labels."""

    name: str
    base_path: Path
    policy: VersionPolicy = VersionPolicy()
    labels: dict[str, int] = field(default_factory=dict)


def single_model(name: str, base_path: str | Path) -> list[ModelEntry]:
    """The ``--model_name`` / ``--model_base_path`` form: one model, latest version."""
    if not name:
        raise ConfigError("--model_name must not be empty")
    if not str(base_path):
        raise ConfigError("--model_base_path must not be empty")
    return [ModelEntry(name=name, base_path=Path(base_path))]


def load_config_file(path: str | Path) -> list[ModelEntry]:
    """Read and validate a model config file (text ``ModelServerConfig``); errors name the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read model config: {exc.strerror or exc}") from exc
    return parse_config_text(text, source=str(p))


def parse_config_text(text: str, *, source: str = "<model config>") -> list[ModelEntry]:
    """Parse TF Serving's text format; ``source`` names the text in errors."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: not a valid ModelServerConfig text proto: {exc}") from exc
    try:
        return entries_from_proto(config)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def entries_from_proto(config: model_server_config_pb2.ModelServerConfig) -> list[ModelEntry]:
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigError("custom_model_config is not supported; use model_config_list")
    entries: list[ModelEntry] = []
    seen: set[str] = set()
    for i, mc in enumerate(config.model_config_list.config):
        where = f"model_config_list.config[{i}]"
        if not mc.name:
            raise ConfigError(f"{where}: name is empty")
        if mc.name in seen:
            raise ConfigError(f"{where}: model name {mc.name!r} is configured twice")
        seen.add(mc.name)
        if not mc.base_path:
            raise ConfigError(f"{where} ({mc.name}): base_path is empty")
        if mc.model_platform not in ("", "tensorflow"):
            raise ConfigError(
                f"{where} ({mc.name}): model_platform {mc.model_platform!r} is not supported "
                "(only 'tensorflow')"
            )
        entries.append(
            ModelEntry(
                name=mc.name,
                base_path=Path(mc.base_path),
                policy=_policy(mc, where),
                labels=dict(mc.version_labels),
            )
        )
    if not entries:
        raise ConfigError("model_config_list has no models")
    return entries


def _policy(mc: model_server_config_pb2.ModelConfig, where: str) -> VersionPolicy:
    vp = mc.model_version_policy
    kind = vp.WhichOneof("policy_choice")
    if kind is None or kind == "latest":
        n = vp.latest.num_versions if kind else 1
        if n < 0:
            raise ConfigError(f"{where} ({mc.name}): latest.num_versions must be >= 1, got {n}")
        return VersionPolicy(PolicyKind.LATEST, num_versions=n or 1)
    if kind == "all":
        return VersionPolicy(PolicyKind.ALL)
    versions = frozenset(int(v) for v in vp.specific.versions)
    if not versions:
        raise ConfigError(f"{where} ({mc.name}): specific policy lists no versions")
    return VersionPolicy(PolicyKind.SPECIFIC, versions=versions)
