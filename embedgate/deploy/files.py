"""The files of a generated deployment: YAML rendering, validation of the embedgate configs by their own loaders, and
writing the tree.

Rendering is deterministic (insertion order, no anchors, no timestamps): the same models and flags give the same
bytes. The gateway and updater configs are checked by reading the written file back with the processes' own loaders
(:func:`schemas.gateway_settings.load_settings`, :meth:`schemas.updater_settings.UpdaterSettings.from_yaml`); like
the processes, they apply ``EMBEDGATE_`` variables of the environment they run in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from embedgate.deploy.plan import DeployError
from schemas.gateway_settings import load_settings
from schemas.updater_settings import UpdaterSettings

__all__ = ["check_config", "dump_yaml", "write_tree"]


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors/aliases for repeated values, lists indented under their key."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def dump_yaml(data: Any, header: str = "") -> str:
    """``data`` as block YAML in insertion order after ``header`` (comment lines, each without the ``#``)."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True
    )
    return comments + body


def check_config(path: Path, kind: str) -> None:
    """Validate the written ``gateway`` or ``updater`` config ``path`` as its process would read it (DeployError)."""
    try:
        if kind == "gateway":
            load_settings(path)
        else:
            UpdaterSettings.from_yaml(path)
    except (ValidationError, ValueError) as exc:
        raise DeployError(f"{path}: the generated {kind} config is invalid: {exc}") from None


def write_tree(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write ``files`` (path relative to ``out`` -> text) under ``out``, each atomically (temp file + rename).

    Files of ``out`` that ``files`` does not name are left alone. Returns the written paths in ``files`` order.
    """
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    return written
