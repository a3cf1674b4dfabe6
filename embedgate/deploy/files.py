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

__all__ = ["RECORD", "check_config", "dump_yaml", "write_tree"]


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


RECORD = ".embedgate-deploy"  # in --out: the files the last run wrote, one relative path a line


def write_tree(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write ``files`` (path relative to ``out`` -> text) under ``out``, each atomically (temp file + rename).

    Files an earlier run wrote (listed in ``out/.embedgate-deploy``) that ``files`` no longer names are removed, e.g.
    the config of a host that is gone; any other file of ``out`` is left alone. Returns the written paths in
    ``files`` order.
    """
    record = out / RECORD
    try:
        before = set(record.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        before = set()
    written = [_write(out / rel, text) for rel, text in files.items()]
    for rel in sorted(before - set(files)):
        if rel and not Path(rel).is_absolute() and ".." not in Path(rel).parts:
            (out / rel).unlink(missing_ok=True)
    _write(record, "".join(f"{rel}\n" for rel in files))
    return written


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
