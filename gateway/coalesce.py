"""Coalescing of concurrent embedding requests: one lookup per shard and one entry call for many requests.

:class:`Coalescer` sits in front of a servable's ``run(batch, version, deadline)``. Requests for the same model
version that arrive within ``max_delay_s`` of the first waiting one are concatenated into one
:class:`~gateway.features.FeatureBatch` (:func:`merge_batches`), run once, and the entry's outputs are split back
by example counts. A request that finds nothing running and nothing waiting goes at once, alone (one client pays
nothing); others wait until the runs in flight finish, until the waiting requests reach ``max_batch`` examples, or
for at most ``max_delay_s`` — the latency bound: a request is dispatched no later than ``max_delay_s`` after it
arrived. A request of ``max_batch`` examples or more is dispatched at once, alone. The coalesced run uses the latest deadline of its requests; each request still ends at its own
deadline. A backend error fails every request of the group with that error. Outputs without a leading batch
dimension cannot be split: the group is then run again request by request.

Task-safe on one event loop; no threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.errors import DeadlineExceeded
from gateway.features import FeatureBatch, SparseInput

__all__ = ["Coalescer", "merge_batches", "split_outputs"]

Outputs = tuple[Mapping[str, np.ndarray], str]
RunFn = Callable[[FeatureBatch, "VersionSpec", float], Awaitable[Outputs]]
CallLater = Callable[[float, Callable[[], None]], Any]
# told of every run as it starts: how many requests it serves and what sent it (``alone``: nothing was running or
# waiting; ``big``: a request of max_batch examples or more; ``full``: the group reached max_batch; ``idle``: the
# runs in flight finished; ``timer``: max_delay_s passed)
Observe = Callable[[int, str], None]

if TYPE_CHECKING:
    from gateway.core.requests import VersionSpec


def merge_batches(batches: list[FeatureBatch]) -> FeatureBatch:
    """One batch holding every example of ``batches`` in order (weights default to 1 where a batch sent none)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    sparse: dict[str, SparseInput] = {}
    for name in first.sparse:
        parts = [b.sparse[name] for b in batches]
        ids = np.concatenate([p.ids for p in parts])
        offsets = np.cumsum([0] + [p.ids.size for p in parts[:-1]])
        splits = np.concatenate(
            [parts[0].row_splits]
            + [p.row_splits[1:] + off for p, off in zip(parts[1:], offsets[1:], strict=True)]
        )
        weights = None
        if any(p.weights is not None for p in parts):
            weights = np.concatenate(
                [p.weights if p.weights is not None else np.ones(p.ids.size, dtype=np.float32) for p in parts]
            )
        sparse[name] = SparseInput(ids=ids, row_splits=splits, weights=weights)
    dense = {name: np.concatenate([b.dense[name] for b in batches]) for name in first.dense}
    return FeatureBatch(size=sum(b.size for b in batches), sparse=sparse, dense=dense)


def split_outputs(outputs: Mapping[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]] | None:
    """Per request, its rows of every output; None when an output has no leading batch dimension."""
    total = sum(sizes)
    if any(a.ndim == 0 or a.shape[0] != total for a in outputs.values()):
        return None
    bounds = np.cumsum([0, *sizes]).tolist()
    return [{k: a[bounds[i] : bounds[i + 1]] for k, a in outputs.items()} for i in range(len(sizes))]


def _retrieve(future: asyncio.Future[Outputs]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass(eq=False)
class _Waiting:
    batch: FeatureBatch
    deadline: float
    future: asyncio.Future[Outputs]


@dataclass(eq=False)
class _Group:
    waiting: list[_Waiting] = field(default_factory=list)
    examples: int = 0
    timer: Any = None


class Coalescer:
    """Coalesces calls of ``run``. ``call_later(delay_s, callback)`` schedules the group's dispatch (default: the
    running loop's ``call_later``; tests inject their own to check the bound without clocks). ``observe(requests,
    trigger)`` is told of every run as it starts (the gateway's ``embedgate_coalesced_requests`` metric)."""

    def __init__(
        self,
        run: RunFn,
        *,
        max_delay_s: float,
        max_batch: int,
        call_later: CallLater | None = None,
        observe: Observe | None = None,
    ) -> None:
        if max_delay_s <= 0 or max_batch <= 0:
            raise ValueError("max_delay_s and max_batch must be positive (0 means: build no Coalescer)")
        self._run = run
        self.max_delay_s = max_delay_s
        self.max_batch = max_batch
        self._call_later = call_later
        self._observe = observe
        self._groups: dict[VersionSpec, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.dispatched = 0  # coalesced runs started (tests and metrics read it)
        self._in_flight = 0  # runs started and not finished (coalesced or not)

    async def submit(self, batch: FeatureBatch, version: VersionSpec, deadline: float) -> Outputs:
        if batch.size >= self.max_batch or (self._in_flight == 0 and not self._groups):
            # alone (nothing running, nothing waiting) or big: no one to wait for, go now
            if self._observe is not None:
                self._observe(1, "big" if batch.size >= self.max_batch else "alone")
            self._in_flight += 1
            try:
                return await self._run(batch, version, deadline)
            finally:
                self._done()
        loop = asyncio.get_running_loop()
        group = self._groups.get(version)
        if group is None:
            group = self._groups[version] = _Group()
            later = self._call_later or loop.call_later
            group.timer = later(self.max_delay_s, lambda: self._dispatch(version, group, "timer"))
        if group.examples + batch.size > self.max_batch:  # would overflow: send the waiting ones now
            self._dispatch(version, group, "full")
            return await self.submit(batch, version, deadline)
        waiting = _Waiting(batch, deadline, loop.create_future())
        waiting.future.add_done_callback(_retrieve)  # a caller gone at its deadline leaves no unread error
        group.waiting.append(waiting)
        group.examples += batch.size
        if group.examples >= self.max_batch:
            self._dispatch(version, group, "full")
        try:
            return await asyncio.wait_for(
                asyncio.shield(waiting.future), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            raise DeadlineExceeded("Deadline exceeded while the request was coalesced with others") from None

    def _dispatch(self, version: VersionSpec, group: _Group, trigger: str) -> None:
        if self._groups.get(version) is not group:
            return  # already dispatched (the timer fired after the group filled up)
        del self._groups[version]
        if group.timer is not None and hasattr(group.timer, "cancel"):
            group.timer.cancel()
        if not group.waiting:
            return
        if self._observe is not None:
            self._observe(len(group.waiting), trigger)
        self.dispatched += 1
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._execute(version, group.waiting))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _done(self) -> None:
        """A run finished: waiting groups need not wait for their timers any more."""
        self._in_flight -= 1
        if self._in_flight == 0:
            for version, group in list(self._groups.items()):
                self._dispatch(version, group, "idle")

    async def _execute(self, version: VersionSpec, waiting: list[_Waiting]) -> None:
        try:
            await self._execute_group(version, waiting)
        finally:
            self._done()

    async def _execute_group(self, version: VersionSpec, waiting: list[_Waiting]) -> None:
        try:
            if len(waiting) == 1:
                results: list[Outputs] = [await self._run(waiting[0].batch, version, waiting[0].deadline)]
            else:
                merged = merge_batches([w.batch for w in waiting])
                outputs, answered = await self._run(merged, version, max(w.deadline for w in waiting))
                parts = split_outputs(outputs, [w.batch.size for w in waiting])
                if parts is None:
                    results = [await self._run(w.batch, version, w.deadline) for w in waiting]
                else:
                    results = [(p, answered) for p in parts]
        except Exception as exc:  # noqa: BLE001 - every request of the group gets the group's error
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        for w, result in zip(waiting, results, strict=True):
            if not w.future.done():
                w.future.set_result(result)
