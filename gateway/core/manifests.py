"""The manifests of one embedding model, one per model version, re-read when the exporter publishes a new one.

The exporter keeps one ``manifest.json`` per model directory: the manifest of the newest version, replaced (atomic
rename) when a newer version is published. A :class:`ManifestStore` remembers every valid manifest it has read, keyed
by ``Manifest.version``, so a request served at version ``N`` is parsed, routed and pooled with ``N``'s manifest
(features, tables and ``max_ids`` may change between versions) while the file already describes ``N + 1``.

A model with ``IntegerLookup`` / ``StringLookup`` layers also has ``lookups.json`` next to the manifest (the raw value ->
PS key mapping, :mod:`gateway.lookup_mapping`). Like ``manifest.json`` it describes the newest version only; the
exporter replaces it just before the manifest. The store reads it right after each manifest it reads and pairs the two
(:func:`gateway.lookup_mapping.attach_lookups`), so each version keeps the vocabulary read with its manifest. A read
during which ``manifest.json`` changed is discarded and retried on the next poll.

Entry and PS versions (docs/export.md "Entry and PS versions"): the manifest of an entry-only export (version ``M``,
``ps_version`` ``P``) says that requests served at entry ``M`` read PS version ``P``. :meth:`ManifestStore.
ps_version_of` answers that pairing; a manifest whose ``ps_layout_key`` differs from the known manifest of its PS
version is refused like an invalid one (logged, ``embedgate_manifest_reloads_total{outcome="error"}``), so the gateway
never pairs an entry with PS shards that disagree on tables, dims or partitioning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path

from gateway.lookup_mapping import (
    LookupMappingError,
    attach_lookups,
    detach_lookups,
    load_lookups,
    lookups_of,
)
from schemas.manifest import MANIFEST_FILE, Manifest, ManifestError

__all__ = ["ManifestStore", "manifest_file"]

log = logging.getLogger("embedgate.gateway")

_Stat = tuple[
    int, int, int
]  # (st_ino, st_size, st_mtime_ns): a replaced or rewritten file changes one of them


def manifest_file(path: str | Path) -> Path:
    """The ``manifest.json`` a config's ``manifest:`` value names (the file, or the model directory holding it)."""
    p = Path(path)
    return p / MANIFEST_FILE if p.is_dir() else p


def _stat(path: Path) -> _Stat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _file_version(path: Path) -> int | None:
    try:
        return Manifest.load(path).version
    except ManifestError:
        return None


def _log_tensorflow_version(model: str, manifest: Manifest, previous: Manifest | None) -> None:
    """Log the TensorFlow release ``manifest`` was exported with (``Manifest.tensorflow_version``), the one check of
    backend versions the gateway can make: TF Serving's API (GetModelStatus, GetModelMetadata) reports no TensorFlow
    version, so the backends' release cannot be compared. A warning when it differs from ``previous`` (the newest
    manifest known before): the new version may need another TF Serving release than the one running."""
    tf_version = manifest.tensorflow_version
    extra = {"model": model, "version": manifest.version, "tensorflow_version": tf_version}
    if previous is None:
        log.info(
            "model exported with this TensorFlow: serve it with the TF Serving release of that version (TF Serving "
            "does not report its version; the gateway cannot check its backends)",
            extra=extra,
        )
    elif tf_version != previous.tensorflow_version:
        log.warning(
            "new model version exported with another TensorFlow than the previous one: the TF Serving backends "
            "must run a release that loads it (TF Serving does not report its version)",
            extra={
                **extra,
                "previous_version": previous.version,
                "previous_tensorflow_version": previous.tensorflow_version,
            },
        )


def _no_reload_observer(model: str, outcome: str) -> None:
    return None


class ManifestStore:
    """Manifests of the embedding model ``model`` by version: the one read at startup plus every valid
    ``manifest.json`` read since by :meth:`poll` (which re-reads the file only when its inode, size or mtime changed).

    A file that cannot be read or parsed, or that does not fit the deployment (another model name, another shard
    count than the config's ``num_shards``), is logged and ignored: the manifests already known keep serving. Each
    read reports ``on_reload(model, "ok" | "error")`` (the ``embedgate_manifest_reloads_total`` metric). The same holds
    for the ``lookups.json`` read with it (bad JSON, a feature the manifest lacks). With a ``path``, the initial
    manifest's lookups are read now; a bad ``lookups.json`` then raises :class:`LookupMappingError`.

    Not thread-safe; used from one event loop (no awaits inside).
    """

    def __init__(
        self,
        model: str,
        initial: Manifest,
        path: Path | None = None,
        *,
        num_shards: int | None = None,
        on_reload: Callable[[str, str], None] = _no_reload_observer,
    ) -> None:
        self.model = model
        self.path = path
        self.num_shards = initial.num_shards if num_shards is None else num_shards
        self._on_reload = on_reload
        self._by_version: dict[int, Manifest] = {initial.version: initial}
        self._stat = _stat(path) if path is not None else None
        _log_tensorflow_version(model, initial, None)
        if path is not None:
            attach_lookups(initial, load_lookups(path.parent))
            if _file_version(path) not in (None, initial.version):
                # Published since ``initial`` was read: lookups.json may already describe the newer version (the
                # best mapping left for ``initial``); the next poll reads the newer manifest with its own.
                log.warning(
                    "manifest.json changed since it was read at startup; re-reading it at the next poll",
                    extra={"model": model, "version": initial.version},
                )
                self._stat = None

    @property
    def latest(self) -> Manifest:
        """The manifest of the highest version known."""
        return self._by_version[max(self._by_version)]

    @property
    def versions(self) -> list[int]:
        """Versions with a known manifest, ascending."""
        return sorted(self._by_version)

    def for_version(self, version: int | None) -> Manifest:
        """The manifest of ``version`` (None = the latest known).

        An unknown version first re-reads the file (if it changed: the exporter writes the manifest right after
        publishing the entry, possibly after the backends already serve it); still unknown, the newest known
        manifest of an older version is used, else the oldest known (a version published before the gateway
        started, whose manifest the file no longer holds).
        """
        if version is None:
            return self.latest
        hit = self._by_version.get(version)
        if hit is not None:
            return hit
        for m in self._by_version.values():
            if m.ps_version == version:
                return m  # a PS version read by a known entry version: same layout (checked when it was read)
        self.poll()
        hit = self._by_version.get(version)
        if hit is not None:
            return hit
        older = [v for v in self._by_version if v < version]
        return self._by_version[max(older) if older else min(self._by_version)]

    def ps_version_of(self, entry_version: int) -> int | None:
        """The PS version requests at ``entry_version`` read: its manifest's ``ps_version`` (or the version itself
        after a full export); an unknown version (re-read first) pairs with itself, as before entry-only exports
        existed. None when its manifest's PS layout differs from the known manifest of that PS version: not
        servable."""
        m = self._by_version.get(entry_version)
        if m is None:
            self.poll()
            m = self._by_version.get(entry_version)
        if m is None:
            return entry_version
        ps = m.ps_version_served
        base = self._by_version.get(ps)
        if base is not None and base.ps_layout_key != m.ps_layout_key:
            return None
        return ps

    def poll(self) -> bool:
        """Re-read the file if it changed since the last read; True when a new or changed manifest was added."""
        if self.path is None:
            return False
        st = _stat(self.path)
        if st == self._stat:
            return False
        self._stat = st  # also for a bad file: it is reported once, not on every poll
        try:
            manifest = Manifest.load(self.path)
            self._check(manifest)
            lookups = load_lookups(self.path.parent)
            attach_lookups(manifest, lookups)
        except (ManifestError, LookupMappingError) as exc:
            log.warning(
                "manifest reload failed; the known manifests keep serving",
                extra={"model": self.model, "error": str(exc), "known_versions": self.versions},
            )
            self._on_reload(self.model, "error")
            return False
        if _stat(self.path) != st:  # replaced while we read it: lookups.json may belong to another version
            detach_lookups(manifest)
            self._stat = None
            return False
        self._on_reload(self.model, "ok")
        known = self._by_version.get(manifest.version)
        if known == manifest and lookups_of(known) == lookups:
            detach_lookups(manifest)
            return False
        # a replaced object of the same version keeps its lookups: a request may still be parsing with it
        _log_tensorflow_version(self.model, manifest, self.latest)
        self._by_version[manifest.version] = manifest
        log.info("manifest loaded", extra={"model": self.model, "version": manifest.version})
        return True

    def _check(self, manifest: Manifest) -> None:
        if manifest.model_name != self.latest.model_name:
            raise ManifestError(
                f"{self.path}: model_name is {manifest.model_name!r}, expected {self.latest.model_name!r}"
            )
        if manifest.num_shards != self.num_shards:
            raise ManifestError(
                f"{self.path}: {manifest.num_shards} shards, the config lists {self.num_shards} "
                "(changing the shard count needs a config change and a restart)"
            )
        base = self._by_version.get(manifest.ps_version_served)
        if base is not None and base.ps_layout_key != manifest.ps_layout_key:
            raise ManifestError(
                f"{self.path}: version {manifest.version} reads PS version {manifest.ps_version_served}, whose tables, "
                "dims or partitioning differ (ps_layout_key "
                f"{manifest.ps_layout_key} != {base.ps_layout_key}); not served"
            )

    def retain(self, served: Collection[int]) -> None:
        """Forget manifests of versions no longer served (``served``: versions some backend still serves); the
        latest known manifest is always kept."""
        keep = set(served) | {max(self._by_version)}
        keep |= {self._by_version[v].ps_version_served for v in keep if v in self._by_version}
        for v in [v for v in self._by_version if v not in keep]:
            detach_lookups(self._by_version.pop(v))
