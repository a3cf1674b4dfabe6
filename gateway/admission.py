"""Admission control of both fronts: an adaptive concurrency limit and a short wait queue bounded in length and time.

Why: a gateway process does its work on one event loop. Past the number of requests the loop (and the backends) can
serve at once, admitting more only makes each one slower (they share the CPU): latency grows with the number in
flight, clients time out, work is done for nobody and goodput collapses. Admission keeps the number in flight near what
the process can serve and refuses the rest at once, cheaply (before the body is parsed), so a refused client learns it
in milliseconds and an admitted one is served at the unloaded speed.

* :class:`GradientLimit` (pure; time from the clock it is given): the concurrency limit. It starts at
  ``max_in_flight``; once a request finds it full, it measures, as Envoy's adaptive-concurrency filter does, the
  minimum round trip ``min_rtt`` (the median of ``admission.min_rtt_samples`` round trips of requests admitted while the
  limit is held at ``min_limit``; a measurement ends at the first answer after ``max_measure_s`` with the samples it
  has, or without any keeping the last ``min_rtt``; again every ``min_rtt_interval_s`` when the limit was reached
  meanwhile and a new ``min_rtt`` could change the target, :meth:`GradientLimit.min_rtt_may_decide`), then once per
  window of ``sample_window_s`` holding ``min_samples`` round trips sets
  ``limit = limit x gradient + sqrt(limit)`` with ``gradient = max(min_rtt x (1 + rtt_tolerance), rtt_budget_s) /
  median round trip``, the gradient clamped to [0.5, 2] and the limit to [``floor_limit``, ``max_in_flight``] (the
  budget and the floor: under CPU contention, e.g. while refusing a flood, every round trip grows and the gradient on
  ``min_rtt`` alone would hold the limit below the concurrency the backends need to serve at capacity, refusing good
  work; with the budget the limit grows until the median round trip reaches it). A round trip runs from
  admission to the answer; only requests answered OK are samples. With ``adaptive: false`` the limit is
  ``max_in_flight``.
* :class:`Admission` (one event loop, not thread-safe): admits while fewer than ``limit`` are in flight; otherwise a
  request waits in a FIFO queue of at most ``max_queue`` requests (and at most the current limit) for at most
  ``queue_timeout_s``. A request that finds
  the queue full is refused at once (reason ``queue_full``), one that waited the whole budget is shed
  (``queue_timeout``). Refusals are ``ResourceExhausted`` (HTTP 429, gRPC RESOURCE_EXHAUSTED) or ``Unavailable``
  (``overload_status: 503``), with ``Retry-After``; each is counted in ``embedgate_admission_shed_total{reason}``.
  Work the limit cannot see (requests waiting for the event loop before they reach admission, e.g. gRPC calls under
  a flood) shows as loop lag: while the loop runs more than ``max_loop_lag_s`` late (:meth:`Admission.watch_lag`,
  three measurements in a row), new requests are refused at once (``loop_lag``).
* :class:`Shedder` (REST): while a request would be refused anyway, refuses it before anything reads it, in the HTTP
  protocol (:mod:`gateway.http_protocol`) or in :class:`ShedMiddleware`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.codec.json_tensor import error_body
from gateway.errors import GatewayError, ResourceExhausted, Unavailable
from schemas.gateway_settings import AdmissionSettings

if TYPE_CHECKING:
    from gateway.metrics import Metrics

__all__ = [
    "JUDGED",
    "PENDING",
    "Admission",
    "GradientLimit",
    "Pending",
    "Phase",
    "ShedMiddleware",
    "Shedder",
    "settle",
]

JUDGED: Final = "embedgate.judged"  # ASGI scope key: let through at its head by the HTTP protocol (Shedder)
# ASGI scope key: the request's Pending, once its body is in (Shedder.pend); None once the request ended
PENDING: Final = "embedgate.pending"

_LAG_STREAK: Final = 3  # late lag measurements in a row that make the loop count as backlogged
_MIN_GRADIENT: Final = 0.5
_MAX_GRADIENT: Final = 2.0
_DRAIN_SAMPLES: Final = 32  # releases whose rate bounds the admission queue (Admission.queue_room)
_TRANSIT_MIN: Final = 8  # Admission.observe's bound: calls relayed and not yet seen by admission, at least
_REASON_CODES: Final = {None: 0, "queue_full": 1, "loop_lag": 2}  # Admission.observe

Observer = Callable[[int, int, int, int, int, int, int, int], None]


class Phase(enum.Enum):
    FIXED = "fixed"  # adaptive off: the limit is max_in_flight
    UNMEASURED = "unmeasured"  # the limit was never reached: it is max_in_flight, nothing measured yet
    MEASURING = "measuring"  # the limit is held at min_limit while min_rtt is measured
    ADAPTING = "adapting"  # the limit follows the gradient, once per sample window


class GradientLimit:
    """The concurrency limit and the count in flight (pure policy; ``clock()`` gives seconds, monotonic).

    :meth:`try_acquire` takes a slot when one is free; :meth:`release` gives it back with the request's admission time
    (``None``: not a sample, e.g. a failed request). Time only moves through ``clock``, so tests drive it by hand.
    """

    def __init__(
        self,
        max_limit: int,
        settings: AdmissionSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_limit = max_limit
        self.in_flight = 0
        self.min_rtt: float | None = None  # seconds; None until first measured
        self._clock = clock
        self._s = settings if settings is not None and settings.adaptive else None
        self.min_limit = min(self._s.min_limit, max_limit) if self._s is not None else max_limit
        self.floor = (
            min(max(self._s.floor_limit, self.min_limit), max_limit) if self._s is not None else max_limit
        )
        self._limit = float(max_limit)
        self._resume = float(max_limit)  # the limit to go back to after a measurement
        self._samples: list[float] = []
        self._since = 0.0  # MEASURING: only requests admitted from this time on are samples
        self._window_end = 0.0
        self._next_measure = 0.0
        self._contended = False  # a request found no free slot since min_rtt was last measured
        self.phase = Phase.FIXED if self._s is None else Phase.UNMEASURED

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return int(self._limit)

    def has_room(self) -> bool:
        return self.in_flight < int(self._limit)

    def try_acquire(self) -> bool:
        """Take a slot if one is free (True); else :meth:`note_contention` (False)."""
        if self.in_flight >= int(self._limit):
            self.note_contention()
            return False
        self.in_flight += 1
        return True

    def note_contention(self) -> None:
        """A request found the limit full. The first contention starts the first measurement of ``min_rtt``: a gateway
        that never ran out of slots never holds its limit down."""
        self._contended = True
        if self.phase is Phase.UNMEASURED:
            self._measure(self._clock())

    def mark_contended(self) -> bool:
        """:meth:`note_contention` for a caller on another thread: notes the contention (one flag, written under the
        interpreter lock) and says whether :meth:`note_contention` must still run on the owner's loop (True before
        the first measurement, which only that loop may start). A refusal from another thread so costs no wake-up of
        the owner's loop (it did on each refusal: a cross-thread call per refused gRPC call under a flood)."""
        self._contended = True
        return self.phase is Phase.UNMEASURED

    def release(self, admitted_at: float | None) -> None:
        """Give a slot back; ``admitted_at`` (the clock when it was taken) makes its round trip a sample."""
        self.in_flight -= 1
        if admitted_at is not None and self._s is not None:
            self._sample(admitted_at, self._clock())

    def _measure(self, now: float) -> None:
        self.phase = Phase.MEASURING
        self._limit = float(self.min_limit)
        self._samples = []
        self._since = now

    def _sample(self, admitted_at: float, now: float) -> None:
        s = self._s
        assert s is not None
        if self.phase is Phase.UNMEASURED:
            return
        if self.phase is Phase.MEASURING:
            # only requests admitted since the measurement began are samples (the others ran under the higher limit)
            if admitted_at >= self._since:
                self._samples.append(now - admitted_at)
            # late: it ends with what it has (a sample, or else the last min_rtt)
            late = now - self._since >= s.max_measure_s and (bool(self._samples) or self.min_rtt is not None)
            if late or len(self._samples) >= s.min_rtt_samples:
                if self._samples:
                    self.min_rtt = statistics.median(self._samples)
                self._samples = []
                self.phase = Phase.ADAPTING
                self._contended = False
                self._limit = self._resume
                self._window_end = now + s.sample_window_s
                self._next_measure = now + s.min_rtt_interval_s
            return
        self._samples.append(now - admitted_at)
        if now < self._window_end or len(self._samples) < s.min_samples:
            return
        rtt = statistics.median(self._samples)
        self._samples = []
        self._window_end = now + s.sample_window_s
        self._limit = self.next_limit(self._limit, rtt)
        if now >= self._next_measure and self._contended:  # without contention the limit does not matter
            if self.min_rtt_may_decide():
                self._resume = self._limit
                self._measure(now)
            else:  # a new min_rtt would not change the target: no limit held at min_limit for nothing
                self._next_measure = now + s.min_rtt_interval_s
                self._contended = False

    def min_rtt_may_decide(self) -> bool:
        """Whether measuring ``min_rtt`` again could change the gradient's target: ``min_rtt x (1 + rtt_tolerance)``
        is at or above ``rtt_budget_s`` (the minimum decides the target, not the budget), or the limit sits at its
        floor (round trips stay above the target at the least concurrency allowed: the unloaded round trip may have
        grown past the budget). Otherwise the target is the budget, and a measurement would only hold the limit at
        ``min_limit``, refusing nearly everything for up to ``max_measure_s`` (0.1-0.5 s every ``min_rtt_interval_s``
        under the overload benchmark's open loop)."""
        s = self._s
        assert s is not None
        if self.min_rtt is None:
            return True
        return self.min_rtt * (1.0 + s.rtt_tolerance) >= s.rtt_budget_s or self.limit <= self.floor

    def next_limit(self, limit: float, rtt: float) -> float:
        """The limit after a window whose median round trip was ``rtt`` seconds (the gradient rule above)."""
        assert self._s is not None and self.min_rtt is not None
        target = max(self.min_rtt * (1.0 + self._s.rtt_tolerance), self._s.rtt_budget_s)
        gradient = _MAX_GRADIENT if rtt <= 0 else min(_MAX_GRADIENT, max(_MIN_GRADIENT, target / rtt))
        new = limit * gradient + math.sqrt(limit)
        return min(float(self.max_limit), max(float(self.floor), new))


class Admission:
    """Admission of the requests of one app (REST and gRPC share it). One event loop; see the module docstring.

    ``settings`` None: a fixed limit of ``max_in_flight`` and no queue (refused at once). ``metrics`` receives the shed
    count by reason, the queue wait and the current limit.
    """

    def __init__(
        self,
        max_in_flight: int,
        status: int,
        retry_after: int,
        settings: AdmissionSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = GradientLimit(max_in_flight, settings, clock)
        self.max_in_flight = max_in_flight
        self._max_lag = settings.max_loop_lag_s if settings is not None else 0.0
        self.loop_lag = 0.0  # seconds: how late the event loop ran its last lag timer (see watch_lag)
        self._lagging = False  # the last _LAG_STREAK lag measurements were all above max_loop_lag_s
        self._queue_timeout = settings.queue_timeout_s if settings is not None else 0.0
        self._max_queue = settings.max_queue if settings is not None else 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # clock times of the last _DRAIN_SAMPLES releases: how fast slots free up, so how many waiters can be
        # admitted within queue_timeout_s (:attr:`queue_room`); written on this object's loop only
        self._releases: deque[float] = deque(maxlen=_DRAIN_SAMPLES)
        self._drain_room = self._max_queue  # waiters the measured release rate admits within queue_timeout_s
        self._status = status
        self._retry_after = retry_after
        self._metrics = metrics
        self._clock = clock
        self._shown_limit = -1
        self._observers: list[Observer] = []
        # requests let through at their head whose body is in and that admission has not counted yet (Pending)
        self.pending = 0
        self._show_limit()

    def observe(self, observer: Observer) -> None:
        """Tell ``observer`` this object's state now and after every change, until :meth:`unobserve` (the native
        gates: gRPC and REST, each one)."""
        self._observers.append(observer)
        self._publish()

    def unobserve(self, observer: Observer) -> None:
        """Stop telling ``observer`` (one given to :meth:`observe`)."""
        with contextlib.suppress(ValueError):
            self._observers.remove(observer)

    def _publish(self) -> None:
        """The state to every observer: (why a request arriving now would be refused: 0 admitted, 1 ``queue_full``,
        2 ``loop_lag``; in flight; the limit; waiting; the loop's lag in ms; a bound on the requests in flight,
        waiting or on their way: the limit plus :attr:`queue_room` plus a quarter of the limit, at least
        :data:`_TRANSIT_MIN`). A native gate refuses from it without Python. The bound keeps requests a gate relayed
        from piling up unseen in the Python server's queue, where admission would refuse them only after they waited
        (without it a gRPC refusal took 14 ms at 1.5x capacity, not 0.5); the margin is for the requests it has
        relayed that admission has not seen yet (without it a closed loop of 16 clients was refused while the limit
        was measured); the room, the requests admission holds at most (the limit plus :attr:`queue_room`); and the
        requests let through at their head whose body is in and that admission has not counted yet (:attr:`pending`).
        The REST gate refuses a request that the requests held, those pending and those whose body it sent up and that
        are not yet reported (:attr:`Shedder.on_seen`) would leave no room for: admission would refuse it on arrival,
        at about three times the CPU."""
        if not self._observers:
            return
        reason = self._reason()
        p = self.policy
        room = p.limit + (self.queue_room if self._queue_timeout > 0 else 0)
        state = (
            _REASON_CODES[reason],
            p.in_flight,
            p.limit,
            len(self._waiters),
            round(self.loop_lag * 1000),
            room + max(_TRANSIT_MIN, p.limit // 4),
            room,
            self.pending,
        )
        for obs in self._observers:
            obs(*state)

    @property
    def current(self) -> int:
        """Requests admitted and not yet released."""
        return self.policy.in_flight

    @property
    def limit(self) -> int:
        return self.policy.limit

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def queue_room(self) -> int:
        """Requests that may wait at once: ``max_queue``, never more than the current limit (a full queue holds about
        one round trip of work), and never more than slots free up in ``queue_timeout_s`` at the rate of the last
        :data:`_DRAIN_SAMPLES` releases (at least one): a waiter beyond that would most likely be shed after waiting
        the whole budget, so it is refused at once instead (``queue_full``). Under sustained overload the refusals
        are then immediate, not timeouts, and what waits is admitted within the budget."""
        return min(self._max_queue, self.policy.limit, self._drain_room)

    async def watch_lag(self, interval_s: float = 0.02) -> None:
        """Measure how late the event loop runs a timer, every ``interval_s``, into :attr:`loop_lag`; a loop late by
        more than ``max_loop_lag_s`` in ``_LAG_STREAK`` measurements in a row has a backlog of work (requests not yet
        seen by admission, e.g. calls waiting to start): new requests are then refused at once. A single late timer
        (the process descheduled on a busy machine) refuses nothing. Runs until cancelled (by the lifespan)."""
        loop = asyncio.get_running_loop()
        streak = 0
        while True:
            start = loop.time()
            await asyncio.sleep(interval_s)
            self.loop_lag = max(0.0, loop.time() - start - interval_s)
            streak = streak + 1 if self.loop_lag > self._max_lag else 0
            self._lagging = streak >= _LAG_STREAK
            if self._metrics is not None:
                self._metrics.admission_loop_lag.set(self.loop_lag)
            self._publish()

    def saturated(self) -> str | None:
        """Why a request arriving now would be refused at once (``loop_lag``; ``queue_full``: no free slot and the
        queue full or off), or None. Notes the contention in the policy, as a refused :meth:`admit` would."""
        reason = self._reason()
        if reason is not None:
            self.policy.note_contention()
            self._publish()
        return reason

    def refusal_from_thread(self, loop: asyncio.AbstractEventLoop) -> GatewayError | None:
        """:meth:`saturated` for a caller on another thread (the gRPC front's I/O thread): the refusal (counted as
        shed) of a request arriving now, or None. Only reads this object's state (a snapshot at most one request old);
        the contention is noted on ``loop``, the loop this object belongs to."""
        reason = self._reason()
        if reason is None:
            return None
        if self.policy.mark_contended():  # only the first contention needs the loop (it starts a measurement)
            loop.call_soon_threadsafe(self.policy.note_contention)
        return self._shed(reason)

    def _reason(self) -> str | None:
        if self._max_lag > 0 and self._lagging:
            return "loop_lag"
        if not self._waiters and self.policy.has_room():
            return None
        if self._queue_timeout > 0 and len(self._waiters) < self.queue_room:
            return None
        return "queue_full"

    def refuse(self, reason: str) -> GatewayError:
        """The refusal of a request :meth:`saturated` gave ``reason`` for (counted as shed). Safe from any thread: it
        only reads the state and counts (the gRPC front also refuses with ``receiving``)."""
        return self._shed(reason)

    def acquire(self) -> float:
        """Admit now or raise (never waits); returns the admission time (the clock's)."""
        if self._max_lag > 0 and self._lagging:
            raise self._shed("loop_lag")
        if self._waiters or not self.policy.try_acquire():
            self._publish()
            raise self._shed("queue_full")
        self._publish()
        return self._clock()

    async def admit(self) -> float:
        """Admit now, or after waiting in the queue (at most ``queue_timeout_s``); returns the admission time.

        Raises ResourceExhausted / Unavailable when refused. Cancelled while waiting: leaves the queue (or gives back a
        slot it was just handed) and re-raises."""
        if self._max_lag > 0 and self._lagging:
            self.policy.note_contention()
            raise self._shed("loop_lag")
        if not self._waiters and self.policy.try_acquire():
            self._publish()
            return self._clock()
        if self._queue_timeout <= 0 or len(self._waiters) >= self.queue_room:
            self._publish()
            raise self._shed("queue_full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._publish()
        start = self._clock()
        try:
            await asyncio.wait((fut,), timeout=self._queue_timeout)
        except BaseException:
            if fut.done() and not fut.cancelled():  # handed a slot just as it was cancelled
                self.release(None)
            else:
                self._drop(fut)
            raise
        finally:
            if self._metrics is not None:
                self._metrics.admission_wait.observe(self._clock() - start)
        if fut.done():
            return self._clock()
        self._drop(fut)
        raise self._shed("queue_timeout")

    def release(self, admitted_at: float | None) -> None:
        """Give a slot back (``admitted_at``: a round-trip sample, see :meth:`GradientLimit.release`); the oldest
        waiters get the slots now free."""
        self.policy.release(admitted_at)
        self._note_release()
        while self._waiters and self.policy.has_room():
            fut = self._waiters.popleft()
            if not fut.done() and self.policy.try_acquire():
                fut.set_result(None)
        self._show_limit()
        self._publish()

    def _note_release(self) -> None:
        """Record a release and, once :data:`_DRAIN_SAMPLES` are known, the queue room they give (see
        :attr:`queue_room`): releases per second over the last ones x ``queue_timeout_s``."""
        now = self._clock()
        rel = self._releases
        rel.append(now)
        if len(rel) == rel.maxlen:
            span = now - rel[0]
            room = (len(rel) - 1) * self._queue_timeout / span if span > 0 else math.inf
            self._drain_room = max(1, int(room + 1e-9)) if room < self._max_queue else self._max_queue

    def _drop(self, fut: asyncio.Future[None]) -> None:
        fut.cancel()
        with contextlib.suppress(ValueError):  # already taken off by release()
            self._waiters.remove(fut)
        self._publish()

    def _show_limit(self) -> None:
        if self._metrics is not None and self.policy.limit != self._shown_limit:
            self._shown_limit = self.policy.limit
            self._metrics.admission_limit.set(self._shown_limit)
            if self.policy.min_rtt is not None:
                self._metrics.admission_min_rtt.set(self.policy.min_rtt)

    def _shed(self, reason: str) -> GatewayError:
        if self._metrics is not None:
            self._metrics.admission_shed.labels(reason).inc()
        p = self.policy
        if reason == "loop_lag":
            msg = (
                f"Overloaded: the gateway is running {self.loop_lag * 1000:.0f} ms behind "
                f"(admission.max_loop_lag_s={self._max_lag:g}); retry later"
            )
        elif reason == "queue_timeout":
            msg = (
                f"Overloaded: no request slot became free within {self._queue_timeout:g} s "
                f"(admission.queue_timeout_s; concurrency limit {p.limit}, max_in_flight={self.max_in_flight}); "
                "retry later"
            )
        elif reason == "receiving":
            msg = (
                f"Too many requests being received at once: {self.max_in_flight} (max_in_flight); retry later"
            )
        else:
            msg = (
                f"Too many requests in flight: {p.in_flight} at the concurrency limit of {p.limit} "
                f"(max_in_flight={self.max_in_flight}), {len(self._waiters)} waiting (admission.max_queue); "
                "retry later"
            )
        err_cls = ResourceExhausted if self._status == 429 else Unavailable
        return err_cls(msg, retry_after=self._retry_after)


class Pending:
    """A ``/v1/...`` request let through at its head (:meth:`Shedder.refusal`) whose body is in and that admission
    has not counted yet (:meth:`Shedder.pend`): counted in :attr:`Admission.pending` until :meth:`settle` (once
    admission admitted, queued or refused it, or the request ended without that). The REST gate counts these as on
    their way to admission. A request whose body is still coming is not pending: a slow sender takes no room."""

    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission
        admission.pending += 1
        admission._publish()

    def settle(self) -> None:
        """No longer pending (only the first call counts)."""
        adm, self._admission = self._admission, None
        if adm is not None:
            adm.pending -= 1
            adm._publish()


def settle(scope: MutableMapping[str, Any]) -> None:
    """Settle the request's :class:`Pending` (``scope[PENDING]``), if it has one."""
    pending = scope.get(PENDING)
    if pending is not None:
        pending.settle()


class Shedder:
    """The early refusal of ``/v1/...`` requests while :meth:`Admission.saturated` says they would be refused anyway:
    before the request id, the token check, the body or the routing, so a refusal under overload costs as little as
    the HTTP server allows. Counted as shed (``queue_full`` / ``loop_lag``), rejected, and in ``requests_total`` as
    model ``_other``, api ``other``, outcome RESOURCE_EXHAUSTED / UNAVAILABLE. Without a token the answer is the same
    429 (it tells nothing about models). Used by :class:`ShedMiddleware` (any HTTP server) and by
    :class:`gateway.http_protocol.GatewayHttpProtocol` (before uvicorn builds the ASGI request)."""

    def __init__(self, admission: Admission, metrics: Metrics) -> None:
        self.admission = admission
        self.metrics = metrics
        # called once for each ``/v1/...`` request judged (at its refusal, when its body is in, or when it ended before
        # that): the native REST gate's ``seen`` while it relays to this server (it counts the requests it relayed
        # that are on their way to admission, and refuses those admission would)
        self.on_seen: Callable[[], None] | None = None

    def refusal(
        self, path: str, scope: MutableMapping[str, Any] | None = None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """(status, headers, body) refusing a request for ``path`` now, counted; None when it may go on. A ``/v1/...``
        request let through with its ``scope`` (the HTTP protocol, at its head) is marked :data:`JUDGED` there, so
        that :class:`ShedMiddleware` does not judge it again, and :meth:`pend` can count it once its body is in."""
        if path[:4].lower() != "/v1/":
            return None
        reason = self.admission.saturated()
        if reason is None:
            if scope is not None:  # reported to the gate when its body is in or it ends (pend, end)
                scope[JUDGED] = True
            else:
                self._seen()
            return None
        self._seen()
        err = self.admission.refuse(reason)
        self.metrics.rejected.inc()
        self.metrics.requests.labels("_other", "", "other", err.code.name).inc()
        body = error_body(err.message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if err.retry_after is not None:
            headers.append((b"retry-after", str(int(err.retry_after)).encode()))
        return err.http_status, headers, body

    def pend(self, scope: MutableMapping[str, Any]) -> None:
        """The request of ``scope`` has its body in (the HTTP protocol, at its end): if it was let through at its
        head it is :class:`Pending` until admission counts it (the route settles it) or it ends (ShedMiddleware)."""
        if scope.get(JUDGED) and PENDING not in scope:
            scope[PENDING] = Pending(self.admission)
            self._seen()

    def end(self, scope: MutableMapping[str, Any]) -> None:
        """The request of ``scope`` ended (ShedMiddleware): settle its :class:`Pending`; one let through at its head
        whose body never came in is reported to the gate now; a body completing after this makes nothing pending."""
        if scope.get(JUDGED) and PENDING not in scope:
            self._seen()
        settle(scope)
        scope[PENDING] = None

    def _seen(self) -> None:
        """One ``/v1/...`` request reported to :attr:`on_seen` (when set)."""
        if self.on_seen is not None:
            self.on_seen()


class ShedMiddleware:
    """ASGI middleware answering :class:`Shedder`'s refusals (outermost, so that they cost least), for the requests
    the HTTP protocol did not let through at their head (:data:`JUDGED`; uvicorn's h11 protocol, pipelined
    requests); it settles the request's :class:`Pending` when the request ends."""

    def __init__(self, app: ASGIApp, shedder: Shedder) -> None:
        self.app = app
        self.shedder = shedder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        judge = scope["type"] == "http" and not scope.get(JUDGED)
        refusal = self.shedder.refusal(scope["path"]) if judge else None
        if refusal is None:
            try:
                await self.app(scope, receive, send)
            finally:
                self.shedder.end(scope)
            return
        status, headers, body = refusal
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
