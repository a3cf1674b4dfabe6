"""updater.scheduler: the retry backoff is capped, exponential and jittered; ApplyScheduler decides what is due
with a clock the test advances."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka import TopicPartition

from schemas.updater_settings import RetrySettings
from tests.updater.fakes import FakeClock, FakeRecord
from updater.apply import GroupKey
from updater.batch import GroupBuffer
from updater.scheduler import ApplyScheduler, backoff_s


def test_backoff_doubles_from_min_to_max_with_bounded_jitter() -> None:
    retry = RetrySettings(min_backoff_ms=100, max_backoff_ms=1000)
    assert [backoff_s(a, retry, lambda: 0.5) for a in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff_s(1, retry, lambda: 0.0) == pytest.approx(0.075)
    assert backoff_s(100, retry, lambda: 0.999999) == pytest.approx(1.25, rel=1e-5)


def test_retries_back_off_instead_of_spinning() -> None:
    """However the jitter falls, ten failures in a row take at least 0.75 * (0.1+0.2+0.4+0.8+6*1.0) s: an outage of
    a few seconds costs a bounded number of write attempts."""
    retry = RetrySettings(min_backoff_ms=100, max_backoff_ms=1000)
    for rand in (lambda: 0.0, lambda: 0.5, lambda: 0.99):
        assert sum(backoff_s(a, retry, rand) for a in range(1, 11)) >= 0.75 * 7.5 - 1e-9


def test_attempts_start_at_one() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        backoff_s(0, RetrySettings())


# -- ApplyScheduler: an injected clock decides what is due --------------------------------------------------------
def _buf(shard: int, offsets: list[int], *, rows: int = 1, table: str = "item") -> GroupBuffer:
    buf = GroupBuffer(key=GroupKey("m", shard, table), dim=1)
    for off in offsets:
        ids = np.arange(off * rows, off * rows + rows, dtype=np.int64)
        buf.add(ids, np.zeros((rows, 1), np.float32), 1, FakeRecord("t", shard, off, None, b""))
    return buf


def _scheduler(clock: FakeClock, max_pending_rows: int = 100) -> ApplyScheduler:
    retry = RetrySettings(min_backoff_ms=1000, max_backoff_ms=4000)
    return ApplyScheduler(retry, max_pending_rows=max_pending_rows, clock=clock, rand=lambda: 0.5)


def test_one_write_per_key_in_flight_newer_rows_wait_behind_it() -> None:
    clock = FakeClock()
    s = _scheduler(clock)
    first = _buf(0, [0])
    s.add(first)
    s.add(_buf(1, [0]))
    assert {b.key.shard for b in s.take_due()} == {0, 1}
    s.add(_buf(0, [1]))
    s.add(_buf(0, [2]))
    assert s.take_due() == [], "a second write of key 0 while one is in flight"
    # per group and partition the lowest offset still unacknowledged
    assert sorted((tp.partition, off) for tp, off in s.waiting_offsets()) == [(0, 0), (0, 1), (1, 0)]
    assert s.succeeded(first)
    [second] = s.take_due()
    assert [r.offset for r in second.records] == [1, 2], "rows read meanwhile go in one write, in order"


def test_a_failed_group_waits_for_the_backoff_in_front_of_newer_rows() -> None:
    clock = FakeClock()
    s = _scheduler(clock)
    s.add(_buf(0, [0]))
    [buf] = s.take_due()
    s.add(_buf(0, [1]))
    assert s.failed(buf) == 1.0
    assert list(s.waiting_offsets()) == [(TopicPartition("t", 0), 0)], (
        "the newer rows' offsets hide the failed ones"
    )
    assert s.next_due() == clock.now + 1.0
    assert s.held_partitions() == {TopicPartition("t", 0)}
    clock.advance(0.99)
    assert s.take_due() == []
    clock.advance(0.02)
    [retry] = s.take_due()
    assert [r.offset for r in retry.records] == [0, 1] and retry.attempts == 1
    assert s.failed(retry) == 2.0, "the backoff doubles"
    clock.advance(2.01)
    [again] = s.take_due()
    assert s.succeeded(again)
    assert s.held_partitions() == set() and list(s.waiting_offsets()) == []


def test_reset_drops_pending_and_ignores_stale_writes_but_keeps_their_keys_busy() -> None:
    clock = FakeClock()
    s = _scheduler(clock)
    s.add(_buf(0, [0]))
    [old] = s.take_due()
    s.reset()
    assert list(s.waiting_offsets()) == [], "a stale write still holds back commits"
    s.add(_buf(0, [0]))
    assert s.take_due() == [], "a new write overtook the stale one of its key"
    assert not s.succeeded(old), "a stale write reported as current"
    assert len(s.take_due()) == 1
    with pytest.raises(RuntimeError, match="not in flight"):
        s.succeeded(old)


def test_full_counts_rows_waiting_behind_writes_in_flight_only() -> None:
    clock = FakeClock()
    s = _scheduler(clock, max_pending_rows=10)
    s.add(_buf(0, [0], rows=4))
    [w] = s.take_due()
    s.add(_buf(0, [1], rows=6))
    assert not s.full()
    s.add(_buf(0, [2], rows=4))
    assert s.full()
    s.succeeded(w)
    [behind] = s.take_due()
    assert not s.full()
    s.failed(behind)  # waiting for its backoff: its partition is paused, it does not stop fetching
    assert not s.full()
