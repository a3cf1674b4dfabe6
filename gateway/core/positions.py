"""Which PS replicas are catching up with the Kafka stream, from the ``stream_position`` each one reports.

Every PS table reports, per ``"<topic>:<partition>"`` key, the next Kafka offset it has not applied (its *position*;
see :mod:`schemas.manifest`). A replica that restarted, or loaded a new version, serves its snapshot: its positions go
back until the updater has replayed it. :class:`PositionTracker` asks every replica of an embedding model's shards
for its ``stream_position`` every ``grpc.position_poll_s`` seconds; per shard a :class:`ShardPositions` decides.

**The rule** (docs/reliability.md, "Which replicas are catching up"). A table's position only moves when the updater
writes that table, and never back (the PS keeps the maximum), so the positions of two healthy replicas differ as a
matter of course: a replica replayed by the updater gets a position for every table at the end of its replay (also
for tables the stream never wrote), its peer only for the tables it was written; a replay's batches end elsewhere than
the live loop's. Positions of different replicas are therefore **not compared** to decide that one is behind: a
replica that never wrote a table is not behind because a peer recorded a position for it. What is compared is each
replica with **its own past**:

* a replica is *catching up* from the poll where one of its positions (table, key) is below the highest that replica
  itself reported before (it lost writes: a restart, another version, an older export);
* at that poll it gets a **target**: the shard's high-water marks as of the polls *before* it (the highest position
  any replica of the shard had reported for each (table, key); both replicas' and the writes made during an outage
  included). Every such position was reached before the replica came back, so the updater's replay, which runs to
  where its live loop is when the replay ends (``updater/catchup.py``) and then sets every table there, reaches
  the target;
* it is caught up again once every one of its positions reaches its target (and it is judged by its own past again).

So a replica that never lost writes is never flagged, and a healed one is flagged only until its replay is done, even
if the stream never writes some tables again. A table that reports no position at all (a restart from an export without
a stream cut; -1 values count as none) is compared as -1. A table that reports some keys but not a given one is not
compared on that key (e.g. a partition of a topic its export did not cover); nor is a table missing from the answer
(another version without it). Unknown is not behind: a replica whose ``stream_position`` call fails in transport
(UNAVAILABLE, deadline) keeps what the previous poll found; one that answers without positions (no such signature,
any other error) is not catching up while it answers so, but keeps its target: when it reports positions again it is
caught up only once they reach it (its own past was reset when it went back, so without the target it would never be
flagged again).

The flags go to the shard's :class:`~gateway.backends.client.ReplicaSet`, which reads from caught-up replicas first
and counts the reads a catching-up replica answered (``stale_reads``); :func:`mark_stale` turns those into the
degraded reason ``replica_catching_up`` of an answer, so an answer served by a caught-up replica is never marked.

Versions: the poll asks each replica's latest version, the one the updater writes to. Positions are offsets of the
one stream, compared across versions, so a replica that loaded a new version whose export holds an older stream cut
(or none) is catching up until replayed. Requests pinned to another version are routed by the same flags.

What a gateway cannot see: before its second poll nothing is known (the first one only sets the marks); a replica
that regressed before the gateway started (or was first polled already behind) is not flagged, since there is no past
of its own to compare with; a replica that comes back within one poll interval of going down may answer from its
snapshot until the next poll. If the updater itself restarts behind what the replicas already hold (uncommitted
writes) while a replica is being replayed, that replica may stay flagged until the stream writes each of its tables
again. Marks are never forgotten while the gateway runs (a topic recreated with lower offsets needs a gateway
restart). Task-safe within one event loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.backends.client import ReplicaSet
from gateway.codec.numeric import numeric_ndarray
from gateway.codec.tensor import to_ndarray
from gateway.errors import Cancelled, DeadlineExceeded, GatewayError, ResourceExhausted, Unavailable
from schemas.manifest import STREAM_POSITION_SIGNATURE
from schemas.proto import tfs_pb2

__all__ = [
    "DEGRADED_REPLICA_CATCHING_UP",
    "NoPositions",
    "PositionTracker",
    "Positions",
    "ShardPositions",
    "join_reasons",
    "mark_stale",
    "parse_positions",
    "stale_reads",
]

log = logging.getLogger("embedgate.gateway.positions")

DEGRADED_REPLICA_CATCHING_UP = "replica_catching_up"
"""Degraded reason: a PS lookup of the answer was served by a replica catching up (no caught-up replica could)."""

Positions = Mapping[str, Mapping[str, int]]
"""One replica's ``stream_position``: table -> ``"<topic>:<partition>"`` -> next offset not applied."""

_PARTITIONS_SUFFIX = "_stream_partitions"
_OFFSETS_SUFFIX = "_stream_offsets"


class NoPositions(enum.Enum):
    """A poll of one replica that gave no positions."""

    NO_ANSWER = "no_answer"  # the call failed in transport: what the previous poll found stays
    UNKNOWN = "unknown"  # answered without positions (no signature, other errors): not a sign of being behind


Report = Positions | NoPositions


Marks = dict[tuple[str, str], int]
"""(table, ``"<topic>:<partition>"``) -> a position."""


def _behind(report: Positions, marks: Mapping[tuple[str, str], int]) -> tuple[str, str, int, int] | None:
    """The first (table, key, position, mark) where ``report`` is below ``marks``; None when it is not."""
    known = {t: {k: v for k, v in keys.items() if v >= 0} for t, keys in report.items()}
    for (table, key), mark in marks.items():
        if table not in known:
            continue  # the table is not in this replica's version: nothing to compare
        if known[table] and key not in known[table]:
            continue  # it reports other partitions, not this one: unknown
        pos = known[table].get(key, -1)
        if pos < mark:
            return table, key, pos, mark
    return None


def _raise_marks(marks: Marks, report: Positions) -> None:
    for table, keys in report.items():
        for key, pos in keys.items():
            if pos > marks.get((table, key), -1):
                marks[(table, key)] = pos


class ShardPositions:
    """Which of one shard's ``replicas`` are catching up, by the rule of the module doc (pure, no I/O).

    ``own[i]``: the highest positions replica ``i`` reported (since it last went back); ``marks``: the shard's (every
    replica's) highest;
    ``targets[i]``: what a catching-up replica must reach (None: it is not catching up); ``lag[i]``: why it is behind,
    (table, key, position, target); ``last[i]``: its report in the latest poll."""

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError("a shard has at least one replica")
        self.marks: Marks = {}
        self.own: list[Marks] = [{} for _ in range(replicas)]
        self.targets: list[Marks | None] = [None] * replicas
        self.catching_up = [False] * replicas
        self.lag: list[tuple[str, str, int, int] | None] = [None] * replicas
        self.last: list[Report | None] = [None] * replicas  # each replica's report in the latest poll

    def observe(self, reports: Sequence[Report]) -> list[bool]:
        """One poll: ``reports[i]`` from replica ``i``. Returns (and keeps) the catching-up flag of each replica."""
        if len(reports) != len(self.catching_up):
            raise ValueError(f"{len(reports)} reports for {len(self.catching_up)} replicas")
        before = dict(self.marks)  # the shard's marks as of the previous polls
        self.last = list(reports)
        for i, report in enumerate(reports):
            if report is NoPositions.NO_ANSWER:
                continue
            if report is NoPositions.UNKNOWN:  # not flagged while it answers so; what it must reach is kept
                self.lag[i], self.catching_up[i] = None, False
                continue
            if _behind(report, self.own[i]) is not None:  # it lost writes (again): replayed up to the marks
                self.targets[i] = dict(before)
                self.own[i] = {}  # its past starts again from what it holds now (a replay only moves forward)
            target = self.targets[i]
            self.lag[i] = None if target is None else _behind(report, target)
            if self.lag[i] is None:
                self.targets[i] = None
            self.catching_up[i] = self.lag[i] is not None
        for i, report in enumerate(reports):
            if not isinstance(report, NoPositions):
                _raise_marks(self.own[i], report)
                _raise_marks(self.marks, report)
        return list(self.catching_up)


def parse_positions(resp: tfs_pb2.PredictResponse) -> dict[str, dict[str, int]]:
    """``{table: {key: offset}}`` from a ``stream_position`` answer (``<t>_stream_partitions``/``_offsets``)."""
    out: dict[str, dict[str, int]] = {}
    for name, tensor in resp.outputs.items():
        if not name.endswith(_PARTITIONS_SUFFIX):
            continue
        table = name[: -len(_PARTITIONS_SUFFIX)]
        offsets = resp.outputs.get(table + _OFFSETS_SUFFIX)
        if offsets is None:
            continue
        keys = [k.decode(errors="replace") if isinstance(k, bytes) else str(k) for k in _flat(tensor)]
        values = [int(v) for v in _flat(offsets)]
        out[table] = dict(zip(keys, values, strict=False))
    return out


def _flat(t: tfs_pb2.TensorProto) -> list[Any]:
    """``t``'s values in order: offsets through the hot path's numeric fast path
    (:func:`~gateway.codec.numeric.numeric_ndarray`), keys straight from ``string_val`` when it holds one value per
    element (how serve-local and TF Serving write positions), anything else through the generic decoder (which also
    knows a single value filling the shape)."""
    fast = numeric_ndarray(t)
    if fast is not None:
        return fast.ravel().tolist()
    shape = t.tensor_shape
    strings = t.dtype == tfs_pb2.DataType.DT_STRING and not shape.unknown_rank
    if strings and len(t.string_val) == math.prod(d.size for d in shape.dim):
        return list(t.string_val)
    return to_ndarray(t).ravel().tolist()


_TRANSIENT = (Unavailable, DeadlineExceeded, ResourceExhausted, Cancelled)


class PositionTracker:
    """Polls ``stream_position`` on every replica of one embedding model's shards (``shards[i]`` = (served PS name,
    replica set)) and sets each set's catching-up flags; ``observe(model, shard, n)`` is told how many replicas of
    each shard are catching up after every poll."""

    def __init__(
        self,
        model: str,
        shards: Sequence[tuple[str, ReplicaSet]],
        observe: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.model = model
        self._shards = list(shards)
        self._observe = observe
        self.state = [ShardPositions(len(rs.clients)) for _, rs in self._shards]
        self.polls = 0  # completed polls

    async def _report(self, rs: ReplicaSet, i: int, served: str, deadline: float) -> Report:
        req = tfs_pb2.PredictRequest(
            model_spec=tfs_pb2.ModelSpec(name=served, signature_name=STREAM_POSITION_SIGNATURE)
        )
        try:
            return parse_positions(await rs.clients[i].stream_position(req, deadline))
        except _TRANSIENT:
            return NoPositions.NO_ANSWER
        except GatewayError as exc:
            log.debug("no stream position", extra={"model": self.model, "served": served, "error": str(exc)})
            return NoPositions.UNKNOWN

    async def poll(self, deadline: float) -> None:
        """Ask every replica at once (each call bounded by ``deadline``), then update flags, marks and the gauge."""
        calls = [
            [self._report(rs, i, served, deadline) for i in range(len(rs.clients))]
            for served, rs in self._shards
        ]
        flat = await asyncio.gather(*(c for shard in calls for c in shard))
        at = 0
        for shard, ((_, rs), state) in enumerate(zip(self._shards, self.state, strict=True)):
            n = len(rs.clients)
            before = list(state.catching_up)
            flags = state.observe(flat[at : at + n])
            at += n
            rs.set_catching_up(flags)
            for i, (was, now) in enumerate(zip(before, flags, strict=True)):
                if now and not was:
                    table, key, pos, mark = state.lag[i] or ("", "", -1, -1)
                    log.warning(
                        "PS replica catching up (its stream position went back): lookups go to caught-up "
                        "replicas while there is one",
                        extra={
                            "model": self.model,
                            "shard": shard,
                            "target": rs.clients[i].target,
                            "table": table,
                            "partition": key,
                            "position": pos,
                            "high_water_mark": mark,
                        },
                    )
                elif was and not now:
                    log.info(
                        "PS replica caught up",
                        extra={"model": self.model, "shard": shard, "target": rs.clients[i].target},
                    )
            if self._observe is not None:
                self._observe(self.model, shard, sum(flags))
        self.polls += 1

    def status(self) -> dict[str, dict[str, int]]:
        """Per shard (``"0"``, ``"1"``, ...): replicas and how many are catching up (no addresses)."""
        return {
            str(shard): {"replicas": len(state.catching_up), "catching_up": sum(state.catching_up)}
            for shard, state in enumerate(self.state)
        }


def stale_reads(shards: Sequence[ReplicaSet]) -> int:
    """The reads answered by a catching-up replica so far, over ``shards`` (compare before and after a request)."""
    return sum(rs.stale_reads for rs in shards)


def join_reasons(*reasons: str | None) -> str | None:
    """The degraded reasons that apply, comma-separated in the given order; None when none does."""
    got = [r for r in reasons if r]
    return ",".join(got) if got else None


def mark_stale(reason: str | None, shards: Sequence[ReplicaSet], before: int) -> str | None:
    """``reason`` plus ``replica_catching_up`` when a catching-up replica answered a read since ``stale_reads`` was
    ``before`` (a concurrent request's such read marks this one too: never unmarked, at worst marked once more)."""
    if stale_reads(shards) == before:
        return reason
    return join_reasons(reason, DEGRADED_REPLICA_CATCHING_UP)
