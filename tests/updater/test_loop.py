"""updater.loop.ConsumerLoop's at-least-once rules, without a broker or PS: a fake Kafka client, a fake writer, a
fake dead-letter producer and a clock the test advances (tests/updater/fakes.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaTimeoutError, TopicAuthorizationFailedError

from schemas.deployment import EmbeddingModel
from schemas.updater_settings import BatchSettings, RetrySettings
from tests.updater.fakes import (
    MANIFEST,
    TOPIC,
    FakeCatchUps,
    FakeClient,
    FakeClock,
    FakeProducer,
    FakeWriter,
    delta_record,
    ids_of_shard,
)
from updater.deadletter import DeadLetterer
from updater.errors import ApplyRejected, ShardUnavailable
from updater.ingest import RecordDecoder, Route
from updater.loop import ConsumerLoop
from updater.metrics import UpdaterMetrics
from updater.scheduler import ApplyScheduler

RETRY = RetrySettings(min_backoff_ms=1000, max_backoff_ms=8000)
BACKOFF_S = 1.0  # first backoff with the jitter fixed at the middle (rand = 0.5)
S0 = ids_of_shard(0, 8)
S1 = ids_of_shard(1, 8)


class Rig:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.clock = FakeClock()
        self.writer = FakeWriter()
        self.producer = FakeProducer()
        self.metrics = UpdaterMetrics()
        config = EmbeddingModel.model_validate(
            {
                "name": "unit",
                "manifest": "/nonexistent",
                "entry": "127.0.0.1:1",
                "shards": [{"replicas": ["127.0.0.1:2"]}, {"replicas": ["127.0.0.1:3"]}],
            }
        )
        self.loop = ConsumerLoop(
            client=client,
            decoder=RecordDecoder(
                {"unit": Route(config, MANIFEST)}, client.partitions_for_topic, self.metrics
            ),
            scheduler=ApplyScheduler(RETRY, max_pending_rows=10_000, clock=self.clock, rand=lambda: 0.5),
            writer=self.writer,
            dead_letters=DeadLetterer(
                self.producer, "unit.dlq", self.metrics, RETRY, clock=self.clock, rand=lambda: 0.5
            ),
            catch_ups=FakeCatchUps(),
            metrics=self.metrics,
            batch=BatchSettings(max_messages=64, max_delay_ms=0),
            stop=asyncio.Event(),
            clock=self.clock,
        )

    async def steps(self, n: int = 6) -> None:
        for _ in range(n):
            await self.loop.step()

    async def until(self, cond: Callable[[], bool], what: str, max_steps: int = 50) -> None:
        for _ in range(max_steps):
            if cond():
                return
            await self.loop.step()
        raise AssertionError(f"{what}: not reached within {max_steps} steps")

    async def close(self) -> None:
        self.loop.stop()
        for gate in self.writer.gates.values():
            gate.set()
        await self.loop.run()


def tp(p: int) -> TopicPartition:
    return TopicPartition(TOPIC, p)


async def test_commit_waits_for_every_shard_a_record_touched() -> None:
    """With one partition, a record holds rows of both shards: its offset commits only once both writes returned."""
    rig = Rig(FakeClient(partitions=[0], count=1))
    gate = rig.writer.hold(1)
    rig.client.feed(delta_record(0, 0, S0[:2] + S1[:2]), delta_record(0, 1, S0[2:4]))
    await rig.until(lambda: len(rig.writer.acked) == 1, "shard 0 written")
    await rig.steps()
    assert rig.client.last_commit(0) in (None, 0), "committed past a record whose shard 1 rows are unwritten"
    gate.set()
    await rig.until(lambda: rig.client.last_commit(0) == 2, "commit after both shards acknowledged")
    await rig.close()


async def test_failed_write_commits_nothing_past_it_and_retries_after_the_backoff() -> None:
    rig = Rig(FakeClient())
    rig.writer.failures[0] = [
        ShardUnavailable("down", target="127.0.0.1:2", code=grpc.StatusCode.UNAVAILABLE)
    ]
    rig.client.feed(delta_record(0, 0, S0[:2]), delta_record(1, 0, S1[:2]))
    await rig.until(lambda: rig.client.last_commit(1) == 1, "shard 1 commits on its own")
    await rig.steps()
    assert rig.client.last_commit(0) in (None, 0)
    assert rig.client.paused == {tp(0)}, "the failing shard's partition is paused"
    assert len([c for c in rig.writer.calls if c.key.shard == 0]) == 1, "retried before the backoff"
    # rows read meanwhile queue behind the failed ones
    rig.client.feed(delta_record(0, 1, S0[:1], value=2.0))
    await rig.steps()
    rig.clock.advance(BACKOFF_S * 0.9)
    await rig.steps()
    assert len([c for c in rig.writer.calls if c.key.shard == 0]) == 1, "retried before the backoff"
    rig.clock.advance(BACKOFF_S * 0.2)
    await rig.until(lambda: rig.client.last_commit(0) == 2, "commit after the retry succeeded")
    retry = [c for c in rig.writer.acked if c.key.shard == 0][-1]
    assert list(retry.upsert_ids) == sorted(S0[:2])
    assert retry.upsert_values[list(retry.upsert_ids).index(S0[0])].tolist() == [2.0, 2.0], "newer row lost"
    assert rig.client.paused == set(), "resumed once written"
    await rig.close()


async def test_one_write_per_key_in_flight_and_fetching_goes_on_meanwhile() -> None:
    """A slow write does not stop the next fetch; rows read meanwhile go in the next write of the key, in order."""
    rig = Rig(FakeClient())
    gate = rig.writer.hold(0)
    rig.client.feed(delta_record(0, 0, S0[:2], value=1.0))
    await rig.until(lambda: len(rig.writer.calls) == 1, "first write started")
    rig.client.feed(delta_record(0, 1, S0[:1], value=2.0))
    rig.client.feed(delta_record(0, 2, S0[2:3], value=3.0))
    await rig.until(lambda: not rig.client.batches, "both batches fetched while the write is in flight")
    await rig.steps()
    assert len(rig.writer.calls) == 1, "a second write of the same key started while the first was in flight"
    assert rig.client.last_commit(0) in (None, 0)
    gate.set()
    await rig.until(lambda: rig.client.last_commit(0) == 3, "everything committed")
    assert rig.writer.max_active == 1
    second = rig.writer.calls[1]
    assert sorted(second.upsert_ids.tolist()) == sorted([S0[0], S0[2]])
    assert second.positions == {f"{TOPIC}:0": 3}
    await rig.close()


async def test_rebalance_mid_write_commits_nothing_of_the_old_generation() -> None:
    rig = Rig(FakeClient())
    gate = rig.writer.hold(0)
    rig.client.feed(delta_record(0, 0, S0[:2]), delta_record(0, 1, S0[2:4]))
    await rig.until(lambda: len(rig.writer.calls) == 1, "write started")
    await rig.loop.on_revoked([tp(0), tp(1)])
    rig.client.committed_offsets[tp(0)] = 0
    await rig.loop.on_assigned([tp(0), tp(1)])
    assert (tp(0), 0) in rig.client.seeks, "not sought back to the committed offset"
    rig.client.feed(delta_record(0, 0, S0[:2]), delta_record(0, 1, S0[2:4]))  # redelivered
    await rig.until(lambda: not rig.client.batches, "redelivered records fetched")
    await rig.steps()
    assert len(rig.writer.calls) == 1, (
        "a new write overtook the one still in flight from before the rebalance"
    )
    gate.set()
    await rig.until(lambda: len(rig.writer.acked) == 2, "the redelivered rows written")
    await rig.until(lambda: rig.client.last_commit(0) == 2, "commit of the new generation")
    assert all(c[tp(0)] in (0, 2) for c in rig.client.commits if tp(0) in c)
    await rig.close()


async def test_a_commit_that_finds_the_member_out_of_the_group_reads_everything_uncommitted_again() -> None:
    rig = Rig(FakeClient())
    rig.client.committed_offsets[tp(0)] = 5
    await rig.loop.on_assigned([tp(0), tp(1)])
    gate = rig.writer.hold(0)
    rig.client.feed(delta_record(0, 5, S0[:2]), delta_record(0, 6, S0[2:4]))
    await rig.until(lambda: len(rig.writer.calls) == 1, "write started")
    rig.client.commit_error = CommitFailedError("rebalanced")
    rig.client.feed(delta_record(1, 0, S1[:1]))  # its commit fails while shard 0's write is in flight
    await rig.until(lambda: rig.client.commit_error is None, "commit tried")
    assert rig.client.seeks[-1] == (tp(0), 5), "not sought back to the committed offset"
    gate.set()
    await rig.steps()
    assert rig.client.last_commit(0) == 5, "a write from before the failed commit was committed"
    rig.client.feed(delta_record(0, 5, S0[:2]), delta_record(0, 6, S0[2:4]))  # read again
    await rig.until(lambda: rig.client.last_commit(0) == 7, "commit after the records were read again")
    await rig.close()


async def test_a_fetch_error_keeps_the_records_read_before_it() -> None:
    rig = Rig(FakeClient())
    real = rig.client.getmany
    calls = 0

    async def flaky(*partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KafkaTimeoutError()
        return await real(*partitions, timeout_ms=timeout_ms, max_records=max_records)

    rig.client.getmany = flaky  # type: ignore[method-assign]
    rig.client.feed(delta_record(0, 0, S0[:1]))
    rig.client.feed(delta_record(0, 1, S0[1:2]))
    await rig.until(lambda: rig.client.last_commit(0) == 2, "both records applied and committed")
    assert sorted(i for c in rig.writer.acked for i in c.upsert_ids.tolist()) == sorted(S0[:2])
    await rig.close()


async def test_rejected_write_dead_letters_its_messages_then_commits() -> None:
    rig = Rig(FakeClient())
    rig.writer.failures[0] = [
        ApplyRejected("no", target="127.0.0.1:2", code=grpc.StatusCode.INVALID_ARGUMENT)
    ]
    rig.client.feed(delta_record(0, 0, S0[:2]), delta_record(0, 1, S0[2:3]))
    await rig.until(lambda: rig.client.last_commit(0) == 2, "committed after dead-lettering")
    reasons = [h["embedgate.reason"] for _, _, h in rig.producer.sent]
    offsets = sorted(h["embedgate.offset"] for _, _, h in rig.producer.sent)
    assert reasons == [b"apply_rejected"] * 2 and offsets == [b"0", b"1"]
    await rig.close()


async def test_invalid_message_is_dead_lettered_with_its_reason() -> None:
    rig = Rig(FakeClient())
    rig.client.feed(delta_record(0, 0, [], value_bytes=b"garbage"), delta_record(0, 1, S0[:1]))
    await rig.until(lambda: rig.client.last_commit(0) == 2, "committed")
    [(topic, value, headers)] = rig.producer.sent
    assert topic == "unit.dlq" and value == b"garbage"
    assert headers["embedgate.partition"] == b"0" and headers["embedgate.offset"] == b"0"
    await rig.close()


@pytest.mark.parametrize("raised", [RecursionError, MemoryError, ValueError, KeyError])
async def test_a_record_whose_decoding_raises_anything_else_is_dead_lettered_and_the_stream_goes_on(
    monkeypatch: pytest.MonkeyPatch, raised: type[Exception]
) -> None:
    """Defence in depth behind the decoders' contract: an exception other than DeltaError out of the pure work on one
    record (here the manifest check, as a bug would) dead-letters that record (reason decoder_error, counted by class),
    commits past it and applies the records behind it."""
    import updater.ingest as ingest

    real = ingest.check_against_manifest

    def crashing(delta: Any, manifest: Any) -> None:
        if int(delta.ids[0]) == S0[0]:
            raise raised("boom")
        real(delta, manifest)

    monkeypatch.setattr(ingest, "check_against_manifest", crashing)
    rig = Rig(FakeClient())
    rig.client.feed(delta_record(0, 0, S0[:1]), delta_record(0, 1, S0[1:3]))
    await rig.until(lambda: rig.client.last_commit(0) == 2, "committed past the poison record")
    [(_, _, headers)] = rig.producer.sent
    assert headers["embedgate.reason"] == b"decoder_error" and headers["embedgate.offset"] == b"0"
    assert raised.__name__ in headers["embedgate.error"].decode()
    assert [sorted(c.upsert_ids.tolist()) for c in rig.writer.acked] == [sorted(S0[1:3])]
    poison = rig.metrics.registry.get_sample_value(
        "embedgate_updater_poison_messages_total", {"error": raised.__name__}
    )
    assert poison == 1
    await rig.close()


async def test_a_decoder_error_from_the_decoders_is_counted_under_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import schemas.deltas as deltas

    def broken(buf: bytes) -> Any:
        raise MemoryError

    monkeypatch.setattr(deltas, "_decode_binary", broken)
    rig = Rig(FakeClient())
    rig.client.feed(delta_record(0, 0, S0[:1]))
    await rig.until(lambda: rig.client.last_commit(0) == 1, "committed past the record")
    assert [h["embedgate.reason"] for _, _, h in rig.producer.sent] == [b"decoder_error"]
    assert (
        rig.metrics.registry.get_sample_value(
            "embedgate_updater_poison_messages_total", {"error": "MemoryError"}
        )
        == 1
    )
    await rig.close()


async def test_unversioned_record_in_the_wrong_partition_is_dead_lettered() -> None:
    rig = Rig(FakeClient())
    rig.client.feed(delta_record(1, 0, S0[:1], ts=0))  # shard 0 belongs in partition 0 of 2
    await rig.until(lambda: rig.client.last_commit(1) == 1, "committed")
    assert [h["embedgate.reason"] for _, _, h in rig.producer.sent] == [b"wrong_partition"]
    assert rig.writer.calls == []
    await rig.close()


async def test_versioned_record_in_the_wrong_partition_is_applied_and_counted() -> None:
    rig = Rig(FakeClient())
    rig.client.feed(
        delta_record(1, 0, S0[:1], ts=5)
    )  # shard 0's rows in partition 1: ordered by their version
    await rig.until(lambda: rig.client.last_commit(1) == 1, "committed")
    assert rig.producer.sent == []
    assert len(rig.writer.acked) == 1
    misplaced = [
        s.value for m in rig.metrics.misplaced.collect() for s in m.samples if s.name.endswith("_total")
    ]
    assert misplaced == [1.0]
    await rig.close()


async def test_dead_letter_failure_does_not_commit_past_the_bad_message() -> None:
    rig = Rig(FakeClient())
    rig.producer.fail = KafkaTimeoutError()
    rig.client.feed(delta_record(0, 0, [], value_bytes=b"garbage"), delta_record(0, 1, S0[:1]))
    await rig.until(lambda: len(rig.writer.acked) == 1, "the good message written")
    await rig.steps()
    assert rig.client.last_commit(0) in (None, 0), "committed past an undelivered dead letter"
    assert rig.client.paused == {tp(0)}
    rig.producer.fail = None
    await rig.steps()
    assert rig.producer.sent == [], "sent again before the backoff"
    rig.clock.advance(BACKOFF_S * 1.1)
    await rig.until(lambda: rig.client.last_commit(0) == 2, "committed once the dead letter is acknowledged")
    assert len(rig.producer.sent) == 1 and rig.client.paused == set()
    dead = [
        s.value for m in rig.metrics.dead_letters.collect() for s in m.samples if s.name.endswith("_total")
    ]
    assert sum(dead) == 1, "a dead letter counted before the broker acknowledged it, or twice"
    await rig.close()


async def test_a_fatal_dead_letter_error_stops_the_loop_without_committing() -> None:
    rig = Rig(FakeClient())
    rig.producer.fail = TopicAuthorizationFailedError()
    rig.client.feed(delta_record(0, 0, [], value_bytes=b"garbage"))
    with pytest.raises(TopicAuthorizationFailedError):
        await asyncio.wait_for(rig.loop.run(), 10)
    assert rig.client.last_commit(0) is None


async def test_stop_lets_writes_in_flight_finish_and_commits_them() -> None:
    rig = Rig(FakeClient())
    gate = rig.writer.hold(0)
    rig.client.feed(delta_record(0, 0, S0[:2]))
    await rig.until(lambda: len(rig.writer.calls) == 1, "write started")
    rig.loop.stop()
    run = asyncio.create_task(rig.loop.run())
    await asyncio.sleep(0.01)
    assert not run.done(), "run returned with a write in flight"
    gate.set()
    await asyncio.wait_for(run, 10)
    assert rig.client.last_commit(0) == 1


def test_fixture_ids_hash_to_their_shards() -> None:
    from schemas.partition import shard_for

    assert set(shard_for(np.array(S0), 2).tolist()) == {0}
    assert set(shard_for(np.array(S1), 2).tolist()) == {1}
