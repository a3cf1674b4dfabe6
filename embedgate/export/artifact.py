"""Operations on an exported model directory: take its tables out as HPS files, or bring HPS tables in.

* :func:`export_tables`: the rows each table was exported with (all shards of one version) -> ``<dest>/<table>/``
  HPS directories.
* :func:`import_tables`: a new version of the model in which the named tables hold the given rows (HPS directories
  or numpy arrays); the entry SavedModel is copied unchanged, every PS shard is rebuilt, the manifest is replaced.
  Written atomically like an export.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from embedgate.export.exporter import ENTRY_DIR, ExportResult, next_version, write_artifacts
from embedgate.export.ps import ArtifactError, Rows, check_saved_model_dir, read_ps_tables, write_ps_shard
from embedgate.export.tables import TableFileError, check_rows, load_table, write_table
from gateway.lookup_mapping import LOOKUPS_FILE
from schemas.manifest import Manifest, ps_dir_name
from schemas.partition import shard_for

__all__ = ["export_tables", "import_tables", "version_dirs"]


def version_dirs(model_dir: Path, manifest: Manifest, version: int | None = None) -> tuple[Path, list[Path]]:
    """(entry dir, [ps dirs]) of ``version`` (default: the manifest's), each checked to be a complete SavedModel."""
    v = str(version or manifest.version)
    entry = check_saved_model_dir(model_dir / ENTRY_DIR / v)
    return entry, [check_saved_model_dir(model_dir / ps_dir_name(i) / v) for i in range(manifest.num_shards)]


def export_tables(
    model_dir: str | Path, dest: str | Path, *, tables: list[str] | None = None, version: int | None = None
) -> dict[str, int]:
    """Write the exported rows of ``tables`` (default: all) as ``dest/<table>/{key,emb_vector}``; returns row counts."""
    md = Path(model_dir)
    manifest = Manifest.load(md)
    specs = manifest.tables
    if tables:
        unknown = sorted(set(tables) - {t.name for t in specs})
        if unknown:
            raise ArtifactError(f"{md}: no table {unknown[0]!r} (tables: {[t.name for t in specs]})")
        specs = [t for t in specs if t.name in tables]
    _, ps_dirs = version_dirs(md, manifest, version)
    rows = read_ps_tables(ps_dirs, specs)
    counts = {}
    for t in specs:
        keys, vecs = rows[t.name]
        write_table(Path(dest) / t.name, keys, vecs)
        counts[t.name] = len(keys)
    return counts


def import_tables(
    model_dir: str | Path,
    tables: Mapping[str, Rows | str | Path],
    *,
    version: int | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Publish a new version (default: next) whose named tables hold the given rows (replacing all their rows)."""
    md = Path(model_dir)
    manifest = Manifest.load(md)
    entry_dir, ps_dirs = version_dirs(md, manifest)
    new_rows: dict[str, Rows] = {}
    for name, given in tables.items():
        try:
            spec = manifest.table(name)
        except KeyError:
            raise ArtifactError(
                f"{md}: no table {name!r} (tables: {[t.name for t in manifest.tables]})"
            ) from None
        if isinstance(given, (str, Path)):
            keys, vecs = load_table(given)
            if vecs.shape[1] != spec.dim:
                raise TableFileError(
                    f"{Path(given)}: rows have dim {vecs.shape[1]}, table {name!r} has dim {spec.dim}"
                )
            new_rows[name] = (keys, vecs)
        else:
            new_rows[name] = check_rows(*given, dim=spec.dim, where=f"table {name!r}")
    keep = [t for t in manifest.tables if t.name not in new_rows]
    rows = {**read_ps_tables(ps_dirs, keep), **new_rows}
    ver = next_version(md) if version is None else version
    specs = [t.model_copy(update={"rows": len(rows[t.name][0])}) for t in manifest.tables]
    # The tables are written without a stream position: the kept ones hold only the old version's exported rows.
    written_ms = int(time.time() * 1000)  # the imported and kept rows count as written now (ttl_s)
    new_manifest = manifest.model_copy(
        update={"version": ver, "tables": specs, "stream_cut": {}, "exported_at_ms": written_ms}
    )
    n = manifest.num_shards

    def build(tmp: Path) -> None:
        shutil.copytree(entry_dir, tmp / ENTRY_DIR)
        shards = {name: shard_for(r[0], n) for name, r in rows.items()}
        for i in range(n):
            part = {name: (r[0][shards[name] == i], r[1][shards[name] == i]) for name, r in rows.items()}
            write_ps_shard(
                tmp / ps_dir_name(i),
                specs,
                part,
                layout=manifest.ps_layout,
                written_ms=written_ms,
            )

    # The raw-value mapping of lookup features is the entry's, which is copied unchanged: keep it.
    lookups = md / LOOKUPS_FILE
    extra = {LOOKUPS_FILE: lookups.read_text(encoding="utf-8")} if lookups.is_file() else {}
    write_artifacts(md, new_manifest, build, overwrite=overwrite, extra_files=extra)
    return ExportResult(model_dir=md, version=ver, manifest=Manifest.load(md))
