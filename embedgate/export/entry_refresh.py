"""Entry-only export: a new entry version with the model's current dense weights, the PS tables left as they are.

While a trainer streams rows to the PS (``embedgate.train``), its dense weights keep training too; re-exporting the
tables to roll them out would defeat the streaming. :func:`export_entry` writes only ``entry/<M>`` (``M`` = the next
version number of the model) and a manifest with ``version = M`` and ``ps_version = P``: the PS version that the
current manifest runs with (``P`` = its ``ps_version``, or its ``version`` after a full export). The gateway then
serves requests at entry ``M`` with every PS lookup at ``P`` (docs/export.md, "Entry and PS versions").

Refused (:class:`~embedgate.export.exporter.ExportError`, naming what differs), so that no entry is ever paired with
PS shards that disagree: no existing export; a model whose tables, dims, default rows or shard count differ from the
PS version's (``Manifest.ps_layout_key``); a lookup layer whose vocabulary or bins differ from ``lookups.json`` (the
PS keys would differ); a missing ``ps_<i>/<P>`` directory.

Publication order: the entry SavedModel is staged (and, with ``self_check``, run against the Keras entry sub-model
on random inputs), the manifest of ``M`` replaces ``manifest.json`` (the gateway learns the pairing before any
backend serves ``M``), then ``entry/<M>`` is renamed into place; if that rename fails the previous manifest is put
back. ``keep_entry_versions`` newest entry versions are kept on disk (plus the PS version's own entry), older entry
versions are removed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from embedgate.export.declaration import Declaration, load_declaration
from embedgate.export.exporter import (
    ENTRY_DIR,
    ExportError,
    ExportResult,
    _load_model,
    _plan,
    _save_entry,
    _tensorflow_version,
    next_version,
)
from gateway.lookup_mapping import LOOKUPS_FILE, load_lookups
from schemas.manifest import (
    MANIFEST_FILE,
    EntryInputMode,
    EntryRowDtype,
    FeatureKind,
    Manifest,
    PartitionSpec,
    entry_index_input,
    entry_rows_input,
    entry_splits_input,
    entry_weights_input,
    ps_dir_name,
)

__all__ = ["export_entry"]

_RTOL = 1e-4
_ATOL = 1e-5


def export_entry(
    model: Any,
    declaration: Declaration | str | Path,
    out_dir: str | Path,
    *,
    self_check: bool = True,
    keep_entry_versions: int = 3,
) -> ExportResult:
    """Write a new entry version of ``<out_dir>/<model_name>`` from ``model`` (a keras.Model or ``.keras`` file)
    that runs with the current PS version; returns the result (``manifest.ps_version`` = that PS version)."""
    decl = declaration if isinstance(declaration, Declaration) else load_declaration(declaration)
    model_dir = Path(out_dir) / decl.model_name
    try:
        current = Manifest.load(model_dir)
    except ValueError as exc:
        raise ExportError(f"{model_dir}: an entry-only export needs an existing export ({exc})") from None
    ps_version = current.ps_version_served
    for i in range(current.num_shards):
        if not (model_dir / ps_dir_name(i) / str(ps_version)).is_dir():
            raise ExportError(
                f"{model_dir / ps_dir_name(i) / str(ps_version)}: PS version {ps_version} is missing"
            )
    plan = _plan(_load_model(model), decl, {})
    manifest = Manifest(
        model_name=decl.model_name,
        version=next_version(model_dir),
        ps_version=ps_version,
        tables=[t.model_copy(update={"rows": _rows(current, t.name, t.rows)}) for t in plan.tables],
        sparse_features=plan.sparse,
        dense_features=plan.dense,
        partition=PartitionSpec(num_shards=current.num_shards),
        entry=current.entry.model_copy(update={"outputs": plan.outputs}),
        ps_layout=current.ps_layout,
        stream_cut=current.stream_cut,
        tensorflow_version=_tensorflow_version(),
        exported_at_ms=current.exported_at_ms,  # the PS version's rows
    )
    _check_layout(model_dir, current, manifest, plan.mappings)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.entry-", dir=model_dir.parent))
    try:
        stage = tmp / ENTRY_DIR
        _save_entry(plan.entry, manifest, stage)
        _write_entry_warmup(stage, manifest)
        if self_check:
            _check_entry(stage, manifest, plan)
        _publish(model_dir, stage, manifest, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(model_dir, keep_entry_versions, keep={ps_version, manifest.version})
    return ExportResult(model_dir=model_dir, version=manifest.version, manifest=manifest)


def _rows(current: Manifest, table: str, default: int) -> int:
    try:
        return current.table(table).rows
    except KeyError:
        return default


def _check_layout(model_dir: Path, current: Manifest, new: Manifest, mappings: dict[str, Any]) -> None:
    if new.ps_layout_key != current.ps_layout_key:
        old = {t.name: (t.dim, t.default_value, t.allow_nan) for t in current.tables}
        now = {t.name: (t.dim, t.default_value, t.allow_nan) for t in new.tables}
        diff = sorted(
            f"table {n!r}: {old.get(n, 'absent')} -> {now.get(n, 'absent')} (dim, default, allow_nan)"
            for n in old.keys() | now.keys()
            if old.get(n) != now.get(n)
        )
        raise ExportError(
            f"{model_dir}: the model's tables differ from PS version {new.ps_version}'s ({'; '.join(diff)}): an "
            "entry-only export needs the same tables, dims and partitioning; export the whole model instead"
        )
    exported = load_lookups(model_dir)
    for feature, mapping in mappings.items():
        if exported.get(feature) != mapping:
            raise ExportError(
                f"{model_dir / LOOKUPS_FILE}: sparse feature {feature!r}: lookup layer {mapping.layer!r} maps values "
                "other than the exported PS keys (vocabulary or bins changed); export the whole model instead"
            )
    missing = sorted(set(exported) - set(mappings))
    if missing:
        raise ExportError(
            f"{model_dir / LOOKUPS_FILE}: features {missing} lost their lookup layer in this model"
        )


def _write_entry_warmup(stage: Path, manifest: Manifest) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    from embedgate.export.warmup import WARMUP_FILE, warmup_requests

    path = stage / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for req in warmup_requests(manifest, ENTRY_DIR):
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=req))
            writer.write(log.SerializeToString())


def _check_entry(stage: Path, manifest: Manifest, plan: Any) -> None:
    """The staged SavedModel's serving signature reproduces the Keras entry sub-model on random inputs (pooled
    rows, or for a ``unique_rows`` entry the same rows sent once per table with one index per example)."""
    import tensorflow as tf

    from embedgate.export.selfcheck import SelfCheckError

    rng = np.random.default_rng(0)
    pooled, feeds = _entry_feeds(manifest, rng, batch=4)
    dense = {d.name: rng.uniform(0, 1, (4, d.dim)).astype(np.float32) for d in manifest.dense_features}
    want = plan.entry(
        [pooled[f.name] for f in manifest.sparse_features] + [dense[d.name] for d in manifest.dense_features],
        training=False,
    )
    if not isinstance(want, (list, tuple)):
        want = [want]
    fn = tf.saved_model.load(str(stage)).signatures[manifest.entry.signature_name]
    got = fn(**feeds, **{k: tf.constant(v) for k, v in dense.items()})
    for spec, w in zip(manifest.entry.outputs, want, strict=True):
        g = np.asarray(got[spec.name])
        if not np.allclose(g, np.asarray(w), rtol=_RTOL, atol=_ATOL):
            raise SelfCheckError(
                f"entry-only export: output {spec.name!r} of the staged entry differs from the Keras model's "
                f"(max abs diff {float(np.max(np.abs(g - np.asarray(w)))):.3g}); nothing published"
            )


def _entry_feeds(
    manifest: Manifest, rng: np.random.Generator, batch: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Random pooled rows per sparse feature (what the Keras entry takes) and the staged signature's sparse feeds
    that must pool to them: the pooled rows themselves, or for ``unique_rows`` each feature's rows in its table's
    rows tensor (in the wire dtype, the pooled rows rounded the same way) with one id per example, weight 1."""
    import tensorflow as tf

    dims = {t.name: t.dim for t in manifest.tables}
    if manifest.entry.input_mode is not EntryInputMode.UNIQUE_ROWS:
        pooled = {
            f.name: rng.normal(0, 0.5, (batch, dims[f.table])).astype(np.float32)
            for f in manifest.sparse_features
        }
        return pooled, {k: tf.constant(v) for k, v in pooled.items()}
    wire = {
        EntryRowDtype.FLOAT32: tf.float32,
        EntryRowDtype.BFLOAT16: tf.bfloat16,
        EntryRowDtype.FLOAT16: tf.float16,
    }[manifest.entry.row_dtype]
    tables: dict[str, list[Any]] = {}
    pooled, feeds = {}, {}
    for f in manifest.sparse_features:
        block = tf.cast(rng.normal(0, 0.5, (batch, dims[f.table])).astype(np.float32), wire)
        offset = sum(int(b.shape[0]) for b in tables.setdefault(f.table, []))
        tables[f.table].append(block)
        pooled[f.name] = tf.cast(block, tf.float32).numpy()
        feeds[entry_index_input(f.name)] = tf.constant(np.arange(offset, offset + batch, dtype=np.int32))
        if f.kind is FeatureKind.MULTI:
            feeds[entry_splits_input(f.name)] = tf.constant(np.arange(batch + 1, dtype=np.int32))
        if f.weights:
            feeds[entry_weights_input(f.name)] = tf.constant(np.ones(batch, np.float32))
    for name, blocks in tables.items():
        feeds[entry_rows_input(name)] = tf.concat(blocks, axis=0)
    return pooled, feeds


def _publish(model_dir: Path, stage: Path, manifest: Manifest, tmp: Path) -> None:
    """Manifest first (the pairing is known before a backend serves the entry), then the entry directory."""
    dest = model_dir / ENTRY_DIR / str(manifest.version)
    if dest.exists():
        raise ExportError(f"{dest}: version {manifest.version} already exists")
    previous = (model_dir / MANIFEST_FILE).read_text(encoding="utf-8")
    mtmp = tmp / MANIFEST_FILE
    mtmp.write_text(manifest.dumps(), encoding="utf-8")
    mtmp.replace(model_dir / MANIFEST_FILE)
    try:
        stage.rename(dest)
    except BaseException:
        back = tmp / f"{MANIFEST_FILE}.previous"
        back.write_text(previous, encoding="utf-8")
        back.replace(model_dir / MANIFEST_FILE)
        raise


def _prune(model_dir: Path, keep_newest: int, keep: set[int]) -> None:
    """Remove entry versions older than the ``keep_newest`` newest, except those in ``keep``."""
    if keep_newest < 1:
        return
    entry = model_dir / ENTRY_DIR
    versions = sorted((int(p.name) for p in entry.iterdir() if p.name.isdigit()), reverse=True)
    for v in versions[keep_newest:]:
        if v not in keep:
            shutil.rmtree(entry / str(v), ignore_errors=True)
