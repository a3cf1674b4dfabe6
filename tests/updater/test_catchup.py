"""updater.catchup.catch_up and CatchUpTasks with a fake replica (a PS that keeps rows and positions as the real one
does) and a fake group-less consumer: a replica that restarts again during its replay (found by a write, or by the
positions a round reads) is replayed up to where the live loop is by then, not only to where it was when the replay
started (the live rows it had received meanwhile were lost with it); a replay that ends with the live loop further on
is extended up to it, a bounded number of times; a replica found behind again as its catch-up ends is replayed again;
``embedgate_updater_replica_catchups_total`` counts each finding, not the extensions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from aiokafka import TopicPartition

import updater.catchup as catchup
from schemas.deltas import decode_delta
from schemas.manifest import stream_partition_key
from schemas.updater_settings import RetrySettings
from tests.updater.fakes import MANIFEST, TOPIC, delta_record, ids_of_shard
from updater.apply import WriteGroup
from updater.metrics import UpdaterMetrics
from updater.replicas import PositionBook, Replica

TP = TopicPartition(TOPIC, 0)
KEY = stream_partition_key(TOPIC, 0)
IDS = ids_of_shard(0, 10)
RECORDS = [delta_record(0, off, [IDS[off]], value=float(off)) for off in range(10)]  # record i: id IDS[i] = i


class _Consumer:
    """The partition holds RECORDS; reads from the position it is sought to."""

    def __init__(self) -> None:
        self.pos = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assign(self, tps: list[TopicPartition]) -> None:
        assert tps == [TP]

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.pos = 0

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset

    async def position(self, tp: TopicPartition) -> int:
        return self.pos

    async def getmany(
        self, tp: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, Any]:
        got = RECORDS[self.pos : self.pos + max_records]
        self.pos += len(got)
        return {tp: got}


class _Replica:
    """One PS replica: rows and per-table positions, moved only where the stored one is >= the expected one; it
    restarts (loses every row and position) right after its ``restart_after``-th write, and right before answering
    its ``restart_on_read``-th ``stream_position``."""

    def __init__(self, restart_after: int, restart_on_read: int = 0) -> None:
        self.rows: dict[int, float] = {}
        self.position: dict[str, int] = {}
        self.writes = self.reads = 0
        self.restart_after = restart_after
        self.restart_on_read = restart_on_read

    def restart(self) -> None:
        self.rows, self.position = {}, {}

    async def stream_position(self, replica: Replica) -> dict[str, dict[str, int]]:
        self.reads += 1
        if self.reads == self.restart_on_read:
            self.restart()
        return {t: ({KEY: p} if (p := self.position.get(t, -1)) >= 0 else {}) for t in ("item",)}

    async def write_replica(self, target: str, group: WriteGroup, expected: dict[str, int]) -> dict[str, int]:
        table = group.key.table
        before = self.position.get(table, -1)
        for i, v in zip(group.upsert_ids.tolist(), group.upsert_values[:, 0].tolist(), strict=True):
            self.rows[i] = v
        if before >= expected[KEY]:
            self.position[table] = max(before, group.positions[KEY])
        self.writes += 1
        if self.writes == self.restart_after:
            self.restart()
        return {KEY: before}


REPLICA = Replica("127.0.0.1:1", "unit", 0)


async def _catch_up(
    ps: _Replica,
    book: PositionBook,
    live_end: Callable[[], int],
    fell_back: Callable[[], None] | None = None,
) -> None:
    """Catch ``ps`` up from offset 5 (where the live loop was when the catch-up started), 3 records a batch."""
    await asyncio.wait_for(
        catchup.catch_up(
            replica=REPLICA,
            tp=TP,
            end=5,
            hint=-1,
            manifest=MANIFEST,
            writer=ps,  # type: ignore[arg-type]
            book=book,
            decode=lambda rec: decode_delta(rec.value),
            consumer_factory=_Consumer,  # type: ignore[arg-type]
            retry=RetrySettings(min_backoff_ms=1, max_backoff_ms=2),
            stop=asyncio.Event(),
            live_end=live_end,
            fell_back=fell_back,
        ),
        60,
    )


@pytest.mark.parametrize("restart_after", [0, 1])
async def test_a_replica_that_restarts_during_its_replay_is_replayed_up_to_where_the_live_loop_is(
    monkeypatch: pytest.MonkeyPatch, restart_after: int
) -> None:
    """The catch-up starts with the live loop at offset 5; the replica had received records 5..9 live (rows
    applied, position not moved). With ``restart_after`` 1 it restarts after the first replay batch, losing those:
    the next write finds it behind, and the replay starts again up to offset 10, where the live loop is by then.
    Without the restart the replay is extended to offset 10 too: the live writes moved no position."""
    monkeypatch.setattr(catchup, "_BATCH", 3)
    ps = _Replica(restart_after)
    ps.rows = {IDS[off]: float(off) for off in range(5, 10)}  # live writes it received during the replay
    book = PositionBook()
    await _catch_up(ps, book, live_end=lambda: 10)
    # with or without the restart, the replica's position ends where the live loop is: the live writes of 5..9
    # could not move it (the replica stored less than they expected), so the replay covers them too
    want_end = 10
    assert ps.rows == {IDS[off]: float(off) for off in range(10)}, "a row the replica lost was not replayed"
    assert ps.position == {"item": want_end}
    assert book.expected(REPLICA, "item", KEY) == want_end
    assert not book.catching_up(REPLICA, KEY)
    assert np.array_equal(sorted(ps.rows), sorted(IDS))


async def test_a_live_loop_that_never_pauses_extends_the_replay_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The live loop is one record further on each time the catch-up asks (5, then 6, 7, 8, 9): the replay is
    extended ``_MAX_EXTENSIONS`` times and hands the replica back at the last end, with every row up to it."""
    monkeypatch.setattr(catchup, "_BATCH", 3)
    ps = _Replica(restart_after=-1)
    book = PositionBook()
    ends = iter(range(6, 10))
    await _catch_up(ps, book, live_end=lambda: next(ends))
    last = 5 + catchup._MAX_EXTENSIONS
    assert ps.position == {"item": last}
    assert ps.rows == {IDS[off]: float(off) for off in range(last)}
    assert book.expected(REPLICA, "item", KEY) == last
    assert not book.catching_up(REPLICA, KEY)


async def test_a_replica_that_restarts_between_two_rounds_is_replayed_up_to_where_the_live_loop_is_by_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first round replays 0..4 (the replica holds the live rows 5 and 6); the live loop is at 7 then, so the
    replay is extended, the last time allowed here, up to 7. Before that round reads the replica's positions the live
    loop writes records 7..9 to it and it restarts, losing every row. Positions below where the first round left them
    are a fall-back like one a write finds: the replay starts over up to where the live loop is by then (10). Replaying
    only up to 7 would set the positions to 7 without the rows 7..9, which the live loop does not write again, and no
    check would find it (the replica would report the position it is believed to have)."""
    monkeypatch.setattr(catchup, "_BATCH", 3)
    monkeypatch.setattr(catchup, "_MAX_EXTENSIONS", 1)
    ps = _Replica(restart_after=-1, restart_on_read=2)
    ps.rows = {IDS[off]: float(off) for off in range(5, 7)}  # live writes it received during the first round
    book = PositionBook()
    ends = [7]  # where the live loop is when the first round ends; then 10
    fell_back: list[int] = []
    await _catch_up(
        ps, book, live_end=lambda: ends.pop(0) if ends else 10, fell_back=lambda: fell_back.append(ps.reads)
    )
    assert ps.rows == {IDS[off]: float(off) for off in range(10)}, "a row the replica lost was not replayed"
    assert ps.position == {"item": 10}
    assert book.expected(REPLICA, "item", KEY) == 10
    assert fell_back == [2], "the fall-back found by the second round's read is reported once"


class _Book(PositionBook):
    """A PositionBook that records every hand-back (:meth:`caught_up`) and, after the first, schedules ``then`` in
    the event loop: it runs in the same turn, before the catch-up task's done callbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_back: list[int] = []
        self.changed = asyncio.Event()
        self.then: Callable[[], None] | None = None

    def caught_up(self, replica: Replica, key: str, tables: list[str], position: int) -> None:
        super().caught_up(replica, key, tables, position)
        self.handed_back.append(position)
        self.changed.set()
        if self.then is not None:
            asyncio.get_running_loop().call_soon(self.then)
            self.then = None

    async def handed_back_times(self, n: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.handed_back) < n:
                self.changed.clear()
                await self.changed.wait()


def _tasks(ps: _Replica) -> tuple[catchup.CatchUpTasks, UpdaterMetrics]:
    metrics = UpdaterMetrics()
    tasks = catchup.CatchUpTasks(
        manifests={"unit": MANIFEST},
        writer=ps,  # type: ignore[arg-type]
        decode=lambda rec: decode_delta(rec.value),
        consumer_factory=_Consumer,  # type: ignore[arg-type]
        retry=RetrySettings(min_backoff_ms=1, max_backoff_ms=2),
        stop=asyncio.Event(),
        metrics=metrics,
    )
    return tasks, metrics


def _catchups(metrics: UpdaterMetrics) -> float:
    got = metrics.registry.get_sample_value(
        "embedgate_updater_replica_catchups_total", {"model": "unit", "shard": "0"}
    )
    return got or 0.0


def _found_behind(book: PositionBook, tasks: catchup.CatchUpTasks, previous: int, end: int) -> None:
    """What the live loop does with the answer of its write of the records up to ``end`` (``ConsumerLoop._apply_one``):
    the replica had ``previous``. The live loop is at offset 10 when a catch-up asks."""
    for key, had in book.acknowledged(REPLICA, "item", {KEY: end}, {KEY: previous}).items():
        tasks.start(book, REPLICA, key, had, end, lambda: 10)


async def test_a_replica_found_behind_again_as_its_catch_up_ends_is_replayed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replica restarts right after the last write of its catch-up; the live loop's next answer (no position:
    its export has none) reaches the loop in the same turn as the catch-up's end, after the catch-up handed the
    replica back to the book but before its task's done callback ran. The book marks it catching up again and the
    loop asks for a catch-up: it must run (and count), although the finished task is still registered; otherwise
    the replica stays marked catching up for good, with nothing replaying it (the loop no longer judges its
    answers), and lacks every row it lost."""
    monkeypatch.setattr(catchup, "_BATCH", 3)
    ps = _Replica(restart_after=-1)
    ps.rows = {IDS[off]: float(off) for off in range(5, 10)}  # live writes it received during the replay
    book = _Book()
    tasks, metrics = _tasks(ps)

    def restarted_and_answered() -> None:
        ps.restart()
        _found_behind(book, tasks, previous=-1, end=10)

    book.then = restarted_and_answered
    book.live_from(KEY, 0)
    try:
        _found_behind(book, tasks, previous=-1, end=5)  # its first write: the export has no position
        await book.handed_back_times(1)
        try:
            await book.handed_back_times(2)
        except TimeoutError:
            pytest.fail(
                f"found behind again, never replayed: catching up {book.catching_up(REPLICA, KEY)}, "
                f"rows of offsets {sorted(IDS.index(i) for i in ps.rows)}"
            )
    finally:
        await tasks.close()
    assert book.handed_back == [10, 10]
    assert ps.rows == {IDS[off]: float(off) for off in range(10)}, "a row the replica lost was not replayed"
    assert ps.position == {"item": 10}
    assert not book.catching_up(REPLICA, KEY)
    assert _catchups(metrics) == 2


@pytest.mark.parametrize(("restart_after", "counted"), [(-1, 1), (1, 2)])
async def test_each_fall_back_counts_one_catch_up_and_an_extension_none(
    monkeypatch: pytest.MonkeyPatch, restart_after: int, counted: int
) -> None:
    """``embedgate_updater_replica_catchups_total`` counts the replays started because the replica was found
    behind: by the loop, and again by its running replay when it falls back once more (``restart_after`` 1: it
    restarts after the replay's first write). The extension of the replay up to where the live loop moved meanwhile
    (5 -> 10, in both cases) is not a fall-back and is not counted."""
    monkeypatch.setattr(catchup, "_BATCH", 3)
    ps = _Replica(restart_after)
    ps.rows = {IDS[off]: float(off) for off in range(5, 10)}  # live writes it received during the replay
    book = _Book()
    tasks, metrics = _tasks(ps)
    book.live_from(KEY, 0)
    try:
        _found_behind(book, tasks, previous=-1, end=5)
        await book.handed_back_times(1)
    finally:
        await tasks.close()
    assert book.handed_back == [10]
    assert ps.rows == {IDS[off]: float(off) for off in range(10)}
    assert _catchups(metrics) == counted
