"""gateway.admission: the adaptive limit driven by a fake clock (pure policy), and the queue on a real event loop."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.admission import _DRAIN_SAMPLES, Admission, GradientLimit, Phase, Shedder, ShedMiddleware
from gateway.errors import ResourceExhausted, Unavailable
from gateway.metrics import Metrics
from schemas.gateway_settings import AdmissionSettings


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _settings(**kw: object) -> AdmissionSettings:
    base: dict[str, object] = {
        "min_limit": 2,
        "floor_limit": 2,  # the gradient rule alone (the floor has its own test)
        "sample_window_s": 1.0,
        "min_samples": 4,
        "rtt_tolerance": 0.5,
        "rtt_budget_s": 0.0,  # the gradient on min_rtt alone (the budget has its own test)
        "min_rtt_interval_s": 100.0,
        "min_rtt_samples": 4,
    }
    return AdmissionSettings(**(base | kw))  # type: ignore[arg-type]


def _round_trip(lim: GradientLimit, clock: Clock, rtt: float) -> None:
    """One request admitted now, answered OK ``rtt`` seconds later."""
    assert lim.try_acquire()
    start = clock.now
    clock.now += rtt
    lim.release(start)


def _contend(lim: GradientLimit) -> None:
    """Take every free slot, find the limit full once, give the slots back (failures: no samples)."""
    taken = 0
    while lim.try_acquire():
        taken += 1
    for _ in range(taken):
        lim.release(None)


def _measured(clock: Clock, rtt: float = 0.01, max_limit: int = 100, **kw: object) -> GradientLimit:
    lim = GradientLimit(max_limit, _settings(**kw), clock)
    _contend(lim)
    for _ in range(lim._s.min_rtt_samples if lim._s else 0):
        _round_trip(lim, clock, rtt)
    assert lim.phase is Phase.ADAPTING
    return lim


def test_fixed_limit_is_max_in_flight() -> None:
    lim = GradientLimit(3, AdmissionSettings(adaptive=False))
    assert lim.phase is Phase.FIXED and lim.limit == 3
    assert [lim.try_acquire() for _ in range(4)] == [True, True, True, False]
    lim.release(0.0)
    assert lim.in_flight == 2 and lim.try_acquire()
    assert GradientLimit(5).limit == 5  # no settings: fixed as well


def test_nothing_is_held_down_until_the_limit_is_reached() -> None:
    clock = Clock()
    lim = GradientLimit(100, _settings(), clock)
    assert lim.phase is Phase.UNMEASURED and lim.limit == 100
    for _ in range(50):  # slow answers, but never more in flight than allowed: no measurement, no change
        _round_trip(lim, clock, 2.0)
    assert lim.phase is Phase.UNMEASURED and lim.limit == 100 and lim.min_rtt is None


def test_min_rtt_is_measured_at_min_limit_once_the_limit_is_reached() -> None:
    clock = Clock()
    lim = GradientLimit(100, _settings(), clock)
    _contend(lim)
    assert lim.phase is Phase.MEASURING and lim.limit == 2
    for rtt in (0.01, 0.03, 0.02, 0.5):
        _round_trip(lim, clock, rtt)
    assert lim.min_rtt == pytest.approx(0.025)  # the median of the four
    assert lim.phase is Phase.ADAPTING and lim.limit == 100  # back to where it was (max_in_flight at start)


def test_requests_admitted_before_a_measurement_are_no_samples() -> None:
    clock = Clock()
    lim = GradientLimit(10, _settings(), clock)
    for _ in range(10):
        assert lim.try_acquire()
    clock.now += 5.0
    assert not lim.try_acquire()  # the 11th: the measurement starts now
    assert lim.phase is Phase.MEASURING
    for _ in range(10):  # admitted 5 s ago under the full limit: loaded round trips, not samples
        lim.release(clock.now - 5.0)
    assert lim.phase is Phase.MEASURING and lim.min_rtt is None and lim.in_flight == 0
    for _ in range(10):  # failures are never samples either
        assert lim.try_acquire()
        clock.now += 0.01
        lim.release(None)
    assert lim.phase is Phase.MEASURING and lim.min_rtt is None


def test_a_window_needs_its_time_and_its_samples() -> None:
    clock = Clock()
    lim = _measured(clock)
    for _ in range(10):  # ten slow answers, but within one window (1 s): nothing changes yet (0.5 s pass)
        _round_trip(lim, clock, 0.05)
    assert lim.limit == 100
    clock.now += 1.0
    _round_trip(lim, clock, 0.05)  # the window is over and holds enough samples: 5x slower, the limit halves
    assert lim.limit == int(100 * 0.5 + 10)


def test_gradient_rule() -> None:
    clock = Clock()
    lim = _measured(clock, rtt=0.01)
    # round trip at the tolerance: gradient 1, the limit grows by sqrt(limit)
    assert lim.next_limit(16.0, 0.015) == pytest.approx(16 + 4)
    # twice slower than tolerated: gradient 0.5
    assert lim.next_limit(16.0, 0.03) == pytest.approx(8 + 4)
    # far slower: the gradient stops at 0.5; far faster: at 2
    assert lim.next_limit(16.0, 10.0) == pytest.approx(8 + 4)
    assert lim.next_limit(16.0, 0.0001) == pytest.approx(32 + 4)
    # bounded by min_limit and max_in_flight
    assert lim.next_limit(1.0, 10.0) == 2
    assert lim.next_limit(90.0, 0.001) == 100


def test_limit_converges_near_what_a_saturated_server_can_serve() -> None:
    """A server of ``capacity`` requests/s sharing its CPU among those in flight (round trip = max(base, n / capacity))
    under more load than it can take: the limit settles near capacity x base latency, far below max_in_flight, so
    admitted requests keep about the unloaded latency (within the tolerance) while the server stays busy."""
    clock = Clock()
    base, capacity, max_limit = 0.005, 2000.0, 1000
    lim = _measured(clock, rtt=base, max_limit=max_limit, min_rtt_interval_s=10_000.0)
    optimal = base * capacity  # 10 in flight keep the server busy at the unloaded latency
    seen: list[int] = []
    for _ in range(200):  # 200 windows of saturating load: the limit is always full
        rtt = max(base, lim.limit / capacity)
        for _ in range(lim._s.min_samples if lim._s else 0):
            assert lim.try_acquire()
            lim.release(clock.now - rtt)
        clock.now += 1.0
        _round_trip(lim, clock, rtt)
        seen.append(lim.limit)
    settled = seen[-50:]
    assert min(settled) >= optimal  # enough in flight to keep the server busy: goodput at capacity
    assert max(settled) <= optimal * 3  # and far from the 1000 allowed: latency stays near the unloaded one
    assert max(settled) / capacity <= base * 3


def test_limit_is_measured_again_after_the_interval_when_it_was_reached() -> None:
    clock = Clock()
    lim = _measured(clock, rtt=0.01, min_rtt_interval_s=5.0)
    clock.now += 6.0
    for _ in range(
        4
    ):  # a window closes after the interval, but the limit was never reached: no new measurement
        _round_trip(lim, clock, 0.01)
    assert lim.phase is Phase.ADAPTING
    _contend(lim)
    clock.now += 6.0
    for _ in range(4):
        _round_trip(lim, clock, 0.01)
    assert lim.phase is Phase.MEASURING and lim.limit == 2
    for _ in range(4):
        _round_trip(lim, clock, 0.002)  # the backends got faster
    assert lim.phase is Phase.ADAPTING and lim.min_rtt == pytest.approx(0.002)
    assert lim.limit > 2  # back to the limit of before the measurement


def test_min_limit_is_capped_by_max_in_flight() -> None:
    lim = GradientLimit(1, _settings(min_limit=4))
    assert lim.min_limit == 1 and lim.limit == 1


def test_contention_never_takes_the_limit_below_the_floor() -> None:
    """Round trips far above the minimum in every window (the CPU shared with a flood being refused): the limit
    halves window after window, but stops at ``floor_limit``; min_rtt is still measured at ``min_limit``."""
    clock = Clock()
    lim = _measured(clock, rtt=0.01, floor_limit=24)
    assert lim.floor == 24
    for _ in range(20):
        for _ in range(4):
            _round_trip(lim, clock, 1.0)  # 100x the minimum round trip
        clock.now += 1.0
    assert lim.limit == 24
    assert lim.next_limit(30.0, 10.0) == 24  # 15 + sqrt(30) = 20.5, held at the floor
    assert lim.next_limit(100.0, 10.0) == pytest.approx(50 + 10)  # above the floor the rule is unchanged
    assert GradientLimit(100, _settings(floor_limit=24)).phase is Phase.UNMEASURED
    _contend(lim)  # measured again later: held at min_limit (not the floor) while measuring
    clock.now += 200.0
    for _ in range(4):
        _round_trip(lim, clock, 1.0)
    assert lim.phase is Phase.MEASURING and lim.limit == 2


def test_a_measurement_under_contention_ends_after_max_measure_s() -> None:
    """Long round trips (a loaded machine): the limit is held at min_limit only until the first answer after
    ``max_measure_s``, not for ``min_rtt_samples`` answers (which refused nearly everything for seconds)."""
    clock = Clock()
    lim = GradientLimit(100, _settings(min_rtt_samples=24, max_measure_s=1.0), clock)
    _contend(lim)
    assert lim.phase is Phase.MEASURING
    _round_trip(lim, clock, 0.6)
    assert lim.phase is Phase.MEASURING  # 0.6 s in: still measuring
    _round_trip(lim, clock, 0.8)  # answered 1.4 s after the measurement started: it ends with two samples
    assert lim.phase is Phase.ADAPTING and lim.min_rtt == pytest.approx(0.7) and lim.limit == 100


def test_a_measurement_without_samples_keeps_the_last_min_rtt_after_max_measure_s() -> None:
    """Measured again while every answer comes from requests admitted before (a backlog): no sample, but the
    measurement still ends at the first answer after ``max_measure_s``, keeping the last ``min_rtt``."""
    clock = Clock()
    lim = _measured(clock, rtt=0.01, min_rtt_interval_s=5.0, max_measure_s=1.0)
    held = 0
    while lim.try_acquire():  # every slot taken now, answered later; the next request finds the limit full
        held += 1
    admitted = clock.now
    assert held == 100
    clock.now += 6.0
    for _ in range(4):
        lim.release(admitted)  # a window closes after the interval: measured again
    assert lim.phase is Phase.MEASURING and lim.limit == 2
    clock.now += 0.5
    lim.release(admitted)  # admitted before the measurement: no sample, and only 0.5 s in
    assert lim.phase is Phase.MEASURING
    clock.now += 0.6
    lim.release(admitted)  # 1.1 s in: it ends, min_rtt as before
    assert lim.phase is Phase.ADAPTING and lim.min_rtt == pytest.approx(0.01) and lim.limit > 2


def test_round_trips_within_the_budget_let_the_limit_grow() -> None:
    """Round trips 8x the minimum (a shared CPU) but under ``rtt_budget_s``: the limit grows window after window up
    to ``max_in_flight``; once the median round trip passes the budget it shrinks, to budget / median of itself."""
    clock = Clock()
    lim = _measured(clock, rtt=0.01, rtt_budget_s=0.1, floor_limit=2)
    lim._limit = 10.0
    for _ in range(10):
        for _ in range(4):
            _round_trip(lim, clock, 0.08)  # 8x min_rtt, within the budget
        clock.now += 1.0
    assert lim.limit == 100
    assert lim.next_limit(64.0, 0.08) == pytest.approx(64 * 0.1 / 0.08 + 8)
    assert lim.next_limit(64.0, 0.16) == pytest.approx(64 * 0.1 / 0.16 + 8)  # past the budget: it shrinks
    without = _measured(Clock(), rtt=0.01, rtt_budget_s=0.0, floor_limit=2)
    assert without.next_limit(64.0, 0.08) == pytest.approx(64 * 0.5 + 8)  # on min_rtt alone it halves
    assert AdmissionSettings().rtt_budget_s == 0.1  # the default


def test_floor_is_between_min_limit_and_max_in_flight() -> None:
    assert GradientLimit(100, _settings(min_limit=8, floor_limit=3)).floor == 8
    assert GradientLimit(16, _settings(floor_limit=32)).floor == 16
    assert GradientLimit(100, AdmissionSettings()).floor == 32  # the default


# ---- the queue (one real event loop; outcomes only, no timing assertions) ---------------------------------------------


def _shed(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("embedgate_admission_shed_total", {"reason": reason}) or 0.0


async def test_queue_admits_in_order_when_slots_free() -> None:
    metrics = Metrics()
    adm = Admission(2, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=30, max_queue=5), metrics)
    assert adm.queue_room == 2  # never more waiting than the limit
    first = [await adm.admit() for _ in range(2)]
    waiting = [asyncio.create_task(adm.admit()) for _ in range(2)]
    await asyncio.sleep(0)
    assert adm.waiting == 2 and adm.current == 2
    with pytest.raises(ResourceExhausted, match=r"concurrency limit of 2 \(max_in_flight=2\), 2 waiting"):
        await adm.admit()  # the queue is full: refused at once
    assert _shed(metrics, "queue_full") == 1
    adm.release(first[0])
    await waiting[0]  # FIFO: the first waiter got the slot, the second still waits
    assert adm.waiting == 1 and not waiting[1].done() and adm.current == 2
    adm.release(None)
    await asyncio.gather(*waiting)
    assert adm.current == 2 and adm.waiting == 0
    assert metrics.registry.get_sample_value("embedgate_admission_queue_wait_seconds_count") == 2
    assert metrics.registry.get_sample_value("embedgate_admission_limit") == 2
    assert Admission(300, 429, 1, AdmissionSettings(adaptive=False, max_queue=5)).queue_room == 5


async def test_queue_sheds_what_waited_too_long() -> None:
    metrics = Metrics()
    adm = Admission(1, 429, 3, AdmissionSettings(adaptive=False, queue_timeout_s=0.01, max_queue=8), metrics)
    await adm.admit()  # never released: nobody behind it gets in
    with pytest.raises(ResourceExhausted, match=r"admission.queue_timeout_s") as exc:
        await adm.admit()
    assert exc.value.retry_after == 3
    assert _shed(metrics, "queue_timeout") == 1 and adm.waiting == 0 and adm.current == 1


async def test_no_queue_refuses_at_once_with_the_overload_status() -> None:
    adm = Admission(1, 503, 1, AdmissionSettings(adaptive=False, queue_timeout_s=0))
    await adm.admit()
    with pytest.raises(Unavailable, match="max_in_flight=1"):
        await adm.admit()
    with pytest.raises(Unavailable):
        adm.acquire()


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_no_slot() -> None:
    adm = Admission(1, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=30, max_queue=4))
    first = await adm.admit()
    task = asyncio.create_task(adm.admit())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.waiting == 0
    # a waiter handed a slot in the same step it is cancelled gives the slot back
    task = asyncio.create_task(adm.admit())
    await asyncio.sleep(0)
    adm.release(first)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.current == 0 and adm.waiting == 0


async def test_adaptive_admission_reports_its_limit() -> None:
    metrics = Metrics()
    clock = Clock()
    adm = Admission(64, 429, 1, _settings(min_limit=3, max_queue=0), metrics, clock)
    assert adm.limit == 64 and metrics.registry.get_sample_value("embedgate_admission_limit") == 64
    held = [await adm.admit() for _ in range(64)]
    with pytest.raises(ResourceExhausted, match="concurrency limit of 3 "):  # full: the measurement starts
        await adm.admit()
    for _ in held:
        adm.release(None)
    assert adm.limit == 3 and metrics.registry.get_sample_value("embedgate_admission_limit") == 3
    for _ in range(4):
        start = await adm.admit()
        clock.now += 0.01
        adm.release(start)
    assert adm.limit == 64
    assert metrics.registry.get_sample_value("embedgate_admission_limit") == 64
    assert math.isclose(metrics.registry.get_sample_value("embedgate_admission_min_rtt_seconds") or 0, 0.01)


async def test_shed_middleware_refuses_before_anything_reads_the_request() -> None:
    metrics = Metrics()
    adm = Admission(1, 429, 2, AdmissionSettings(adaptive=False, queue_timeout_s=0), metrics)
    inner: list[str] = []
    sent: list[dict[str, object]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        inner.append(scope["path"])

    async def receive() -> Message:
        raise AssertionError("the body must not be read")

    async def send(message: Message) -> None:
        sent.append(dict(message))

    mw = ShedMiddleware(app, Shedder(adm, metrics))
    scope: Scope = {"type": "http", "path": "/v1/models/m:predict"}
    await mw(scope, receive, send)  # a free slot: passed on
    assert inner == ["/v1/models/m:predict"] and not sent
    await adm.admit()
    await mw({"type": "http", "path": "/healthz"}, receive, send)  # probes are never refused
    await mw({"type": "http", "path": "/V1/models/m"}, receive, send)
    assert inner == ["/v1/models/m:predict", "/healthz"]
    assert sent[0]["status"] == 429
    assert (b"retry-after", b"2") in sent[0]["headers"]  # type: ignore[operator]
    assert b"max_in_flight=1" in sent[1]["body"]  # type: ignore[operator]
    assert _shed(metrics, "queue_full") == 1
    assert metrics.registry.get_sample_value("embedgate_requests_rejected_total") == 1


async def _stall_loop(seconds: float) -> None:
    """Block the event loop for at least ``seconds``, then let the lag watcher's overdue timer run."""
    time.sleep(seconds)  # noqa: ASYNC251 - the point: a loop that is late
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_late_event_loop_sheds_new_requests_after_three_late_measurements() -> None:
    metrics = Metrics()
    adm = Admission(8, 429, 1, AdmissionSettings(max_loop_lag_s=0.1), metrics)
    watcher = asyncio.create_task(adm.watch_lag())
    try:
        await asyncio.sleep(0)  # the watcher's first timer is set
        for _ in range(2):
            await _stall_loop(0.25)
            assert adm.loop_lag >= 0.1 and adm.saturated() is None  # one or two late measurements: not yet
        await _stall_loop(0.25)
        assert adm.saturated() == "loop_lag"
        with pytest.raises(
            ResourceExhausted, match=r"running \d+ ms behind \(admission.max_loop_lag_s=0.1\)"
        ):
            await adm.admit()
        assert _shed(metrics, "loop_lag") == 1  # saturated() only tells; a refusal counts
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    assert (metrics.registry.get_sample_value("embedgate_admission_loop_lag_seconds") or 0) >= 0.1


class _ThreadsafeLoop:
    """The one method of an event loop :meth:`Admission.refusal_from_thread` uses: records what it schedules."""

    def __init__(self) -> None:
        self.scheduled: list[object] = []

    def call_soon_threadsafe(self, fn: object) -> None:
        self.scheduled.append(fn)


def test_refusals_from_another_thread_wake_the_loop_only_to_start_the_first_measurement() -> None:
    metrics, clock, loop = Metrics(), Clock(), _ThreadsafeLoop()
    adm = Admission(2, 429, 1, _settings(max_queue=0), metrics, clock)
    assert adm.refusal_from_thread(loop) is None  # type: ignore[arg-type]  # room: nothing refused or scheduled
    adm.acquire()
    adm.acquire()
    assert isinstance(adm.refusal_from_thread(loop), ResourceExhausted)  # type: ignore[arg-type]
    assert len(loop.scheduled) == 1 and adm.policy.phase is Phase.UNMEASURED
    fn = loop.scheduled[0]
    assert callable(fn)
    fn()  # the owner's loop runs it: the first measurement starts there
    assert adm.policy.phase is Phase.MEASURING
    for _ in range(10):
        assert isinstance(adm.refusal_from_thread(loop), ResourceExhausted)  # type: ignore[arg-type]
    assert len(loop.scheduled) == 1  # later refusals only mark the contention, with no wake-up
    assert adm.policy._contended and _shed(metrics, "queue_full") == 11


async def test_the_queue_holds_only_what_the_release_rate_admits_within_the_timeout() -> None:
    """A waiter the measured release rate would not admit within queue_timeout_s is refused at once (queue_full),
    not shed after waiting the whole budget."""
    now = [0.0]
    metrics = Metrics()
    s = AdmissionSettings(adaptive=False, queue_timeout_s=0.1, max_queue=64)
    adm = Admission(64, 429, 1, s, metrics, clock=lambda: now[0])
    assert adm.queue_room == 64  # nothing measured yet: max_queue (and the limit)
    for _ in range(_DRAIN_SAMPLES):  # 100 releases per second: 10 admitted within 0.1 s
        await adm.admit()
        now[0] += 0.01
        adm.release(None)
    assert adm.queue_room == 10
    held = [await adm.admit() for _ in range(64)]
    waiting = [asyncio.create_task(adm.admit()) for _ in range(10)]
    await asyncio.sleep(0)
    assert adm.waiting == 10
    with pytest.raises(ResourceExhausted, match="10 waiting"):
        await adm.admit()
    assert _shed(metrics, "queue_full") == 1
    for _ in range(_DRAIN_SAMPLES):  # slots now free up 10 times as fast (the first ten go to the waiters)
        now[0] += 0.001
        adm.release(held.pop())
    await asyncio.gather(*waiting)
    assert adm.waiting == 0 and adm.queue_room == 64


async def test_a_slow_release_rate_still_lets_one_request_wait() -> None:
    now = [0.0]
    adm = Admission(1, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=0.1), clock=lambda: now[0])
    for _ in range(_DRAIN_SAMPLES):  # one release a second: less than one admitted within 0.1 s
        await adm.admit()
        now[0] += 1.0
        adm.release(None)
    assert adm.queue_room == 1


async def test_an_observer_sees_every_change_of_what_a_request_would_get() -> None:
    """:meth:`Admission.observe` (what the native gRPC gate refuses from): the reason a request arriving now would be
    refused (0 admitted, 1 queue_full), the numbers of its text, the relay bound, and the limit plus the queue room."""
    seen: list[tuple[int, int, int, int, int, int, int, int]] = []
    also: list[
        tuple[int, int, int, int, int, int, int, int]
    ] = []  # a second observer (the other native gate)
    adm = Admission(2, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=30, max_queue=5))

    def observer(*state: int) -> None:
        seen.append(state)  # type: ignore[arg-type]

    adm.observe(observer)
    adm.observe(lambda *state: also.append(state))
    # told at once: nothing in flight, limit 2, bound 2 + queue room 2 + margin 8, room 2 + 2, none pending
    assert seen[-1] == (0, 0, 2, 0, 0, 12, 4, 0)
    first = await adm.admit()
    assert seen[-1] == (0, 1, 2, 0, 0, 12, 4, 0)
    adm.acquire()
    waiters = [asyncio.create_task(adm.admit()) for _ in range(2)]
    await asyncio.sleep(0)
    assert seen[-1] == (1, 2, 2, 2, 0, 12, 4, 0)  # full and the queue full: a request now is refused
    adm.release(first)
    await waiters[0]
    assert seen[-1] == (0, 2, 2, 1, 0, 12, 4, 0)  # a waiter took the slot: room in the queue again
    waiters[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[1]
    assert seen[-1] == (0, 2, 2, 0, 0, 12, 4, 0)
    assert also == seen[1:]  # told everything since it came
    adm.unobserve(observer)
    n = len(seen)
    adm.release(None)
    assert len(seen) == n  # no longer told
    assert also[-1] == (0, 1, 2, 0, 0, 12, 4, 0)  # the other still is
    no_queue = Admission(1, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=0))
    no_queue.observe(lambda *state: seen.append(state))
    assert seen[-1] == (0, 0, 1, 0, 0, 9, 1, 0)  # without a queue: the limit and the margin
    no_queue.acquire()
    assert seen[-1] == (1, 1, 1, 0, 0, 9, 1, 0)


def test_the_requests_judged_and_not_yet_counted_are_published() -> None:
    """A request let through at its head (:class:`Pending`) takes room before admission counts it: the REST gate reads
    the room (the limit plus the queue room) and the pending requests (the state's last two numbers)."""
    from gateway.admission import Pending

    seen: list[tuple[int, ...]] = []
    adm = Admission(2, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=30, max_queue=5))
    adm.observe(lambda *state: seen.append(state))
    assert seen[-1][6:] == (4, 0)
    first, second = Pending(adm), Pending(adm)
    assert seen[-1][6:] == (4, 2) and adm.pending == 2
    first.settle()
    first.settle()  # once only
    assert seen[-1][6:] == (4, 1) and adm.pending == 1
    adm.acquire()
    second.settle()
    assert seen[-1][1] == 1 and seen[-1][6:] == (4, 0)


def test_min_rtt_is_measured_again_only_while_it_could_change_the_target() -> None:
    """With a budget above ``min_rtt x (1 + rtt_tolerance)`` the target is the budget: a contended limit is not held
    at ``min_limit`` after the interval (the refusals would buy nothing). It is measured again once the limit sits at
    its floor (the unloaded round trip may have grown past the budget), or where the minimum decides the target."""
    clock = Clock()
    lim = _measured(clock, rtt=0.01, rtt_budget_s=0.1, floor_limit=4, min_rtt_interval_s=5.0)
    assert not lim.min_rtt_may_decide()  # 0.015 s < 0.1 s
    _contend(lim)
    clock.now += 6.0
    for _ in range(4):
        _round_trip(lim, clock, 0.05)  # within the budget: the limit grows, and no measurement
    assert lim.phase is Phase.ADAPTING and lim.limit > 4
    limits = []
    # contended, round trips of 1 s at any concurrency: the limit halves down to its floor
    for _ in range(40):
        _contend(lim)
        limits.append(lim.limit)
        for _ in range(4):
            _round_trip(lim, clock, 1.0)
        if lim.phase is Phase.MEASURING:
            break
    assert len(limits) > 5 and min(limits) > 4  # window after window above the floor: no measurement
    assert lim.phase is Phase.MEASURING and lim.limit == 2  # at the floor, contended: measured again
    for _ in range(4):
        _round_trip(lim, clock, 0.3)  # the unloaded round trip grew past the budget
    assert lim.min_rtt == pytest.approx(0.3) and lim.min_rtt_may_decide()
    # where the minimum decides the target (no budget), it is measured again after every interval, as before
    near = _measured(Clock(), rtt=0.08, rtt_budget_s=0.1, min_rtt_interval_s=5.0)
    assert near.min_rtt_may_decide()  # 0.08 x 1.5 >= 0.1
