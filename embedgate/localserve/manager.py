"""Versions per model: loads, atomic swaps, handles that pin a version, labels, and the state of every version.

The manager is the one owner of loaded :class:`~embedgate.localserve.servable.Servable` objects.

* :meth:`Manager.reconcile` (one caller at a time: startup, then the poller thread) scans each model's base path,
  asks the policy which versions it aspires to, **loads new versions first** (outside the lock; requests keep using
  the old ones) and publishes each one with a single dict assignment under the lock; only then does it retire
  versions that are no longer aspired - and only when an aspired version is available or none is aspired
  (TF Serving's availability-preserving policy).
* :meth:`Manager.handle` resolves a request's model spec and pins that version until the ``with`` block ends. A
  retired version is closed by whoever drops its last pin, so no request ever sees a closed session.
* A version that fails to load is reported as END with the error and not retried until its ``saved_model.pb``
  changes (TF Serving gives up after its load retries, too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Protocol

from embedgate.localserve.errors import InvalidArgumentError, NotFoundError
from embedgate.localserve.model_config import ModelEntry
from embedgate.localserve.policy import aspired_versions
from embedgate.localserve.source import scan_versions

__all__ = ["Handle", "Loadable", "Manager", "VersionState", "VersionStatus"]

_log = logging.getLogger(__name__)


class VersionState(IntEnum):
    """``ModelVersionStatus.State`` values of tensorflow_serving/apis/get_model_status.proto."""

    UNKNOWN = 0
    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclass(frozen=True)
class VersionStatus:
    version: int
    state: VersionState
    error: str = ""  # non-empty: the load failed with this message


class Loadable(Protocol):
    """What the manager needs of a loaded version (``Servable`` in production, a fake in unit tests)."""

    def close(self) -> None: ...


Loader = Callable[[str, int, Path], Loadable]


@dataclass
class _Slot:
    servable: Loadable
    pins: int = 0
    retired: bool = False


@dataclass
class _Model:
    entry: ModelEntry
    available: dict[int, _Slot] = field(default_factory=dict)
    status: dict[int, VersionStatus] = field(default_factory=dict)
    failed: dict[int, int] = field(default_factory=dict)  # version -> mtime_ns of the marker that failed
    removed: bool = False
    warned_empty: bool = False


@dataclass(frozen=True)
class Handle:
    """A pinned version: valid only inside the ``with Manager.handle(...)`` block."""

    name: str
    version: int
    servable: Loadable


class Manager:
    """Thread-safe registry of models and their loaded versions; see the module docstring."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._reconcile_lock = threading.Lock()
        self._models: dict[str, _Model] = {}

    # -- configuration ------------------------------------------------------------------------------------------
    def set_models(self, entries: list[ModelEntry]) -> None:
        """Replace the configured models (a new config fully replaces the old); applied by the next reconcile."""
        with self._lock:
            wanted = {e.name: e for e in entries}
            for name, model in self._models.items():
                if name in wanted:
                    model.entry = wanted[name]
                    model.removed = False
                else:
                    model.removed = True
            for name, entry in wanted.items():
                if name not in self._models:
                    self._models[name] = _Model(entry)

    def model_names(self) -> list[str]:
        with self._lock:
            return [n for n, m in self._models.items() if not m.removed]

    # -- reconcile ----------------------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Bring every model's loaded versions in line with disk and policy (load new, then retire old)."""
        with self._reconcile_lock:
            with self._lock:
                models = list(self._models.items())
            for name, model in models:
                self._reconcile_model(name, model)
            with self._lock:
                for name, model in list(self._models.items()):
                    if model.removed and not model.available:
                        del self._models[name]

    def _reconcile_model(self, name: str, model: _Model) -> None:
        entry = model.entry
        on_disk = {} if model.removed else scan_versions(entry.base_path)
        aspired = aspired_versions(on_disk, entry.policy)
        if not model.removed and not aspired and not model.warned_empty:
            _log.warning(
                "No versions of servable %s found under base path %s (version dirs need saved_model.pb)",
                name,
                entry.base_path,
            )
        model.warned_empty = not aspired
        for version in sorted(aspired - set(model.available)):
            path = on_disk[version]
            stamp = _marker_mtime(path)
            if model.failed.get(version) == stamp:
                continue
            self._load(name, model, version, path, stamp)
        with self._lock:
            retire = [v for v in model.available if v not in aspired]
            serving_aspired = any(v in model.available for v in aspired)
            if not retire or (aspired and not serving_aspired):
                return  # nothing to retire, or no aspired version loaded yet: keep serving the old ones
            to_close = [self._retire_locked(name, model, v) for v in retire]
        for version, servable in to_close:
            if servable is not None:
                self._close(name, model, version, servable)

    def _load(self, name: str, model: _Model, version: int, path: Path, stamp: int) -> None:
        with self._lock:
            model.status[version] = VersionStatus(version, VersionState.LOADING)
        _log.info("Loading servable version {name: %s version: %d} from %s", name, version, path)
        try:
            servable = self._loader(name, version, path)
        except Exception as exc:  # noqa: BLE001 - any load failure is reported through GetModelStatus
            message = (
                f"Failed to load servable version {{name: {name} version: {version}}} from {path}: {exc}"
            )
            _log.error("%s", message)
            with self._lock:
                model.failed[version] = stamp
                model.status[version] = VersionStatus(version, VersionState.END, message)
            return
        with self._lock:
            model.available[version] = _Slot(servable)
            model.failed.pop(version, None)
            model.status[version] = VersionStatus(version, VersionState.AVAILABLE)
        _log.info("Successfully loaded servable version {name: %s version: %d}", name, version)

    def _retire_locked(self, name: str, model: _Model, version: int) -> tuple[int, Loadable | None]:
        slot = model.available.pop(version)
        slot.retired = True
        model.status[version] = VersionStatus(version, VersionState.UNLOADING)
        _log.info(
            "Unloading servable version {name: %s version: %d} (%d request(s) still pin it)",
            name,
            version,
            slot.pins,
        )
        return version, (slot.servable if slot.pins == 0 else None)

    def _close(self, name: str, model: _Model, version: int, servable: Loadable) -> None:
        try:
            servable.close()
        finally:
            with self._lock:
                if (
                    model.status.get(version, VersionStatus(version, VersionState.END)).state
                    is VersionState.UNLOADING
                ):
                    model.status[version] = VersionStatus(version, VersionState.END)
            _log.info("Done unloading servable version {name: %s version: %d}", name, version)

    # -- requests -----------------------------------------------------------------------------------------------
    @contextmanager
    def handle(self, name: str, version: int | None = None, label: str | None = None) -> Iterator[Handle]:
        """Pin the requested version (latest available when neither ``version`` nor ``label``) for the block.

        NOT_FOUND ``Servable not found for request: Latest(<m>)`` / ``Specific(<m>, <n>)``; INVALID_ARGUMENT
        ``Unrecognized servable version label: <l>``.
        """
        with self._lock:
            model = self._models.get(name)
            if model is not None and model.removed:
                model = None
            if label:
                target = model.entry.labels.get(label) if model is not None else None
                if target is None:
                    raise InvalidArgumentError(f"Unrecognized servable version label: {label}")
                version = target
            if model is None or not model.available:
                raise NotFoundError(_not_found(name, version))
            if version is None:
                version = max(model.available)
            slot = model.available.get(version)
            if slot is None:
                raise NotFoundError(_not_found(name, version))
            slot.pins += 1
        try:
            yield Handle(name, version, slot.servable)
        finally:
            with self._lock:
                slot.pins -= 1
                last = slot.retired and slot.pins == 0
            if last:
                self._close(name, model, version, slot.servable)

    def status(self, name: str, version: int | None = None, label: str | None = None) -> list[VersionStatus]:
        """States of the model's versions (newest first), or of one version; NOT_FOUND as TF Serving words it."""
        with self._lock:
            model = self._models.get(name)
            if label:
                target = model.entry.labels.get(label) if model is not None else None
                if target is None:
                    raise InvalidArgumentError(f"Unrecognized servable version label: {label}")
                version = target
            if model is None or not model.status:
                raise NotFoundError(f"Could not find any versions of model {name}")
            if version is not None:
                found = model.status.get(version)
                if found is None:
                    raise NotFoundError(f"Could not find version {version} of model {name}")
                return [found]
            return [model.status[v] for v in sorted(model.status, reverse=True)]

    def close(self) -> None:
        """Retire every version (those still pinned close when released). Call after the server has stopped."""
        with self._reconcile_lock:
            closing: list[tuple[str, _Model, int, Loadable]] = []
            with self._lock:
                for name, model in self._models.items():
                    for version in list(model.available):
                        _, servable = self._retire_locked(name, model, version)
                        if servable is not None:
                            closing.append((name, model, version, servable))
            for name, model, version, servable in closing:
                self._close(name, model, version, servable)


def _not_found(name: str, version: int | None) -> str:
    if version is None:
        return f"Servable not found for request: Latest({name})"
    return f"Servable not found for request: Specific({name}, {version})"


def _marker_mtime(path: Path) -> int:
    for marker in ("saved_model.pb", "saved_model.pbtxt"):
        try:
            return (path / marker).stat().st_mtime_ns
        except OSError:
            continue
    return 0
