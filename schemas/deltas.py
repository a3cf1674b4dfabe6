"""Kafka delta messages: absolute embedding rows (never gradients) for one table of one model.

A delta says "these ids now have exactly these rows" (``upsert``) or "these ids are gone" (``delete``). Applying one
twice, or applying an older one again before the newer one, converges to the same state as long as each shard's
messages are applied in partition order: that is what makes the updater's at-least-once delivery safe.

Three encodings, all decoded by pure functions here (no I/O):

**Binary** (production; ``encode_delta`` / ``decode_delta``), every integer little-endian::

    offset        size      field
    0             4         magic  b"EGDM"
    4             1         version uint8 = 1
    5             1         op uint8: 1 = upsert, 2 = delete
    6             2         reserved uint16 = 0 (decoders reject anything else)
    8             8         timestamp_ms int64: producer wall clock, ms since the Unix epoch
    16            8         sequence int64 >= 0: per (producer, shard) counter, +1 per message
    24            4         n uint32: number of ids (>= 1)
    28            4         dim uint32: floats per row (upsert: >= 1; delete: 0)
    32            1         M uint8: length of the model name (1..64)
    33            1         T uint8: length of the table name (1..64)
    34            1         P uint8: length of the producer id (0..255)
    35            1         reserved uint8 = 0
    36            M         model name, ASCII
    36+M          T         table name, ASCII
    36+M+T        P         producer id, UTF-8
    H = 36+M+T+P  8*n       ids int64[n]
    H + 8n        4*n*dim   values float32[n, dim], row-major (upsert only)
    end = H + 8n + 4n*dim   (the message must end exactly there)

**JSON** (debugging; ``encode_delta_json`` / same ``decode_delta``, recognised by a leading ``{``)::

    {"model": "demo", "table": "item", "op": "upsert", "ids": [12], "values": [[0.1, 0.2]],
     "timestamp_ms": 1764000000000, "sequence": 0, "producer": "trainer-0"}

**HPS** (``decode_hps``: HugeCTR HPS's Kafka format, consumed as it is): topic ``hps_et.<model>.<table>``, no message
key, value = magic uint32 ``0x52544348`` (bytes ``HCTR``), uint32 bytes per row (``4 * dim``), then records of
(int64 key, float32[dim]) until the end; no count; a header-only message is a beacon (``None``). HPS has no delete,
timestamp or sequence: the caller passes the Kafka record's timestamp and offset.

Every decoder raises :class:`DeltaError` naming the problem (``.reason`` is a short stable slug for metrics and
dead-letter headers), and **only** that, whatever the bytes: JSON nested deeper than Python's parser recurses, integer
literals longer than :data:`MAX_JSON_INT_CHARS` (Python refuses to convert 4,300+ digits), numbers outside float32,
non-UTF-8 text and lying length fields are rejected with their own reason; any other exception a message makes a
decoder raise (a bug, ``MemoryError``) is turned into ``DeltaError(DECODER_ERROR, ...)`` at the decoder's boundary,
so a caller that handles ``DeltaError`` handles every message (tests/schemas/test_deltas_fuzz.py).
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.manifest import Manifest

__all__ = [
    "BINARY_MAGIC",
    "DEAD_LETTER_TOPIC",
    "DECODER_ERROR",
    "DELTA_TOPIC_PREFIX",
    "FORMAT_VERSION",
    "HPS_MAGIC",
    "HPS_TOPIC_PATTERN",
    "MAX_JSON_INT_CHARS",
    "DeltaError",
    "DeltaOp",
    "EmbeddingDelta",
    "check_against_manifest",
    "decode_delta",
    "decode_hps",
    "delta_topic",
    "encode_delta",
    "encode_delta_json",
    "encode_hps",
    "hps_topic",
    "shard_partition",
]

BINARY_MAGIC: Final = b"EGDM"
FORMAT_VERSION: Final = 1
HPS_MAGIC: Final = b"HCTR"  # uint32 0x52544348 little-endian
DELTA_TOPIC_PREFIX: Final = "embedgate.deltas"
DEAD_LETTER_TOPIC: Final = "embedgate.dlq"
HPS_TOPIC_PATTERN: Final = r"hps_et\..*"

_HEADER = struct.Struct("<4sBBHqqIIBBBB")  # 36 bytes
_OP_CODES: Final = {1: "upsert", 2: "delete"}
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_HPS_TOPIC_RE = re.compile(r"^hps_et\.([A-Za-z0-9_\-]{1,120})\.([A-Za-z0-9_\-]{1,120})$")

DECODER_ERROR: Final = "decoder_error"
"""Reason of a message that made a decoder fail in a way it does not name (any exception but :class:`DeltaError`:
a bug, ``MemoryError``): the message is rejected like any invalid one, the exception's class is in the text."""

MAX_JSON_INT_CHARS: Final = 64
"""Longest integer literal (sign included) a JSON delta may hold. int64 needs 20 characters, a float32 written as an
integer 40; longer ones are refused before Python converts them (it refuses 4,300+ digits with a ValueError and
converts long ones in quadratic time)."""

_MAX_SHOWN = 80  # characters of a message-controlled string echoed in an error
_P = ParamSpec("_P")
_R = TypeVar("_R")


class DeltaError(ValueError):
    """A delta message that cannot be decoded or is not valid.

    ``reason`` is a stable slug (``bad_magic``, ``truncated``, ``shape_mismatch``, ``unknown_op``, ``bad_version``,
    ``invalid_json``, ``invalid_field``, ``unknown_model``, ``unknown_table``, ``dim_mismatch``, ``nan_values``,
    ``bad_topic``, ``unexpected_key``; the updater adds ``wrong_partition`` and ``apply_rejected``); the message
    says what was wrong and, for bytes, at which offset.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _shown(text: str, limit: int = _MAX_SHOWN) -> str:
    """``text`` as echoed in an error: its repr, cut to ``limit`` characters (a message controls it)."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text)} characters)"


def _only_delta_errors(decoder: Callable[_P, _R]) -> Callable[_P, _R]:
    """``decoder`` with every exception but :class:`DeltaError` (and non-``Exception`` ones such as a cancellation)
    turned into ``DeltaError(DECODER_ERROR, ...)`` naming its class: the decoders' contract, whatever the bytes."""

    @functools.wraps(decoder)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return decoder(*args, **kwargs)
        except DeltaError:
            raise
        except Exception as exc:
            raise DeltaError(
                DECODER_ERROR,
                f"the decoder failed on this message: {type(exc).__name__}: {_shown(str(exc), 200)}",
            ) from exc

    return guarded


class DeltaOp(StrEnum):
    UPSERT = "upsert"
    DELETE = "delete"


_OP_TO_CODE: Final = {DeltaOp.UPSERT: 1, DeltaOp.DELETE: 2}


class EmbeddingDelta(BaseModel):
    """Absolute rows for ``ids`` of ``table`` in ``model``; ``values`` is float32 [n, dim] for upserts, None for
    deletes. Immutable; the arrays are read-only views."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    model: str = Field(pattern=_NAME_RE.pattern)
    table: str = Field(pattern=_NAME_RE.pattern)
    op: DeltaOp
    ids: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32] | None = None
    timestamp_ms: int = Field(ge=0, lt=2**63)
    sequence: int = Field(0, ge=0, lt=2**63)
    producer: str = Field("", max_length=255)

    @field_validator("ids", mode="before")
    @classmethod
    def _ids(cls, v: Any) -> npt.NDArray[np.int64]:
        a = np.asarray(v)
        if a.ndim != 1:
            raise ValueError(f"ids must be 1-D, got shape {a.shape}")
        if a.size == 0:
            raise ValueError("ids must not be empty")
        if a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
                a = a.astype(np.int64)
            else:
                raise ValueError(f"ids must be integers, got dtype {a.dtype}")
        if a.dtype.kind == "u" and a.size and int(a.max()) >= 2**63:
            raise ValueError("ids must fit in int64")
        out = np.ascontiguousarray(a, dtype="<i8")
        out.flags.writeable = False
        return out

    @field_validator("values", mode="before")
    @classmethod
    def _values(cls, v: Any) -> npt.NDArray[np.float32] | None:
        if v is None:
            return None
        a = np.asarray(v)
        if a.dtype.kind not in "fiu":
            raise ValueError(f"values must be numbers, got dtype {a.dtype}")
        if a.ndim != 2:
            raise ValueError(f"values must be 2-D [n, dim], got shape {a.shape}")
        out = np.ascontiguousarray(a, dtype="<f4")
        out.flags.writeable = False
        return out

    @model_validator(mode="after")
    def _shapes(self) -> EmbeddingDelta:
        n = len(self.ids)
        if self.op is DeltaOp.UPSERT:
            if self.values is None:
                raise ValueError("an upsert needs values")
            if self.values.shape[0] != n:
                raise ValueError(f"values has {self.values.shape[0]} rows but there are {n} ids")
            if self.values.shape[1] < 1:
                raise ValueError("values must have dim >= 1")
        elif self.values is not None:
            raise ValueError("a delete carries no values")
        return self

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return 0 if self.values is None else int(self.values.shape[1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EmbeddingDelta):
            return NotImplemented
        same_values = (self.values is None and other.values is None) or (
            self.values is not None
            and other.values is not None
            and self.values.shape == other.values.shape
            and self.values.tobytes() == other.values.tobytes()
        )
        return (
            (self.model, self.table, self.op, self.timestamp_ms, self.sequence, self.producer)
            == (other.model, other.table, other.op, other.timestamp_ms, other.sequence, other.producer)
            and np.array_equal(self.ids, other.ids)
            and same_values
        )

    __hash__ = None  # type: ignore[assignment]


# -- binary ---------------------------------------------------------------------------------------------------------
def encode_delta(delta: EmbeddingDelta) -> bytes:
    """The binary encoding (module docstring), byte for byte."""
    model = delta.model.encode("ascii")
    table = delta.table.encode("ascii")
    producer = delta.producer.encode("utf-8")
    if len(producer) > 255:
        raise DeltaError("invalid_field", f"producer id is {len(producer)} bytes in UTF-8; at most 255")
    header = _HEADER.pack(
        BINARY_MAGIC,
        FORMAT_VERSION,
        _OP_TO_CODE[delta.op],
        0,
        delta.timestamp_ms,
        delta.sequence,
        delta.n,
        delta.dim,
        len(model),
        len(table),
        len(producer),
        0,
    )
    parts = [header, model, table, producer, delta.ids.astype("<i8", copy=False).tobytes()]
    if delta.values is not None:
        parts.append(delta.values.astype("<f4", copy=False).tobytes())
    return b"".join(parts)


@_only_delta_errors
def decode_delta(data: bytes | bytearray | memoryview | None) -> EmbeddingDelta:
    """Decode a binary or JSON delta (by its first byte); raises :class:`DeltaError` naming the problem, and nothing
    else whatever ``data`` holds (see the module doc)."""
    if data is None:
        raise DeltaError("bad_magic", "empty message (null value / tombstone); expected a delta")
    buf = bytes(data)
    if buf[:4] == BINARY_MAGIC:
        return _decode_binary(buf)
    if buf.lstrip()[:1] == b"{":
        return _decode_json(buf)
    if buf[:4] == HPS_MAGIC:
        raise DeltaError(
            "bad_magic", "HPS message (magic HCTR) on a delta topic; publish it to hps_et.<model>.<table>"
        )
    if len(buf) < 4:
        raise DeltaError(
            "truncated", f"truncated at offset {len(buf)}: message has {len(buf)} bytes, magic needs 4"
        )
    raise DeltaError(
        "bad_magic", f"wrong magic {buf[:4]!r} at offset 0; expected {BINARY_MAGIC!r} or a JSON object"
    )


def _decode_binary(buf: bytes) -> EmbeddingDelta:
    size = len(buf)
    if size < _HEADER.size:
        raise DeltaError(
            "truncated", f"truncated at offset {size}: header needs {_HEADER.size} bytes, got {size}"
        )
    _, version, op_code, reserved, ts, seq, n, dim, m_len, t_len, p_len, reserved2 = _HEADER.unpack_from(buf)
    if version != FORMAT_VERSION:
        raise DeltaError(
            "bad_version", f"unsupported format version {version} at offset 4; this decoder reads 1"
        )
    if op_code not in _OP_CODES:
        raise DeltaError(
            "unknown_op", f"unknown op code {op_code} at offset 5; expected 1 (upsert) or 2 (delete)"
        )
    if reserved or reserved2:
        raise DeltaError("invalid_field", "reserved header bytes (offsets 6-7, 35) must be 0")
    op = DeltaOp(_OP_CODES[op_code])
    if ts < 0:
        raise DeltaError("invalid_field", f"negative timestamp_ms {ts} at offset 8")
    if seq < 0:
        raise DeltaError("invalid_field", f"negative sequence {seq} at offset 16")
    if n == 0:
        raise DeltaError("shape_mismatch", "n = 0 ids at offset 24; a delta carries at least one id")
    if op is DeltaOp.UPSERT and dim == 0:
        raise DeltaError("shape_mismatch", "upsert with dim = 0 at offset 28")
    if op is DeltaOp.DELETE and dim != 0:
        raise DeltaError("shape_mismatch", f"delete with dim = {dim} at offset 28; must be 0")
    pos = _HEADER.size
    names = []
    for label, length in (("model name", m_len), ("table name", t_len), ("producer id", p_len)):
        if pos + length > size:
            raise DeltaError(
                "truncated", f"truncated at offset {size}: {label} needs bytes {pos}..{pos + length}"
            )
        raw = buf[pos : pos + length]
        try:
            names.append(raw.decode("ascii" if label != "producer id" else "utf-8"))
        except UnicodeDecodeError as exc:
            raise DeltaError(
                "invalid_field", f"{label} at offset {pos} is not valid text: {exc.reason}"
            ) from exc
        pos += length
    model, table, producer = names
    for label, name in (("model name", model), ("table name", table)):
        if not _NAME_RE.match(name):
            raise DeltaError("invalid_field", f"{label} {name!r} is not a valid name (letters, digits, _)")
    ids_end = pos + 8 * n
    values_end = ids_end + 4 * n * dim
    if size < values_end:
        what = "ids" if size < ids_end else "values"
        raise DeltaError(
            "truncated",
            f"truncated at offset {size}: n={n}, dim={dim} need {values_end} bytes ({what} incomplete)",
        )
    if size > values_end:
        raise DeltaError(
            "shape_mismatch",
            f"{size - values_end} trailing bytes after offset {values_end}: n*dim does not match the payload "
            f"(n={n}, dim={dim})",
        )
    ids = np.frombuffer(buf, dtype="<i8", count=n, offset=pos)
    values = np.frombuffer(buf, dtype="<f4", count=n * dim, offset=ids_end).reshape(n, dim) if dim else None
    return _build(
        model=model,
        table=table,
        op=op,
        ids=ids,
        values=values,
        timestamp_ms=ts,
        sequence=seq,
        producer=producer,
    )


def _build(**fields: Any) -> EmbeddingDelta:
    try:
        return EmbeddingDelta(**fields)
    except ValidationError as exc:
        raise DeltaError("invalid_field", f"invalid delta: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:8]:
        loc = ".".join(str(x)[:_MAX_SHOWN] for x in err["loc"]) or "<root>"  # a JSON key is the message's
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


# -- JSON -----------------------------------------------------------------------------------------------------------
class _JsonDelta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    table: str
    op: str
    ids: list[int]
    values: list[list[float]] | None = None
    timestamp_ms: int
    sequence: int = 0
    producer: str = ""


def encode_delta_json(delta: EmbeddingDelta) -> bytes:
    """The JSON encoding (module docstring); NaN/Inf are written as the JSON extensions NaN/Infinity."""
    body = {
        "model": delta.model,
        "table": delta.table,
        "op": delta.op.value,
        "ids": delta.ids.tolist(),
        "values": None if delta.values is None else delta.values.tolist(),
        "timestamp_ms": delta.timestamp_ms,
        "sequence": delta.sequence,
        "producer": delta.producer,
    }
    if body["values"] is None:
        del body["values"]
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _json_int(literal: str) -> int:
    """``parse_int`` of the JSON parser: refuses literals longer than :data:`MAX_JSON_INT_CHARS` before converting."""
    if len(literal) > MAX_JSON_INT_CHARS:
        raise DeltaError(
            "invalid_json",
            f"integer literal of {len(literal)} characters; at most {MAX_JSON_INT_CHARS} (ids, timestamp_ms and "
            "sequence are int64)",
        )
    return int(literal)


def _decode_json(buf: bytes) -> EmbeddingDelta:
    try:
        obj = json.loads(buf.decode("utf-8"), parse_int=_json_int)
    except UnicodeDecodeError as exc:
        raise DeltaError("invalid_json", f"JSON delta is not UTF-8 at offset {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise DeltaError("invalid_json", f"invalid JSON at offset {exc.pos}: {exc.msg}") from exc
    except RecursionError as exc:  # the parser recurses once per level: bounded by the interpreter's limit
        raise DeltaError(
            "invalid_json", "JSON nested too deeply (a delta nests 3 levels: the object, values, a row)"
        ) from exc
    try:
        raw = _JsonDelta.model_validate(obj)
    except ValidationError as exc:
        raise DeltaError("invalid_json", f"JSON delta failed validation: {_describe(exc)}") from exc
    if raw.op not in ("upsert", "delete"):
        raise DeltaError("unknown_op", f"unknown op {_shown(raw.op)}; expected 'upsert' or 'delete'")
    values = None
    if raw.values is not None:
        widths = {len(r) for r in raw.values}
        if len(widths) > 1:
            raise DeltaError("shape_mismatch", f"values rows have different lengths {sorted(widths)}")
        if raw.op == "upsert" and len(raw.values) != len(raw.ids):
            raise DeltaError(
                "shape_mismatch", f"values has {len(raw.values)} rows but there are {len(raw.ids)} ids"
            )
        values = _float32_rows(raw.values, widths.pop() if widths else 0)
    if any(not (-(2**63) <= i < 2**63) for i in raw.ids):
        raise DeltaError("invalid_field", "ids must fit in int64")
    return _build(
        model=raw.model,
        table=raw.table,
        op=DeltaOp(raw.op),
        ids=np.asarray(raw.ids, dtype=np.int64),
        values=values,
        timestamp_ms=raw.timestamp_ms,
        sequence=raw.sequence,
        producer=raw.producer,
    )


def _float32_rows(rows: list[list[float]], dim: int) -> npt.NDArray[np.float32]:
    """``rows`` as float32 [n, dim]; a finite number outside float32's range is refused (it would become Inf)."""
    wide = np.asarray(rows, dtype=np.float64).reshape(len(rows), dim)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = wide.astype(np.float32)
    overflow = np.isfinite(wide) & ~np.isfinite(narrow)
    if overflow.any():
        row, col = (int(x) for x in np.argwhere(overflow)[0])
        raise DeltaError(
            "invalid_field",
            f"values[{row}][{col}] = {wide[row, col]:g} is outside float32's range (about 3.4e38)",
        )
    return narrow


# -- topics and partitions -------------------------------------------------------------------------------------------
def delta_topic(model: str) -> str:
    """``embedgate.deltas.<model>``: the default topic of one model's deltas (one topic per model, so deployments
    serving different models never read, or dead-letter, each other's messages)."""
    return f"{DELTA_TOPIC_PREFIX}.{model}"


def shard_partition(shard: int, partitions: int) -> int:
    """The partition every message for PS ``shard`` goes to in a topic of ``partitions`` partitions: ``shard %
    partitions``. Producers must use it (not a key hash): shards spread evenly over partitions, and one shard's
    messages stay in one partition, in order. The updater dead-letters a message found elsewhere
    (``wrong_partition``)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return shard % partitions


# -- HPS ------------------------------------------------------------------------------------------------------------
def hps_topic(model: str, table: str) -> str:
    """``hps_et.<model>.<table>``: the topic HPS's Kafka sink writes one table's updates to."""
    return f"hps_et.{model}.{table}"


def encode_hps(ids: npt.ArrayLike, values: npt.ArrayLike) -> bytes:
    """An HPS message value: ``HCTR``, uint32 4*dim, then (int64 key, float32[dim]) records, little-endian."""
    keys = np.asarray(ids, dtype="<i8")
    vecs = np.asarray(values, dtype="<f4")
    if vecs.ndim != 2 or vecs.shape[0] != keys.shape[0]:
        raise DeltaError("shape_mismatch", f"values shape {vecs.shape} does not match {keys.shape[0]} ids")
    d = vecs.shape[1]
    rec = np.empty(len(keys), dtype=[("k", "<i8"), ("v", "<f4", (d,))])
    rec["k"], rec["v"] = keys, vecs
    return HPS_MAGIC + struct.pack("<I", d * 4) + rec.tobytes()


@_only_delta_errors
def decode_hps(
    topic: str, value: bytes | None, *, key: bytes | None = None, timestamp_ms: int = 0, sequence: int = 0
) -> EmbeddingDelta | None:
    """Decode an HPS Kafka record as HPS's own consumer does; None for a beacon (header only) or a null value.

    Like HPS, a record with a non-empty key is rejected (``unexpected_key``). ``timestamp_ms``/``sequence`` are the
    Kafka record's timestamp and offset (HPS carries neither). Raises :class:`DeltaError` and nothing else.
    """
    m = _HPS_TOPIC_RE.match(topic)
    if not m:
        raise DeltaError("bad_topic", f"topic {topic!r} is not hps_et.<model>.<table>")
    model, table = m.group(1), m.group(2)
    if key:
        raise DeltaError(
            "unexpected_key", f"HPS message on {topic!r} has a key ({len(key)} bytes); HPS sends none"
        )
    if value is None:
        return None
    buf = bytes(value)
    if len(buf) < 8:
        raise DeltaError("truncated", f"truncated at offset {len(buf)}: HPS header needs 8 bytes")
    if buf[:4] != HPS_MAGIC:
        raise DeltaError("bad_magic", f"wrong magic {buf[:4]!r} at offset 0; expected {HPS_MAGIC!r}")
    (value_size,) = struct.unpack_from("<I", buf, 4)
    if len(buf) == 8:
        return None  # beacon
    if value_size == 0 or value_size % 4:
        raise DeltaError(
            "shape_mismatch", f"bytes per vector {value_size} at offset 4 is not a positive multiple of 4"
        )
    dim = value_size // 4
    record = 8 + value_size
    body = len(buf) - 8
    if body % record:
        whole = body // record
        raise DeltaError(
            "truncated",
            f"truncated at offset {8 + whole * record}: {body % record} bytes of a {record}-byte record "
            f"(int64 key + {dim} float32)",
        )
    n = body // record
    rec = np.frombuffer(buf, dtype=[("k", "<i8"), ("v", "<f4", (dim,))], count=n, offset=8)
    for label, name in (("model", model), ("table", table)):
        if not _NAME_RE.match(name):
            raise DeltaError(
                f"unknown_{label}", f"HPS {label} name {name!r} cannot name an embedgate {label}"
            )
    return _build(
        model=model,
        table=table,
        op=DeltaOp.UPSERT,
        ids=np.ascontiguousarray(rec["k"]),
        values=np.ascontiguousarray(rec["v"]),
        timestamp_ms=max(0, timestamp_ms),
        sequence=max(0, sequence),
        producer="hps",
    )


# -- semantic checks ------------------------------------------------------------------------------------------------
@_only_delta_errors
def check_against_manifest(delta: EmbeddingDelta, manifest: Manifest) -> None:
    """Raise :class:`DeltaError` if ``delta`` does not fit ``manifest``: other model, unknown table, wrong dim,
    NaN/Inf rows when the table forbids them."""
    if delta.model != manifest.model_name:
        raise DeltaError(
            "unknown_model", f"delta for model {delta.model!r} checked against {manifest.model_name!r}"
        )
    try:
        spec = manifest.table(delta.table)
    except KeyError:
        known = ", ".join(t.name for t in manifest.tables)
        raise DeltaError(
            "unknown_table", f"model {delta.model!r} has no table {delta.table!r} (tables: {known})"
        ) from None
    if delta.values is not None:
        if delta.dim != spec.dim:
            raise DeltaError(
                "dim_mismatch",
                f"table {delta.model}.{delta.table} has dim {spec.dim}, the delta has dim {delta.dim}",
            )
        if not spec.allow_nan and not _all_finite_fast(delta.values):
            finite = np.isfinite(delta.values)
            if not finite.all():
                row = int(np.argwhere(~finite)[0][0])
                raise DeltaError(
                    "nan_values",
                    f"row {row} (id {int(delta.ids[row])}) holds NaN/Inf; table {delta.model}.{delta.table} "
                    "forbids them",
                )


def _all_finite_fast(values: npt.NDArray[np.float32]) -> bool:
    """True when ``values`` certainly holds no NaN/Inf: one float32 sum, no temporary array (a NaN or Inf anywhere
    makes it non-finite). False also when finite rows overflow the sum; the caller then checks element-wise."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.add.reduce(values, axis=None)))
