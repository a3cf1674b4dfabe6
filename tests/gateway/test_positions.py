"""Units of the read side of replica catch-up (gateway.core.positions, ReplicaSet's preference) with fake replicas.

The served path (real serve-local replicas restarted behind a gateway) is tests/gateway/test_positions_served.py.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from gateway.backends.client import ReplicaSet
from gateway.codec.tensor import from_ndarray
from gateway.core.positions import (
    DEGRADED_REPLICA_CATCHING_UP,
    NoPositions,
    PositionTracker,
    ShardPositions,
    join_reasons,
    mark_stale,
    parse_positions,
)
from gateway.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from schemas.gateway_settings import GatewaySettings
from schemas.manifest import STREAM_POSITION_SIGNATURE
from schemas.proto import tfs_pb2

K = "deltas:0"


def _at(pos: int, table: str = "t", key: str = K) -> dict[str, dict[str, int]]:
    return {table: {key: pos}}


# ---- ShardPositions: the high-water marks and the catching-up rule -----------------------------------------------


def test_a_replica_whose_positions_go_back_is_catching_up_until_it_reaches_the_marks_before() -> None:
    s = ShardPositions(2)
    assert s.observe([_at(100), _at(100)]) == [False, False]  # first poll: sets the marks only
    # B restarted from an export without a stream cut: below its own past
    assert s.observe([_at(120), {"t": {}}]) == [False, True]
    assert s.lag[1] == ("t", K, -1, 100)
    assert s.targets[1] == {("t", K): 100}  # the shard's marks of the polls before B came back
    assert s.observe([_at(130), _at(90)]) == [False, True]  # replaying
    assert s.observe([_at(135), _at(100)]) == [False, False]  # reached its target
    assert s.targets[1] is None and s.marks == {("t", K): 135}


def test_a_replica_that_goes_back_again_during_its_replay_gets_a_new_target() -> None:
    s = ShardPositions(2)
    s.observe([_at(100), _at(100)])
    assert s.observe([_at(120), {"t": {}}]) == [False, True]
    assert s.observe([_at(130), _at(60)]) == [False, True]  # replaying: not a new loss
    assert s.targets[1] == {("t", K): 100}
    assert s.observe([_at(140), {"t": {}}]) == [False, True]  # restarted again mid-replay
    assert s.targets[1] == {("t", K): 130}
    assert s.observe([_at(150), _at(120)]) == [False, True]
    assert s.observe([_at(150), _at(130)]) == [False, False]


def test_a_peer_with_positions_for_tables_it_never_wrote_never_flags_the_other() -> None:
    """Issue 21: B was replayed by the updater (which sets every table's position, and ends its batches elsewhere than
    the live loop); A, never restarted, has no position for the table the stream never wrote and an older one for the
    table it did. A is not behind: it is never flagged, however long this lasts."""
    s = ShardPositions(2)
    both = {"item": {K: 100}, "user": {}}
    assert s.observe([both, both]) == [False, False]
    assert s.observe([both, {"item": {}, "user": {}}]) == [False, True]  # B restarted
    for _ in range(5):
        assert s.observe([{"item": {K: 125}, "user": {}}, {"item": {K: 140}, "user": {K: 140}}]) == [
            False,
            False,
        ]
    assert s.lag == [None, None]


def test_a_healed_replica_is_not_held_by_positions_its_peer_reached_during_its_replay() -> None:
    """Live writes during B's replay reach B's rows but move only A's positions; after the replay (to 115, where the
    live loop was when it started) B lacks nothing, and no later write of that table may come."""
    s = ShardPositions(2)
    s.observe([_at(100), _at(100)])
    assert s.observe([_at(110), NoPositions.NO_ANSWER]) == [
        False,
        False,
    ]  # B down: the outage's writes reach A
    assert s.observe([_at(112), {"t": {}}]) == [False, True]  # B back from its export
    assert s.targets[1] == {("t", K): 110}
    for _ in range(5):
        assert s.observe([_at(130), _at(115)]) == [False, False]


def test_writes_reaching_replicas_a_moment_apart_do_not_flag_the_later_one() -> None:
    s = ShardPositions(2)
    s.observe([_at(100), _at(100)])
    # the updater wrote A, the poll ran, then B: B is below the mark of this poll but not of the previous one
    assert s.observe([_at(110), _at(100)]) == [False, False]
    assert s.observe([_at(120), _at(110)]) == [False, False]
    assert s.observe([_at(120), _at(120)]) == [False, False]


def test_the_only_replica_that_regresses_is_noticed_because_marks_are_kept() -> None:
    s = ShardPositions(1)
    s.observe([_at(100)])
    assert s.observe([_at(40)]) == [True]  # an export whose stream cut is older
    assert s.observe([_at(40)]) == [True]  # marks are never lowered
    assert s.observe([_at(100)]) == [False]


def test_no_position_at_all_counts_as_minus_one_and_minus_one_counts_as_none() -> None:
    s = ShardPositions(1)
    s.observe([_at(5)])
    assert s.observe([{"t": {K: -1}}]) == [True]  # a live write into a table without position stores -1
    assert s.observe([{"t": {}}]) == [True]


def test_unknown_positions_do_not_flag_a_replica() -> None:
    s = ShardPositions(2)
    s.observe([{"t": {K: 10, "other:0": 7}}, {"t": {K: 10}}])
    # B never reported "other:0" but reports K: "other:0" is not compared (an export cut without that partition)
    assert s.observe([{"t": {K: 10, "other:0": 7}}, {"t": {K: 10}}]) == [False, False]
    # a table missing from the answer (another version without it) is not compared
    assert s.observe([{"t": {K: 10}}, {"u": {}}]) == [False, False]
    # an answer without positions (no signature, a non-transport error) is not a sign of being behind
    s.observe([_at(50), _at(50)])
    assert s.observe([_at(50), _at(0)]) == [False, True]
    assert s.observe([_at(50), NoPositions.UNKNOWN]) == [False, False]


def test_an_answer_without_positions_does_not_forget_that_a_replica_lost_writes() -> None:
    s = ShardPositions(2)
    s.observe([_at(50), _at(50)])
    assert s.observe([_at(50), _at(0)]) == [False, True]
    assert s.observe([_at(50), NoPositions.UNKNOWN]) == [False, False]  # e.g. its model is loading again
    assert s.observe([_at(50), _at(0)]) == [False, True]  # still short of the marks it had to reach
    assert s.observe([_at(60), _at(50)]) == [False, False]  # replayed up to them: caught up


def test_a_replica_that_does_not_answer_keeps_what_the_last_poll_found() -> None:
    s = ShardPositions(2)
    s.observe([_at(50), _at(50)])
    assert s.observe([_at(50), _at(0)]) == [False, True]
    assert s.observe([_at(50), NoPositions.NO_ANSWER]) == [False, True]
    assert s.observe([NoPositions.NO_ANSWER, _at(50)]) == [False, False]


def test_a_replica_first_seen_behind_has_no_past_to_be_behind_of() -> None:
    s = ShardPositions(2)
    assert s.observe([_at(100), _at(50)]) == [False, False]  # no history: the first poll only sets marks
    assert s.observe([_at(100), _at(50)]) == [False, False]  # positions of two replicas are not compared
    assert s.observe([_at(100), _at(20)]) == [
        False,
        True,
    ]  # once it goes back, it must reach the shard's marks
    assert s.targets[1] == {("t", K): 100}
    assert s.observe([_at(100), _at(60)]) == [False, True]
    assert s.observe([_at(100), _at(100)]) == [False, False]
    every = ShardPositions(2)  # every replica regressed before the gateway started: nothing to compare with
    assert every.observe([_at(50), _at(50)]) == [False, False]
    assert every.observe([_at(50), _at(50)]) == [False, False]


def test_tables_and_partitions_have_separate_marks() -> None:
    s = ShardPositions(2)
    s.observe([{"a": {K: 10}, "b": {K: 3}}, {"a": {K: 10}, "b": {K: 3}}])
    assert s.observe([{"a": {K: 10}, "b": {K: 3}}, {"a": {K: 10}, "b": {K: 2}}]) == [False, True]
    with pytest.raises(ValueError, match="1 reports for 2 replicas"):
        s.observe([{}])


# ---- ReplicaSet: caught-up replicas first, never a refusal ----------------------------------------------------------


class _Replica:
    def __init__(self, name: str, answer: Any = None) -> None:
        self.target = name
        self.answer = answer
        self.calls: list[str] = []

    async def predict(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        self.calls.append("predict")
        if isinstance(self.answer, Exception):
            raise self.answer
        return tfs_pb2.PredictResponse(model_spec=tfs_pb2.ModelSpec(name=self.target))

    async def stream_position(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        assert req.model_spec.signature_name == STREAM_POSITION_SIGNATURE
        assert not req.model_spec.HasField("version")  # the replica's latest: the version the updater writes
        self.calls.append(req.model_spec.name)
        if isinstance(self.answer, Exception):
            raise self.answer
        resp = tfs_pb2.PredictResponse()
        for table, keys in (self.answer or {}).items():
            resp.outputs[f"{table}_stream_partitions"].CopyFrom(
                from_ndarray(np.array([k.encode() for k in keys], dtype=object))
            )
            resp.outputs[f"{table}_stream_offsets"].CopyFrom(
                from_ndarray(np.array(list(keys.values()), dtype=np.int64))
            )
        return resp


def _set(*replicas: _Replica) -> ReplicaSet:
    return ReplicaSet(list(replicas), retry_s=60.0)  # type: ignore[arg-type]


async def _served_by(rs: ReplicaSet, n: int) -> list[str]:
    out = []
    for _ in range(n):
        resp = await rs.predict(tfs_pb2.PredictRequest(), time.monotonic() + 10)
        out.append(resp.model_spec.name)
    return out


async def test_replica_set_reads_caught_up_replicas_first_round_robin() -> None:
    rs = _set(_Replica("a"), _Replica("b"), _Replica("c"))
    assert sorted(await _served_by(rs, 3)) == ["a", "b", "c"]
    rs.set_catching_up([False, True, False])
    assert sorted(await _served_by(rs, 4)) == ["a", "a", "c", "c"]
    assert rs.stale_reads == 0
    rs.set_catching_up([False, False, False])
    assert sorted(await _served_by(rs, 3)) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="2 flags for 3 replicas"):
        rs.set_catching_up([True, True])


async def test_replica_set_serves_from_catching_up_replicas_rather_than_fail_and_counts_it() -> None:
    a, b = _Replica("a"), _Replica("b")
    rs = _set(a, b)
    rs.set_catching_up([True, True])
    assert sorted(await _served_by(rs, 2)) == ["a", "b"]
    assert rs.stale_reads == 2
    # the caught-up replica is down: the catching-up one answers (before the down one is tried again)
    rs.set_catching_up([False, True])
    a.answer, a.calls = Unavailable("a is down"), []
    assert await _served_by(rs, 2) == ["b", "b"]
    assert a.calls == ["predict"]  # tried once, then tried last
    assert rs.stale_reads == 4
    # every replica down: the error of the last one tried
    b.answer = Unavailable("b is down")
    with pytest.raises(Unavailable):
        await _served_by(rs, 1)


# ---- PositionTracker: polls, flags, the gauge ----------------------------------------------------------------------


async def test_tracker_flags_replicas_and_reports_counts_per_shard() -> None:
    a0, b0, a1 = _Replica("a0", _at(100)), _Replica("b0", _at(100)), _Replica("a1", _at(7))
    s0, s1 = _set(a0, b0), _set(a1)
    seen: list[tuple[str, int, int]] = []
    tracker = PositionTracker("m", [("m_ps_0", s0), ("m_ps_1", s1)], lambda *a: seen.append(a))
    deadline = time.monotonic() + 10
    await tracker.poll(deadline)
    assert seen == [("m", 0, 0), ("m", 1, 0)] and tracker.polls == 1
    assert a0.calls == ["m_ps_0"] and a1.calls == ["m_ps_1"]
    b0.answer = {"t": {}}  # restarted
    a1.answer = _at(3)
    await tracker.poll(deadline)
    assert seen[-2:] == [("m", 0, 1), ("m", 1, 1)]
    assert s0.catching_up == [False, True] and s1.catching_up == [True]
    assert tracker.status() == {
        "0": {"replicas": 2, "catching_up": 1},
        "1": {"replicas": 1, "catching_up": 1},
    }
    b0.answer = _at(100)
    a1.answer = _at(8)
    await tracker.poll(deadline)
    assert s0.catching_up == [False, False] and s1.catching_up == [False]
    assert seen[-2:] == [("m", 0, 0), ("m", 1, 0)]


async def test_tracker_transport_failures_keep_flags_other_errors_clear_them() -> None:
    a, b = _Replica("a", _at(10)), _Replica("b", _at(10))
    rs = _set(a, b)
    tracker = PositionTracker("m", [("m_ps_0", rs)])
    deadline = time.monotonic() + 10
    await tracker.poll(deadline)
    b.answer = _at(1)
    await tracker.poll(deadline)
    assert rs.catching_up == [False, True]
    b.answer = Unavailable("restarting")
    await tracker.poll(deadline)
    assert rs.catching_up == [False, True]
    assert await _served_by(rs, 2) == ["a", "a"]
    a.answer = DeadlineExceeded("slow")
    b.answer = _at(10)
    await tracker.poll(deadline)
    assert rs.catching_up == [False, False]
    b.answer = _at(1)
    await tracker.poll(deadline)
    assert rs.catching_up == [False, True]
    for err in (NotFound("no stream_position signature"), InvalidArgument("bad")):
        b.answer = err
        await tracker.poll(deadline)
        assert rs.catching_up == [False, False], err


def test_parse_positions_reads_every_table() -> None:
    resp = tfs_pb2.PredictResponse()
    resp.outputs["item_stream_partitions"].CopyFrom(from_ndarray(np.array([b"d:0", b"d:1"], dtype=object)))
    resp.outputs["item_stream_offsets"].CopyFrom(from_ndarray(np.array([4, 9], dtype=np.int64)))
    resp.outputs["user_stream_partitions"].CopyFrom(from_ndarray(np.array([], dtype=object)))
    resp.outputs["user_stream_offsets"].CopyFrom(from_ndarray(np.array([], dtype=np.int64)))
    resp.outputs["lonely_stream_partitions"].CopyFrom(from_ndarray(np.array([b"d:0"], dtype=object)))
    assert parse_positions(resp) == {"item": {"d:0": 4, "d:1": 9}, "user": {}}


def test_parse_positions_reads_every_encoding_of_the_values() -> None:
    """Offsets in ``tensor_content``, in ``int64_val``, and one ``int64_val`` filling the shape (TF's rule) read
    alike; keys in ``string_val``."""
    keys = from_ndarray(np.array([b"d:0", b"d:1"], dtype=object))
    shape = tfs_pb2.TensorShapeProto(dim=[tfs_pb2.TensorShapeProto.Dim(size=2)])
    forms = {
        "content": from_ndarray(np.array([4, -1], dtype=np.int64)),
        "values": tfs_pb2.TensorProto(dtype=tfs_pb2.DataType.DT_INT64, tensor_shape=shape, int64_val=[4, -1]),
        "filled": tfs_pb2.TensorProto(dtype=tfs_pb2.DataType.DT_INT64, tensor_shape=shape, int64_val=[7]),
    }
    resp = tfs_pb2.PredictResponse()
    for name, offsets in forms.items():
        resp.outputs[f"{name}_stream_partitions"].CopyFrom(keys)
        resp.outputs[f"{name}_stream_offsets"].CopyFrom(offsets)
    assert parse_positions(resp) == {
        "content": {"d:0": 4, "d:1": -1},
        "values": {"d:0": 4, "d:1": -1},
        "filled": {"d:0": 7, "d:1": 7},
    }


# ---- degraded reasons and the setting ------------------------------------------------------------------------------


def test_mark_stale_adds_the_reason_only_when_a_stale_read_happened() -> None:
    rs = _set(_Replica("a"))
    before = rs.stale_reads
    assert mark_stale(None, [rs], before) is None
    assert mark_stale("version_fallback", [rs], before) == "version_fallback"
    rs.stale_reads += 1
    assert mark_stale(None, [rs], before) == DEGRADED_REPLICA_CATCHING_UP
    assert mark_stale("version_fallback", [rs], before) == "version_fallback,replica_catching_up"
    assert join_reasons(None, None) is None


def test_position_poll_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    models = [{"kind": "passthrough", "name": "m", "target": "h:1"}]
    assert GatewaySettings(models=models).grpc.position_poll_s == 1.0
    assert GatewaySettings(models=models, grpc={"position_poll_s": 0}).grpc.position_poll_s == 0
    with pytest.raises(ValueError, match="position_poll_s"):
        GatewaySettings(models=models, grpc={"position_poll_s": -1})
    monkeypatch.setenv("EMBEDGATE_GRPC__POSITION_POLL_S", "0.25")
    assert GatewaySettings(models=models).grpc.position_poll_s == 0.25


def test_an_answer_with_two_reasons_is_counted_once_under_each() -> None:
    from gateway.lifespan import InFlightLimiter, Runtime
    from gateway.metrics import Metrics

    settings = GatewaySettings(models=[{"kind": "passthrough", "name": "m", "target": "127.0.0.1:1"}])
    rt = Runtime(settings, {}, Metrics(), InFlightLimiter(2, 429, 1), model_names=frozenset({"m"}))
    with rt.track() as call:
        call.model, call.degraded = "m", join_reasons("version_fallback", DEGRADED_REPLICA_CATCHING_UP)
    with rt.track() as call:
        call.model, call.degraded = "m", DEGRADED_REPLICA_CATCHING_UP

    def count(reason: str) -> float:
        labels = {"model": "m", "reason": reason}
        return rt.metrics.registry.get_sample_value("embedgate_degraded_responses_total", labels) or 0.0

    assert (count("version_fallback"), count("replica_catching_up")) == (1, 2)
    assert count("version_fallback,replica_catching_up") == 0
