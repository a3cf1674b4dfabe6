"""The exported model's manifest: ``<out>/<model>/manifest.json``.

Written by the exporter, read by the gateway (feature validation, routing, pooling, entry inputs), the updater
(table dims, shard routing) and the producer. It is the single description of the entry/PS split:

* every **table** lives hash-partitioned over ``partition.num_shards`` PS servables (``ps_<i>``); an id's shard is
  :func:`schemas.partition.shard_for` of the id;
* every **sparse feature** reads one table: a single id per example (``kind=single``) or a variable-length list
  of ids (``kind=multi``), optionally with one float weight per id, pooled with ``combiner``;
* every **dense feature** is a float32 vector of ``dim`` values per example;
* the **entry** servable takes every dense feature (input named after it) and the sparse features in one of two
  forms (``entry.input_mode``), and returns ``entry.outputs``:

  - ``pooled`` (every manifest written before the field existed): per example, one pooled float32[dim] per sparse
    feature, input named after the feature; the gateway pools;
  - ``unique_rows``: per table ``rows__<table>`` [U, dim] (each distinct row of the batch once, dtype
    ``entry.row_dtype``) and per sparse feature ``index__<feature>`` int32 into those rows ([B] for a single
    feature; [nnz] with ``splits__<feature>`` int32 [B + 1] for a multi feature, CSR row splits) and, for a feature
    with weights, ``weights__<feature>`` float32 (same shape as the index); the entry gathers and pools in its own
    graph (:func:`entry_rows_input` and the functions next to it name these inputs).
* a multi feature with ``mask_zero`` drops id 0 (after any lookup mapping: the PS key) before pooling, as Keras's
  ``Embedding(mask_zero=True)`` followed by a mask-aware pooling layer drops its padding.

PS servable signatures (the contract between exporter, gateway and updater; names from the functions below):

=====================  ===================================================  ===========================================
signature              inputs                                               outputs
=====================  ===================================================  ===========================================
``lookup``             ``<table>_ids`` int64 [n] for **every** table        ``<table>_values`` float32 [n, dim]
``upsert_<t>``         ``ids`` int64 [n], ``values`` float32 [n, dim],      ``rows`` int64 [] (rows in table after),
                       ``timestamps_ms`` int64 [n], ``seqs`` int64 [n],     ``applied`` int64 [] (ids written),
                       ``stream_partitions`` string [k],                    ``stream_previous`` int64 [k]
                       ``stream_offsets``, ``stream_expected`` int64 [k]
``delete_<t>``         ``ids``, ``timestamps_ms``, ``seqs`` int64 [n],      ``rows``, ``applied`` int64 [],
                       ``stream_partitions``, ``stream_offsets``,           ``stream_previous`` int64 [k]
                       ``stream_expected`` as above
``row_count``          (none)                                               ``<table>_rows`` int64 [] for every table
``stream_position``    (none)                                               ``<table>_stream_partitions`` string [k],
                                                                            ``<table>_stream_offsets`` int64 [k]
=====================  ===================================================  ===========================================

Unknown ids look up to the table's default row (every element ``default_value``). Every row has a version
(``timestamps_ms``, ``seqs``): the producer timestamp and sequence of the write that set it. **Newest wins per row**:
a write (upsert or delete) applies an id only if its (timestamp, seq) is >= the id's stored version, compared as a
pair; a delete keeps a tombstone with its version, so an older upsert arriving later does not resurrect the row;
exported rows have version (-1, -1). Within one call the highest (timestamp, seq) of an id wins, ties to its last
occurrence. Deleting an absent id records the tombstone. ``stream_partitions[i]`` = ``"<topic>:<partition>"`` and
``stream_offsets[i]`` = the next Kafka offset after the messages this call completes: the table's position moves
there (never back), but only if it is >= ``stream_expected[i]`` (the writer has written everything from there, so no
gap is skipped); ``stream_previous[i]`` answers the position stored before the call (-1: none); ``k`` may be 0. ``stream_position`` reports every table's positions (the export's stream cut,
then moved by writes; ``Manifest.stream_cut`` records that cut); the gateway reads ``lookup`` and polls
``stream_position`` (it reads replicas behind the others last).

Served model names (placement, gateway defaults): ``<model>_entry`` and ``<model>_ps_<i>``.

Entry and PS versions: a full export writes ``entry/<N>`` and every ``ps_<i>/<N>`` with ``version = N``. An
entry-only export (``embedgate export --entry-only``: new dense weights, tables kept streaming) writes only
``entry/<M>`` with ``version = M`` and ``ps_version = N``, the PS version it runs with; the gateway sends ``N`` in
every PS lookup of a request served at entry version ``M``. :attr:`Manifest.ps_layout_key` digests what entry and PS
must agree on (tables, dims, default rows, partitioning); the exporter refuses an entry-only export whose layout key
differs from its PS version's, and the gateway never pairs versions whose known layout keys differ.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.partition import PARTITION_FUNCTION

__all__ = [
    "EXAMPLE_REQUEST_FILE",
    "EXPIRE_SIGNATURE",
    "LOOKUP_SIGNATURE",
    "MANIFEST_FILE",
    "ROW_COUNT_SIGNATURE",
    "STREAM_POSITION_SIGNATURE",
    "Combiner",
    "DenseFeatureSpec",
    "EntryInputMode",
    "EntryRowDtype",
    "EntrySpec",
    "FeatureKind",
    "Manifest",
    "ManifestError",
    "OutputSpec",
    "PartitionSpec",
    "PsLayout",
    "RowDtype",
    "SparseFeatureSpec",
    "TableSpec",
    "delete_signature",
    "entry_index_input",
    "entry_model_name",
    "entry_rows_input",
    "entry_splits_input",
    "entry_weights_input",
    "expire_count_output",
    "lookup_ids_input",
    "lookup_values_output",
    "ps_dir_name",
    "ps_model_name",
    "row_count_output",
    "stream_offsets_output",
    "stream_partition_key",
    "stream_partitions_output",
    "upsert_signature",
]

MANIFEST_FILE = "manifest.json"
EXAMPLE_REQUEST_FILE = "example_request.json"  # next to the manifest: a REST predict body (the docs' example)
FORMAT_VERSION: Final = 1

LOOKUP_SIGNATURE = "lookup"
ROW_COUNT_SIGNATURE = "row_count"
STREAM_POSITION_SIGNATURE = "stream_position"
EXPIRE_SIGNATURE = "expire"  # slab-layout shards with a table that has ttl_s: now_ms int64 [] -> <t>_expired

_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
Name = Annotated[
    str, Field(pattern=_NAME, description="letters, digits and _; starts with a letter; <= 64 chars")
]


def upsert_signature(table: str) -> str:
    return f"upsert_{table}"


def delete_signature(table: str) -> str:
    return f"delete_{table}"


def lookup_ids_input(table: str) -> str:
    return f"{table}_ids"


def lookup_values_output(table: str) -> str:
    return f"{table}_values"


def row_count_output(table: str) -> str:
    return f"{table}_rows"


def stream_partitions_output(table: str) -> str:
    return f"{table}_stream_partitions"


def stream_offsets_output(table: str) -> str:
    return f"{table}_stream_offsets"


def expire_count_output(table: str) -> str:
    return f"{table}_expired"


def stream_partition_key(topic: str, partition: int) -> str:
    """``"<topic>:<partition>"``: how a PS table names a Kafka partition in its stream position."""
    return f"{topic}:{partition}"


def entry_rows_input(table: str) -> str:
    """Unique-rows entry: the [U, dim] rows of ``table`` the batch uses, each once."""
    return f"rows__{table}"


def entry_index_input(feature: str) -> str:
    """Unique-rows entry: int32 indices of ``feature``'s ids into its table's rows ([B] single, [nnz] multi)."""
    return f"index__{feature}"


def entry_splits_input(feature: str) -> str:
    """Unique-rows entry: int32 [B + 1] row splits of a multi feature's indices (example i: splits[i]:splits[i+1])."""
    return f"splits__{feature}"


def entry_weights_input(feature: str) -> str:
    """Unique-rows entry: float32 per-id weights of a weighted feature (same shape as its index input)."""
    return f"weights__{feature}"


def ps_dir_name(shard: int) -> str:
    return f"ps_{shard}"


def entry_model_name(model: str) -> str:
    return f"{model}_entry"


def ps_model_name(model: str, shard: int) -> str:
    return f"{model}_ps_{shard}"


class ManifestError(ValueError):
    """A manifest file that is missing, unreadable or invalid; the message names the file and the problem."""


class Combiner(StrEnum):
    SUM = "sum"  # sum_i w_i * e_i
    MEAN = "mean"  # sum_i w_i * e_i / sum_i w_i   (0 when sum_i w_i == 0)
    SQRTN = "sqrtn"  # sum_i w_i * e_i / sqrt(sum_i w_i^2)   (0 when no ids)


class FeatureKind(StrEnum):
    SINGLE = "single"  # exactly one id per example
    MULTI = "multi"  # zero or more ids per example


class PsLayout(StrEnum):
    """How a PS shard holds its rows (:mod:`embedgate.export.ps`); the signatures are the same for both."""

    SLAB = "slab"  # rows in one dense variable per table + an id -> slot index (the default of new exports)
    HASH = "hash"  # one MutableHashTable entry per row (exports before the slab layout; deprecated)


RowDtype = Literal["float32", "float16", "bfloat16"]


class EntryInputMode(StrEnum):
    POOLED = "pooled"  # one pooled float32 [B, dim] per sparse feature; the gateway pools
    UNIQUE_ROWS = "unique_rows"  # unique rows per table + int32 indices; the entry gathers and pools


class EntryRowDtype(StrEnum):
    """The dtype of the unique rows on the wire; the entry casts them to float32 before pooling."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TableSpec(_Strict):
    name: Name
    dim: int = Field(gt=0, le=65536)
    default_value: float = Field(0.0, description="every element of the row returned for an unknown id")
    allow_nan: bool = Field(
        False, description="whether rows may contain NaN/Inf (the updater rejects them if not)"
    )
    rows: int = Field(0, ge=0, description="rows exported with the model (informational)")
    row_dtype: RowDtype = Field(
        "float32", description="how the PS stores the rows (slab layout); lookups and upserts are float32"
    )
    ttl_s: float | None = Field(
        None,
        gt=0,
        description="rows whose newest write is older than this many seconds are removed by the PS's expire "
        "signature (slab layout); None = rows never expire",
    )


class SparseFeatureSpec(_Strict):
    name: Name
    table: Name
    kind: FeatureKind = FeatureKind.SINGLE
    combiner: Combiner = Combiner.SUM
    weights: Name | None = Field(
        None, description="name of the optional per-id float weight input; None = every weight is 1"
    )
    max_ids: int | None = Field(None, gt=0, description="longest id list accepted per example (multi only)")
    mask_zero: bool = Field(
        False,
        description="multi only: id 0 (the PS key, after any lookup mapping) is padding and is dropped before "
        "pooling, as Keras's Embedding(mask_zero=True) with a mask-aware pooling layer drops it",
    )


class DenseFeatureSpec(_Strict):
    name: Name
    dim: int = Field(1, gt=0, description="float32 values per example")


class PartitionSpec(_Strict):
    function: Literal["splitmix64_mod"] = PARTITION_FUNCTION
    num_shards: int = Field(gt=0, le=4096)


class OutputSpec(_Strict):
    name: Name
    dtype: Literal["float32", "float64", "int32", "int64"] = "float32"
    shape: list[int] = Field(description="per-example shape, without the batch dimension; -1 = unknown")


class EntrySpec(_Strict):
    signature_name: str = "serving_default"
    outputs: list[OutputSpec] = Field(min_length=1)
    input_mode: EntryInputMode = Field(
        EntryInputMode.POOLED,
        description="how the entry takes sparse features: pooled rows per feature, or unique rows per table plus "
        "indices (a manifest without the field is pooled)",
    )
    row_dtype: EntryRowDtype = Field(
        EntryRowDtype.FLOAT32, description="unique_rows only: dtype of the rows__<table> inputs on the wire"
    )


class Manifest(_Strict):
    format_version: Literal[1] = FORMAT_VERSION
    model_name: Name
    version: int = Field(gt=0, description="numeric version directory of entry and every ps_<i>")
    tables: list[TableSpec] = Field(min_length=1)
    sparse_features: list[SparseFeatureSpec] = Field(min_length=1)
    dense_features: list[DenseFeatureSpec] = Field(default_factory=list)
    partition: PartitionSpec
    entry: EntrySpec
    ps_layout: PsLayout = Field(
        PsLayout.HASH,
        description="how the PS shards hold their rows; a manifest without the field is of the hash layout",
    )
    stream_cut: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description='the Kafka stream cut the PS tables of this version contain: "<topic>:<partition>" -> next '
        "offset (every row published before it is in the snapshot; each PS table starts at this position); "
        "empty = none recorded (replicas start without a position)",
    )
    tensorflow_version: str | None = Field(
        None,
        max_length=64,
        description="tf.__version__ of the TensorFlow that wrote the SavedModels, e.g. 2.21.0: serve them with the "
        "TF Serving release of that version; None = not recorded (manifests written before the field existed)",
    )

    exported_at_ms: int | None = Field(
        None,
        ge=0,
        description="wall-clock ms at which the exported PS rows count as written (tables with ttl_s expire from "
        "it); None = not recorded",
    )
    ps_version: int | None = Field(
        None,
        gt=0,
        description="the PS version (ps_<i>/<ps_version>) this entry version runs with; null = version (entry and "
        "PS exported together). Set by an entry-only export",
    )

    @model_validator(mode="after")
    def _check_references(self) -> Manifest:
        if self.ps_version is not None and self.ps_version > self.version:
            raise ValueError(f"ps_version {self.ps_version} is newer than version {self.version}")
        for key in self.stream_cut:
            topic, sep, part = key.rpartition(":")
            if not sep or not topic or not part.isdigit():
                raise ValueError(f'stream_cut: key {key!r} is not "<topic>:<partition>"')
        tables = [t.name for t in self.tables]
        if dup := _first_duplicate(tables):
            raise ValueError(f"table {dup!r} is declared twice")
        names = [f.name for f in self.sparse_features] + [f.name for f in self.dense_features]
        names += [f.weights for f in self.sparse_features if f.weights]
        if dup := _first_duplicate(names):
            raise ValueError(f"input name {dup!r} is used by more than one feature")
        if self.ps_layout is PsLayout.HASH:
            for t in self.tables:
                if t.row_dtype != "float32" or t.ttl_s is not None:
                    raise ValueError(f"table {t.name!r}: row_dtype and ttl_s need ps_layout 'slab'")
        for f in self.sparse_features:
            if f.table not in tables:
                raise ValueError(f"sparse feature {f.name!r} reads table {f.table!r}, which is not declared")
            if f.kind is FeatureKind.SINGLE and f.max_ids is not None:
                raise ValueError(f"sparse feature {f.name!r}: max_ids applies to kind 'multi' only")
            if f.kind is FeatureKind.SINGLE and f.mask_zero:
                raise ValueError(f"sparse feature {f.name!r}: mask_zero applies to kind 'multi' only")
        if self.entry.input_mode is EntryInputMode.UNIQUE_ROWS:
            entry_names = names + [entry_rows_input(t) for t in tables]
            for f in self.sparse_features:
                entry_names.append(entry_index_input(f.name))
                if f.kind is FeatureKind.MULTI:
                    entry_names.append(entry_splits_input(f.name))
                if f.weights:
                    entry_names.append(entry_weights_input(f.name))
            if dup := _first_duplicate(entry_names):
                raise ValueError(
                    f"entry input name {dup!r} is used twice (a feature named like an entry input)"
                )
        elif self.entry.row_dtype is not EntryRowDtype.FLOAT32:
            raise ValueError("entry.row_dtype applies to entry.input_mode 'unique_rows' only")
        return self

    # -- lookups ------------------------------------------------------------------------------------------------
    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def sparse(self, name: str) -> SparseFeatureSpec:
        for f in self.sparse_features:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def num_shards(self) -> int:
        return self.partition.num_shards

    @property
    def ps_version_served(self) -> int:
        """The PS version a request at this manifest's (entry) version reads: ``ps_version``, else ``version``."""
        return self.version if self.ps_version is None else self.ps_version

    @property
    def ps_layout_key(self) -> str:
        """Hex SHA-256 (first 16 hex digits) of what an entry and the PS shards it reads must agree on: every table's
        name, dim, default value and NaN policy, the partition function and the shard count (not the row counts or
        stream cut, which streaming changes). Two manifests with one key address the same PS layout."""
        layout = {
            "tables": sorted([t.name, t.dim, t.default_value, t.allow_nan] for t in self.tables),
            "partition": [self.partition.function, self.partition.num_shards],
        }
        text = json.dumps(layout, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- files --------------------------------------------------------------------------------------------------
    def dumps(self) -> str:
        """The ``manifest.json`` text (``ps_version`` only when set: a full export's manifest is unchanged)."""
        exclude = {"ps_version"} if self.ps_version is None else None
        return self.model_dump_json(indent=2, exclude=exclude) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read ``path`` (a manifest.json or the model directory holding one); errors name the file."""
        p = Path(path)
        if p.is_dir():
            p = p / MANIFEST_FILE
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestError(f"{p}: cannot read manifest: {exc.strerror or exc}") from exc
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ManifestError(f"{p}: invalid manifest: {_describe(exc)}") from exc


def _first_duplicate(names: list[str]) -> str | None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
