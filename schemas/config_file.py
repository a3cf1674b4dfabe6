"""Reading a component's YAML config file: the part the gateway and updater settings share.

``read_config(path, what)`` returns the file's mapping with every relative ``models[].manifest`` made absolute
against the file's directory (so a config can sit next to its models). ``EnvOverFile`` is the pydantic-settings base
whose environment variables (``EMBEDGATE_`` prefix set by each subclass) win over the values read from the file.
Errors are ``ValueError`` naming the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

__all__ = ["EnvOverFile", "read_config"]


class EnvOverFile(BaseSettings):
    """Settings whose sources are: environment first, then the keyword values (the file), then defaults."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings


def read_config(path: str | Path, what: str) -> dict[str, Any]:
    """The YAML mapping in ``path`` (``what`` names the component in errors, e.g. "gateway config")."""
    p = Path(path)
    try:
        loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{p}: cannot read {what}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: invalid YAML: {exc}") from exc
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{p}: the {what} must be a mapping (YAML keys), got {type(loaded).__name__}")  # noqa: TRY004 (a bad file, not a bad argument)
    for model in loaded.get("models") or []:
        manifest = model.get("manifest") if isinstance(model, dict) else None
        if isinstance(manifest, str) and not Path(manifest).is_absolute():
            model["manifest"] = str((p.parent / manifest).resolve())
    return loaded
