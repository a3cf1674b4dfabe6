"""Which model version a "latest" request of an embedding model is served at: one version for the entry and every
PS shard, so no answer mixes versions while a new one rolls out.

The exporter publishes ``ps_<i>/<N>`` first and ``entry/<N>`` last, and each backend loads versions on its own poll,
so for a while the PS shards and the entry may serve different sets of versions. A :class:`VersionPinner` resolves
the version once per request (a :class:`Pin`), and the servable sends it in the ``ModelSpec`` of every PS lookup and
of the entry call:

* normally the pin is the entry's latest AVAILABLE version (cached ``PIN_TTL_S``, then refreshed while requests go
  on at the previous pin, see :meth:`VersionPinner.current`; the entry goes last, so its latest version is the
  newest complete one);
* when a backend answers NOT_FOUND for the pinned version (a PS shard has not loaded it yet, or a version was
  unloaded), :meth:`VersionPinner.after_not_found` asks every backend (the entry and every replica of every shard
  that answers) which versions are AVAILABLE and pins the highest version all of them serve: the entry's latest
  again when it is served everywhere by now, else an older one marked ``degraded=DEGRADED_VERSION_FALLBACK``;
  with no version served everywhere it raises :class:`~gateway.errors.Unavailable` (retriable) naming the versions
  each backend serves.

After an entry-only export the entry's version ``M`` reads PS version ``P`` (``ps_of(M)``, from the manifests): "served
everywhere" then means the entry serves ``M`` and every shard serves ``P``. An entry version that ``ps_of`` marks
unservable (None: its PS layout disagrees) is never pinned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.core.modelspec import model_spec
from gateway.core.requests import VersionSpec
from gateway.core.servable import StatusClient
from gateway.errors import DeadlineExceeded, Unavailable
from schemas.proto import tfs_pb2

__all__ = ["DEGRADED_VERSION_FALLBACK", "PIN_TTL_S", "Pin", "VersionPinner"]

PIN_TTL_S = 1.0
"""How long a resolved pin is reused before the entry is asked again (seconds)."""

STALE_S = 5.0
"""How long past its ``ttl_s`` an expired pin still answers requests while its refresh is in flight (seconds)."""

REFRESH_S = 5.0
"""The least time a refresh is given to answer, whatever the deadline of the request that started it (seconds)."""

DEGRADED_VERSION_FALLBACK = "version_fallback"
"""Degraded reason: served at an older version than the entry's latest, because a PS shard lacks the latest."""


@dataclass(frozen=True)
class Pin:
    """The version one request is served at; ``degraded`` says why it is not the entry's latest (None: it is)."""

    version: int
    degraded: str | None = None

    @property
    def spec(self) -> VersionSpec:
        """The entry's version; the PS version follows from its manifest (``Manifest.ps_version_served``)."""
        return VersionSpec(version=self.version)


async def _available_versions(client: StatusClient, served: str, deadline: float) -> frozenset[int]:
    resp = await client.get_model_status(
        tfs_pb2.GetModelStatusRequest(model_spec=model_spec(served, VersionSpec())), deadline
    )
    return frozenset(
        int(s.version) for s in resp.model_version_status if s.state == tfs_pb2.ModelVersionStatus.AVAILABLE
    )


def _retrieve(task: asyncio.Task[Pin]) -> None:
    """A refresh's error is its waiters' (none when every request was answered with the previous pin)."""
    if not task.cancelled():
        task.exception()


def _no_served_observer(versions: frozenset[int]) -> None:
    return None


def _same_version(version: int) -> int | None:
    return version


class VersionPinner:
    """Pins of one embedding model: ``entry`` serves ``entry_name``; ``shards[i]`` is (served name, replicas).

    ``on_served(versions)`` is told the entry's AVAILABLE versions after each refresh (manifests of versions no
    longer served can be dropped). Task-safe within one event loop: one refresh is in flight at a time, and every
    request that waits for a refresh waits for that one and uses its result (see :meth:`current`).
    """

    def __init__(
        self,
        model: str,
        entry: StatusClient,
        entry_name: str,
        shards: Sequence[tuple[str, Sequence[StatusClient]]],
        *,
        ttl_s: float = PIN_TTL_S,
        on_served: Callable[[frozenset[int]], None] = _no_served_observer,
        ps_of: Callable[[int], int | None] = _same_version,
    ) -> None:
        self.model = model
        self._ps_of = ps_of
        self._entry = entry
        self._entry_name = entry_name
        self._shards = [(name, list(replicas)) for name, replicas in shards]
        self._ttl = ttl_s
        self._on_served = on_served
        self._pin: Pin | None = None
        self._until = 0.0
        self._checked = False  # the pin came from asking every backend (_consistent)
        self._refresh: asyncio.Task[Pin] | None = None  # the refresh of current() in flight
        self._check: asyncio.Task[Pin] | None = None  # the check of after_not_found() in flight

    def _fresh(self) -> Pin | None:
        return self._pin if self._pin is not None and self._until > time.monotonic() else None

    def _set(self, pin: Pin, checked: bool) -> Pin:
        self._pin, self._until, self._checked = pin, time.monotonic() + self._ttl, checked
        return pin

    def _start(self, full: bool, deadline: float) -> asyncio.Task[Pin]:
        """The refresh (``full``: the check of every backend) in flight, or a new one; the pin it resolves is
        cached. It belongs to no request: it has at least :data:`REFRESH_S` (a caller with a short deadline does
        not fail the others waiting for it), and a caller that stops waiting does not cancel it."""
        task = self._check if full else self._refresh
        if task is not None:
            return task
        budget = max(deadline, time.monotonic() + REFRESH_S)

        async def run() -> Pin:
            try:
                checked = full or (self._pin is not None and self._pin.degraded is not None)
                pin = await (self._consistent(budget) if checked else self._latest(budget))
                return self._set(pin, checked)
            finally:
                if full:
                    self._check = None
                else:
                    self._refresh = None

        task = asyncio.ensure_future(run())
        task.add_done_callback(_retrieve)
        if full:
            self._check = task
        else:
            self._refresh = task
        return task

    async def _wait(self, task: asyncio.Task[Pin], deadline: float) -> Pin:
        """``task``'s pin, waited for no longer than ``deadline`` (then DEADLINE_EXCEEDED)."""
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise DeadlineExceeded(f"Deadline exceeded resolving the version of {self.model}") from None

    async def current(self, deadline: float) -> Pin:
        """The pin for a new "latest" request: the cached one while fresh (``ttl_s``). Past that one refresh asks
        the entry (every backend when the pin is degraded, to re-check it), and every request meanwhile is
        answered with the previous pin, for at most :data:`STALE_S` past its expiry: a request never waits for a
        refresh while a pin less stale than that exists, and concurrent requests never queue one after another
        (each waiting for the one before it to look at the pin cost a turn of the event loop: a pin expiring under
        1,000 requests/s made hundreds of them wait 1-4 s for their turns, issue 21's accepted p99). Without such
        a pin (the first request, or after refreshes that failed) requests wait for the refresh, all for the same
        one."""
        pin = self._fresh()
        if pin is not None:
            return pin
        task = self._start(False, deadline)
        stale = self._pin
        if stale is not None and time.monotonic() - self._until < STALE_S:
            return stale
        return await self._wait(task, deadline)

    async def _latest(self, deadline: float) -> Pin:
        """The entry's latest AVAILABLE version that can be served (degraded when it is not its latest)."""
        entry = await _available_versions(self._entry, self._entry_name, deadline)
        self._on_served(entry)
        servable = [v for v in entry if self._ps_of(v) is not None]
        if not servable:
            raise Unavailable(f"model {self.model}: the entry has no AVAILABLE version that can be served")
        best = max(servable)
        return Pin(best, None if best == max(entry) else DEGRADED_VERSION_FALLBACK)

    async def after_not_found(self, failed: Pin, deadline: float) -> Pin:
        """A backend answered NOT_FOUND for ``failed``'s version: the highest version every backend serves now.
        A check already in flight is waited for and its pin used when it differs from ``failed``; so is a fresh
        pin another check found; a pin only the entry was asked about is not (a shard may lack it)."""
        if self._check is not None:
            checked = await self._wait(self._check, deadline)
            if checked != failed:
                return checked
        fresh = self._fresh()
        if fresh is not None and fresh != failed and self._checked:
            return fresh  # another request checked meanwhile
        return await self._wait(self._start(True, deadline), deadline)

    async def _consistent(self, deadline: float) -> Pin:
        """The highest version the entry and every replica of every shard that answers serve (degraded when it is
        not the entry's latest)."""
        entry_task = _available_versions(self._entry, self._entry_name, deadline)
        shard_tasks = [self._shard_versions(name, replicas, deadline) for name, replicas in self._shards]
        entry, *shards = await asyncio.gather(entry_task, *shard_tasks)
        self._on_served(entry)
        common = set()
        for v in entry:
            ps = self._ps_of(v)
            if ps is not None and all(ps in versions for versions in shards):
                common.add(v)
        if entry and max(entry) in common:
            return Pin(max(entry))
        if common:
            return Pin(max(common), DEGRADED_VERSION_FALLBACK)
        served = "; ".join(
            [f"entry: {sorted(entry)}"] + [f"PS shard {i}: {sorted(v)}" for i, v in enumerate(shards)]
        )
        raise Unavailable(
            f"model {self.model}: no version is AVAILABLE on the entry and every PS shard at once ({served}); "
            "a new version is probably being loaded, retry later"
        )

    async def _shard_versions(
        self, served: str, replicas: Sequence[StatusClient], deadline: float
    ) -> frozenset[int]:
        """Versions AVAILABLE on every replica of a shard that answers (a request may reach any of them)."""
        answers = await asyncio.gather(
            *(_available_versions(r, served, deadline) for r in replicas), return_exceptions=True
        )
        sets = [a for a in answers if isinstance(a, frozenset)]
        if not sets:  # no replica answered: the first one's error
            err = answers[0]
            assert isinstance(err, BaseException)
            raise err
        out = sets[0]
        for s in sets[1:]:
            out &= s
        return out
