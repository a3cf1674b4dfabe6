"""gateway.coalesce: merged batches equal the concatenated requests; the delay bound with an injected scheduler; real
demo backends give the same predictions coalesced and not."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.coalesce import Coalescer, merge_batches, split_outputs
from gateway.core.requests import VersionSpec
from gateway.errors import Unavailable
from gateway.features import FeatureBatch, batch_from_instances
from tests.gateway.test_features_fast import MANIFEST, _well_formed

# -- merging -------------------------------------------------------------------------------------------------------


def _bits(batch: FeatureBatch) -> dict[str, Any]:
    out: dict[str, Any] = {"size": batch.size}
    for name, s in batch.sparse.items():
        w = None if s.weights is None else s.weights.tobytes()
        out[name] = (s.ids.tobytes(), s.row_splits.tobytes(), w)
    for name, d in batch.dense.items():
        out[name] = (d.shape, d.tobytes())
    return out


def _uniform(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Weights everywhere (1 where missing), so one batch of all examples is well defined."""
    out = []
    for e in examples:
        e = dict(e)
        e.setdefault("item_w", 1)
        e.setdefault("genres_w", [1] * len(e["genres"]))
        out.append(e)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_well_formed(), min_size=1, max_size=4), min_size=1, max_size=4))
def test_merged_batches_equal_one_batch_of_all_examples(groups: list[list[dict[str, Any]]]) -> None:
    batches = [batch_from_instances(g, MANIFEST) for g in groups]
    merged = merge_batches(batches)
    whole = batch_from_instances(_uniform([e for g in groups for e in g]), MANIFEST)
    got, want = _bits(merged), _bits(whole)
    for name, s in merged.sparse.items():  # weights are None where no request sent any: compare as all ones
        if s.weights is None and whole.sparse[name].weights is not None:
            got[name] = (*got[name][:2], np.ones(s.ids.size, np.float32).tobytes())
    assert got == want


def test_split_outputs_by_example_counts() -> None:
    out = {"score": np.arange(6.0).reshape(6, 1), "emb": np.arange(12.0).reshape(6, 2)}
    parts = split_outputs(out, [1, 3, 2])
    assert parts is not None
    assert [p["score"].ravel().tolist() for p in parts] == [[0.0], [1.0, 2.0, 3.0], [4.0, 5.0]]
    assert split_outputs({"scalar": np.float32(1.0) * np.ones(())}, [1, 2]) is None


# -- the delay bound, event-driven ---------------------------------------------------------------------------------


class _Scheduler:
    """Records each requested delay; ``fire()`` runs the callbacks (the clock never moves by itself)."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> Any:
        self.pending.append((delay, callback))
        return None

    def fire(self) -> None:
        pending, self.pending = self.pending, []
        for _, cb in pending:
            cb()


class _Backend:
    """Answers score = user id; the first call (the "busy" request a test starts with) waits for ``release``."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail
        self.release = asyncio.Event()

    async def run(
        self, batch: FeatureBatch, version: VersionSpec, deadline: float
    ) -> tuple[dict[str, Any], str]:
        self.calls.append(batch.size)
        if len(self.calls) == 1:
            await self.release.wait()
        if self.fail:
            raise Unavailable("PS shard 1 is unavailable")
        ids = batch.sparse["user"].ids.astype(np.float64)
        return {"score": ids.reshape(-1, 1)}, "7"


def _batch(*users: int) -> FeatureBatch:
    rows = [{"user": u, "item": 1, "genres": [], "tags": [], "age": 0.0, "ctx": [0, 0]} for u in users]
    return batch_from_instances(rows, MANIFEST)


def _told(runs: list[tuple[int, str]]) -> Callable[[int, str], None]:
    """An ``observe`` that records each run's (requests, trigger)."""
    return lambda n, trigger: runs.append((n, trigger))


async def _busy(c: Coalescer, backend: _Backend) -> asyncio.Future[Any]:
    """A first request, running until ``backend.release`` is set; it went at once (nothing ran or waited)."""
    busy = asyncio.ensure_future(c.submit(_batch(0), VersionSpec(), time.monotonic() + 30))
    while not backend.calls:
        await asyncio.sleep(0)
    assert c.dispatched == 0
    return busy


async def test_a_lone_request_goes_at_once() -> None:
    sched, backend = _Scheduler(), _Backend()
    backend.release.set()
    runs: list[tuple[int, str]] = []
    c = Coalescer(backend.run, max_delay_s=10.0, max_batch=100, call_later=sched, observe=_told(runs))
    out, _ = await c.submit(_batch(5), VersionSpec(), time.monotonic() + 30)
    assert out["score"].ravel().tolist() == [5.0] and sched.pending == []
    assert runs == [(1, "alone")]


async def test_requests_are_dispatched_within_max_delay_and_split_back() -> None:
    sched, backend = _Scheduler(), _Backend()
    runs: list[tuple[int, str]] = []
    c = Coalescer(backend.run, max_delay_s=0.002, max_batch=100, call_later=sched, observe=_told(runs))
    busy = await _busy(c, backend)
    deadline = time.monotonic() + 30
    a = asyncio.ensure_future(c.submit(_batch(1, 2), VersionSpec(), deadline))
    b = asyncio.ensure_future(c.submit(_batch(3), VersionSpec(), deadline))
    other_version = asyncio.ensure_future(c.submit(_batch(9), 5, deadline))
    await asyncio.sleep(0)
    # each group asked to be dispatched max_delay after its first request arrived; nothing else ran meanwhile
    assert [d for d, _ in sched.pending] == [0.002, 0.002] and backend.calls == [1]
    sched.fire()  # max_delay passed while the busy run still goes: both groups are sent
    (ra, va), (rb, _), (rc, _) = await asyncio.gather(a, b, other_version)
    assert sorted(backend.calls[1:]) == [
        1,
        3,
    ]  # one call for the two latest-version requests, one for version 5
    assert ra["score"].ravel().tolist() == [1.0, 2.0] and rb["score"].ravel().tolist() == [3.0] and va == "7"
    assert rc["score"].ravel().tolist() == [9.0]
    assert sorted(runs) == [(1, "alone"), (1, "timer"), (2, "timer")]
    backend.release.set()
    await busy


async def test_a_full_group_goes_at_once_and_big_requests_alone() -> None:
    sched, backend = _Scheduler(), _Backend()
    runs: list[tuple[int, str]] = []
    c = Coalescer(backend.run, max_delay_s=1.0, max_batch=3, call_later=sched, observe=_told(runs))
    busy = await _busy(c, backend)
    deadline = time.monotonic() + 30
    first = asyncio.ensure_future(c.submit(_batch(1, 2), VersionSpec(), deadline))
    await asyncio.sleep(0)
    full, _ = await asyncio.gather(
        c.submit(_batch(3), VersionSpec(), deadline), first
    )  # 3 examples: no timer needed
    assert backend.calls == [1, 3] and full[0]["score"].ravel().tolist() == [3.0]
    await c.submit(_batch(4, 5, 6, 7), VersionSpec(), deadline)
    assert backend.calls == [1, 3, 4]
    assert runs == [(1, "alone"), (2, "full"), (1, "big")]
    backend.release.set()
    await busy


async def test_waiting_requests_go_when_the_run_in_flight_finishes() -> None:
    sched, backend = _Scheduler(), _Backend()
    runs: list[tuple[int, str]] = []
    c = Coalescer(backend.run, max_delay_s=10.0, max_batch=100, call_later=sched, observe=_told(runs))
    busy = await _busy(c, backend)
    deadline = time.monotonic() + 30
    waiting = [asyncio.ensure_future(c.submit(_batch(i), VersionSpec(), deadline)) for i in (1, 2)]
    await asyncio.sleep(0)
    backend.release.set()  # the timer never fires: the end of the busy run sends the group
    results = await asyncio.gather(busy, *waiting)
    assert [r[0]["score"].ravel().tolist() for r in results] == [[0.0], [1.0], [2.0]]
    assert backend.calls == [1, 2]
    assert runs == [(1, "alone"), (2, "idle")]


async def test_a_backend_error_reaches_every_request_of_the_group() -> None:
    sched, backend = _Scheduler(), _Backend(fail=True)
    c = Coalescer(backend.run, max_delay_s=0.001, max_batch=10, call_later=sched)
    busy = await _busy(c, backend)
    deadline = time.monotonic() + 30
    jobs = [asyncio.ensure_future(c.submit(_batch(i), VersionSpec(), deadline)) for i in range(3)]
    await asyncio.sleep(0)
    sched.fire()
    results = await asyncio.gather(*jobs, return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results) and backend.calls == [1, 3]
    backend.release.set()
    with pytest.raises(Unavailable):
        await busy


# -- real backends -------------------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_coalesced_predictions_equal_uncoalesced(demo_artifacts: Any, demo_backends: Any) -> None:
    from gateway.app import create_app
    from schemas.gateway_settings import GatewaySettings
    from tests.gateway.test_rest_embedding import embedding_model

    model = embedding_model(demo_artifacts, demo_backends.target)
    url = f"/v1/models/{model['name']}:predict"
    bodies = [json.dumps({"instances": [inst]}) for inst in demo_artifacts.instances[:6]]
    answers: dict[bool, list[Any]] = {}
    for on in (False, True):
        coalesce = {"max_delay_ms": 50, "max_batch": 64} if on else {}
        app = create_app(GatewaySettings(models=[model], coalesce=coalesce))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                replies = await asyncio.gather(*(client.post(url, content=b) for b in bodies))
            servable = app.state.runtime.gateway.servables[model["name"]]
            if on:
                assert 1 <= servable.coalescer.dispatched < len(bodies), servable.coalescer.dispatched
                # every request was served by one entry call, and the metric counts each call once
                metrics = app.state.runtime.metrics.render().decode()
                sums = re.findall(
                    rf'embedgate_coalesced_requests_(sum|count){{model="{model["name"]}",trigger="(\w+)"}} (\S+)',
                    metrics,
                )
                assert sum(float(v) for kind, _, v in sums if kind == "sum") == len(bodies), sums
                calls = sum(float(v) for kind, _, v in sums if kind == "count")
                assert calls == servable.coalescer.dispatched + sum(
                    float(v) for kind, t, v in sums if kind == "count" and t in ("alone", "big")
                ), sums
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        answers[on] = [r.json()["predictions"] for r in replies]
    np.testing.assert_allclose(
        np.asarray(answers[True], dtype=np.float64), np.asarray(answers[False], dtype=np.float64), rtol=1e-6
    )
