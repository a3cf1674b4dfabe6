"""Idempotent PS writes: ``upsert_<table>`` / ``delete_<table>`` through TF Serving's Predict on every replica.

:class:`ShardWriter` owns one ``grpc.aio`` channel per target (opened lazily, closed by :meth:`ShardWriter.close`),
insecure or, with ``tls`` (the settings' ``backend_tls``), TLS with the CA and optional client certificate.
:meth:`ShardWriter.apply` writes one coalesced group (one model, shard and table) to **every** replica of the shard
concurrently and returns only when all acknowledged; otherwise it raises the first replica's
:class:`updater.errors.ApplyError` (``ShardUnavailable`` is retriable). Writes are absolute rows with versions (the
PS keeps the newest per row), so repeating a group, or a replica receiving it twice after a partial failure, leaves
the same state. The last call of a group also records the group's stream position in the replica. Task-safe within
one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from schemas.deployment import EmbeddingModel
from schemas.manifest import (
    STREAM_POSITION_SIGNATURE,
    delete_signature,
    stream_offsets_output,
    stream_partitions_output,
    upsert_signature,
)
from schemas.proto import tfs_pb2
from schemas.tensors import TensorError, from_ndarray, to_ndarray
from schemas.tls import BackendTLS
from schemas.wire import predict_request
from tfs_grpc.channels import ChannelConfig, channel_credentials, open_channel, stub
from updater.errors import ApplyError, ShardUnavailable, error_from_grpc
from updater.replicas import Replica

__all__ = ["GroupKey", "ShardWriter", "WriteGroup", "WriteGroupRows"]

# a restarted PS must be found again quickly (gRPC's default reconnect backoff grows to 120 s)
_CHANNEL = ChannelConfig(
    max_send_message_bytes=64 * 1024 * 1024,
    max_receive_message_bytes=64 * 1024 * 1024,
    reconnect_backoff_ms=100,
    max_reconnect_backoff_ms=1000,
)


@dataclass(frozen=True, order=True)
class GroupKey:
    """Rows of one table on one shard of one model: the unit of a PS write and of ordering."""

    model: str
    shard: int
    table: str


class WriteGroupRows(NamedTuple):
    """Coalesced rows of one group: ids whose newest op is an upsert (with rows and versions) and ids whose newest
    op is a delete (with versions). The two id sets are disjoint, so the order of the two writes does not matter."""

    upsert_ids: npt.NDArray[np.int64]
    upsert_values: npt.NDArray[np.float32]
    upsert_timestamps_ms: npt.NDArray[np.int64]
    upsert_seqs: npt.NDArray[np.int64]
    delete_ids: npt.NDArray[np.int64]
    delete_timestamps_ms: npt.NDArray[np.int64]
    delete_seqs: npt.NDArray[np.int64]


@dataclass
class WriteGroup:
    """What one PS write of :class:`GroupKey` sends: the coalesced ``rows`` and the stream ``positions``
    (``"<topic>:<partition>"`` -> next offset) the replica records once they are applied (may be empty)."""

    key: GroupKey
    rows: WriteGroupRows
    positions: dict[str, int] = field(default_factory=dict)

    @property
    def upsert_ids(self) -> npt.NDArray[np.int64]:
        return self.rows.upsert_ids

    @property
    def upsert_values(self) -> npt.NDArray[np.float32]:
        return self.rows.upsert_values

    @property
    def delete_ids(self) -> npt.NDArray[np.int64]:
        return self.rows.delete_ids

    @property
    def row_count(self) -> int:
        return int(len(self.rows.upsert_ids) + len(self.rows.delete_ids))


def _positions(positions: dict[str, int], expected: dict[str, int]) -> dict[str, tfs_pb2.TensorProto]:
    keys = list(positions)
    return {
        "stream_partitions": from_ndarray(np.array(keys, dtype=object)),
        "stream_offsets": from_ndarray(np.array([positions[k] for k in keys], np.int64)),
        "stream_expected": from_ndarray(np.array([expected.get(k, -1) for k in keys], np.int64)),
    }


def _previous(resp: tfs_pb2.PredictResponse, keys: list[str]) -> dict[str, int]:
    """``stream_previous`` of a write response, keyed by the partition keys the write sent (in order)."""
    if "stream_previous" not in resp.outputs:
        return {}
    return dict(zip(keys, _int64s(resp.outputs["stream_previous"]), strict=False))


def _int64s(t: tfs_pb2.TensorProto) -> list[int]:
    """The values of an int64 tensor; TensorError if it cannot be read."""
    return [int(x) for x in to_ndarray(t).ravel()]


def _malformed(exc: TensorError, *, target: str, what: str) -> ApplyError:
    """A replica's answer that cannot be read: retriable, as the INTERNAL status it stands for."""
    return ShardUnavailable(
        f"{what} at {target} failed: malformed answer: {exc}", target=target, code=grpc.StatusCode.INTERNAL
    )


class ShardWriter:
    """Writes groups to PS replicas. ``deadline_s`` bounds every Predict call; ``max_rows_per_call`` chunks.
    ``tls`` makes every channel a TLS channel (its PEM files are read here: ``TLSFileError`` names a bad one)."""

    def __init__(
        self,
        models: Sequence[EmbeddingModel],
        *,
        deadline_s: float = 5.0,
        max_rows_per_call: int = 16384,
        tls: BackendTLS | None = None,
    ) -> None:
        self._models = {m.name: m for m in models}
        self._tls = tls
        self._credentials = channel_credentials(tls) if tls is not None else None
        self._deadline_s = deadline_s
        self._max_rows = max_rows_per_call
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}

    def replicas(self, key: GroupKey) -> list[str]:
        return list(self._models[key.model].shards[key.shard].replicas)

    def _call(self, target: str) -> grpc.aio.UnaryUnaryMultiCallable:
        call = self._calls.get(target)
        if call is None:
            channel = open_channel(target, _CHANNEL, self._tls, self._credentials)
            self._channels[target] = channel
            # requests are serialized once, shared by every replica (bytes)
            call = self._calls[target] = stub(channel, "Predict", serialized=True)
        return call

    def _requests(self, group: WriteGroup) -> list[tuple[str, bytes]]:
        """Serialized Predict calls for ``group``, chunked. Every call but the last carries an empty stream position;
        the last one completes the group and gets each replica's position appended (:meth:`_position_suffix`).
        Built by :func:`schemas.wire.predict_request`: the rows are copied once, straight into the request bytes."""
        model = self._models[group.key.model]
        name = model.served_ps_name(group.key.shard)
        table = group.key.table
        r = group.rows
        calls: list[tuple[str, str, list[tuple[str, npt.NDArray[np.int64] | npt.NDArray[np.float32]]]]] = []
        up, de = upsert_signature(table), delete_signature(table)
        for start in range(0, len(r.upsert_ids), self._max_rows):
            sl = slice(start, start + self._max_rows)
            calls.append(
                (
                    up,
                    f"{up} on {name}",
                    [
                        ("ids", r.upsert_ids[sl]),
                        ("values", r.upsert_values[sl]),
                        ("timestamps_ms", r.upsert_timestamps_ms[sl]),
                        ("seqs", r.upsert_seqs[sl]),
                    ],
                )
            )
        for start in range(0, len(r.delete_ids), self._max_rows):
            sl = slice(start, start + self._max_rows)
            calls.append(
                (
                    de,
                    f"{de} on {name}",
                    [
                        ("ids", r.delete_ids[sl]),
                        ("timestamps_ms", r.delete_timestamps_ms[sl]),
                        ("seqs", r.delete_seqs[sl]),
                    ],
                )
            )
        if not calls:  # no rows: a position-only write (an empty delete)
            empty = np.zeros(0, np.int64)
            calls.append((de, f"{de} on {name}", [("ids", empty), ("timestamps_ms", empty), ("seqs", empty)]))
        no_position = self._position_suffix({}, {})
        return [
            (what, predict_request(name, signature, inputs, no_position if i < len(calls) - 1 else b""))
            for i, (signature, what, inputs) in enumerate(calls)
        ]

    @staticmethod
    def _position_suffix(positions: dict[str, int], expected: dict[str, int]) -> bytes:
        """Serialized ``inputs`` map entries of the stream position; appended to a serialized request they merge
        into it (protobuf concatenation), so the rows are serialized once for all replicas."""
        req = tfs_pb2.PredictRequest()
        for k, v in _positions(positions, expected).items():
            req.inputs[k].CopyFrom(v)
        return bytes(req.SerializeToString())

    async def _write_replica(
        self, target: str, requests: list[tuple[str, bytes]], suffix: bytes, keys: list[str]
    ) -> dict[str, int]:
        """Send ``requests`` in order (the last with ``suffix``); the positions the replica stored before the last."""
        call = self._call(target)
        resp = None
        for i, (what, body) in enumerate(requests):
            try:
                resp = await call(
                    body + suffix if i == len(requests) - 1 else body,
                    timeout=self._deadline_s,
                    wait_for_ready=False,
                )
            except grpc.aio.AioRpcError as exc:
                raise error_from_grpc(exc, target=target, what=what) from exc
        if resp is None:
            return {}
        try:
            return _previous(resp, keys)
        except TensorError as exc:
            raise _malformed(exc, target=target, what=requests[-1][0]) from exc

    async def apply(
        self, group: WriteGroup, expected: Callable[[str], dict[str, int]] | None = None
    ) -> dict[str, dict[str, int]]:
        """Write ``group`` to every replica of its shard; return when all acknowledged, else raise ApplyError.

        ``expected(target)`` gives the ``stream_expected`` of each of ``group.positions`` for that replica (default
        -1: move the position unconditionally). Returns ``{target: {partition key: position before the write}}``."""
        if group.row_count == 0:
            return {}
        requests = self._requests(group)
        targets = self.replicas(group.key)
        suffixes = {
            t: self._position_suffix(group.positions, expected(t) if expected else {}) for t in targets
        }
        results = await asyncio.gather(
            *(self._write_replica(t, requests, suffixes[t], list(group.positions)) for t in targets),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if not isinstance(err, ApplyError):
                raise err
        if errors:
            # a retriable failure wins over a rejection: the group is retried, not dead-lettered
            retriable = [e for e in errors if isinstance(e, ApplyError) and e.retriable]
            raise (retriable or errors)[0]
        return {t: r for t, r in zip(targets, results, strict=True) if isinstance(r, dict)}

    async def write_replica(self, target: str, group: WriteGroup, expected: dict[str, int]) -> dict[str, int]:
        """Write ``group`` (rows and/or position) to the one replica at ``target``; the positions it had before."""
        return await self._write_replica(
            target,
            self._requests(group),
            self._position_suffix(group.positions, expected),
            list(group.positions),
        )

    async def stream_position(self, replica: Replica) -> dict[str, dict[str, int]]:
        """``{table: {"<topic>:<partition>": next offset}}`` as the replica's ``stream_position`` reports it."""
        name = self._models[replica.model].served_ps_name(replica.shard)
        req = tfs_pb2.PredictRequest(
            model_spec=tfs_pb2.ModelSpec(name=name, signature_name=STREAM_POSITION_SIGNATURE)
        )
        try:
            resp = await self._call(replica.target)(
                req.SerializeToString(), timeout=self._deadline_s, wait_for_ready=False
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_grpc(exc, target=replica.target, what=f"stream_position on {name}") from exc
        out: dict[str, dict[str, int]] = {}
        tables = {
            name[: -len("_stream_partitions")] for name in resp.outputs if name.endswith("_stream_partitions")
        }
        for t in tables:
            keys = [k.decode() for k in resp.outputs[stream_partitions_output(t)].string_val]
            try:
                offsets = _int64s(resp.outputs[stream_offsets_output(t)])
            except TensorError as exc:
                raise _malformed(exc, target=replica.target, what=f"stream_position on {name}") from exc
            out[t] = dict(zip(keys, offsets, strict=True))
        return out

    async def close(self) -> None:
        channels, self._channels, self._calls = self._channels, {}, {}
        for ch in channels.values():
            await ch.close()
