"""updater.replicas.PositionBook: when a replica counts as behind (pure, no broker)."""

from __future__ import annotations

from updater.replicas import NEVER, PositionBook, Replica

R = Replica("127.0.0.1:1", "m", 0)
K = "t:0"


def test_live_writes_move_the_belief_and_a_fall_back_is_reported_once() -> None:
    book = PositionBook()
    assert book.expected(R, "a", K) == NEVER  # the live start is unknown: positions must not move
    book.live_from(K, 100)
    assert book.expected(R, "a", K) == 100
    assert book.acknowledged(R, "a", {K: 120}, {K: 100}) == {}  # it had everything from the live start
    assert book.expected(R, "a", K) == 120
    assert book.acknowledged(R, "a", {K: 130}, {K: 125}) == {}  # another writer moved it further: fine
    assert book.expected(R, "a", K) == 130
    assert book.acknowledged(R, "a", {K: 140}, {K: 40}) == {K: 40}  # restarted on a snapshot at 40
    assert book.catching_up(R, K)
    assert book.acknowledged(R, "a", {K: 150}, {K: 40}) == {}  # not reported twice while catching up
    book.caught_up(R, K, ["a", "b"], 145)
    assert not book.catching_up(R, K)
    assert (book.expected(R, "a", K), book.expected(R, "b", K)) == (145, 145)
    assert book.acknowledged(R, "b", {K: 160}, {K: 145}) == {}


def test_a_replica_without_a_position_is_behind_the_live_start() -> None:
    book = PositionBook()
    book.live_from(K, 0)
    assert book.acknowledged(R, "a", {K: 10}, {K: -1}) == {K: -1}  # an export without a stream cut


def test_a_new_assignment_forgets_beliefs_and_abandon_clears_the_mark() -> None:
    book = PositionBook()
    book.live_from(K, 10)
    book.acknowledged(R, "a", {K: 20}, {K: 10})
    book.live_from(K, 15)
    assert book.expected(R, "a", K) == 15
    assert book.acknowledged(R, "a", {K: 30}, {K: 3}) == {K: 3}
    book.abandon(R, K)
    assert not book.catching_up(R, K) and book.expected(R, "a", K) == 15
    other = Replica("127.0.0.1:2", "m", 0)
    assert book.acknowledged(other, "a", {K: 30}, {}) == {}  # an answer without positions proves nothing


def test_a_position_check_reports_replicas_below_a_snapshot_taken_before_the_read() -> None:
    book = PositionBook()
    book.live_from(K, 0)
    book.acknowledged(R, "a", {K: 50}, {K: 0})
    snapshot = book.beliefs()
    assert snapshot == {R: {("a", K): 50}}
    book.acknowledged(R, "a", {K: 80}, {K: 50})  # a write acknowledged after the snapshot: not compared
    assert book.check(R, snapshot[R], {"a": {K: 60}}) == {}
    assert book.check(R, snapshot[R], {"a": {K: 10}}) == {K: 10}  # restarted: behind the snapshot
    assert book.catching_up(R, K) and book.beliefs() == {}
    assert book.check(R, snapshot[R], {"a": {K: 10}}) == {}  # reported once


def test_an_answer_to_a_write_sent_with_an_older_belief_is_not_judged() -> None:
    book = PositionBook()
    book.live_from(K, 100)
    book.acknowledged(R, "a", {K: 120}, {K: 100}, {K: 100})
    sent_during_catch_up = book.expected(R, "a", K)  # 120: the belief a live write carries meanwhile
    restarted = book.acknowledged(R, "a", {K: 130}, {K: 40}, {K: sent_during_catch_up})
    assert restarted == {K: 40}  # it restarted on a snapshot at 40
    late = book.expected(R, "a", K)  # a live write sent while the replica is caught up: still the old belief
    book.caught_up(R, K, ["a"], 135)
    # its answer arrives after the hand-back: the replica had the catch-up's progress, not the old belief; with the
    # belief it was sent with, the answer is not evidence of a new restart
    assert book.acknowledged(R, "a", {K: 140}, {K: 90}, {K: late}) == {}
    assert not book.catching_up(R, K)
    # a write sent with the current belief that finds less is a restart, as before
    assert book.acknowledged(R, "a", {K: 150}, {K: 7}, {K: book.expected(R, "a", K)}) == {K: 7}
