"""Compressed REST bodies (issue 21): gzip/deflate inflated on the parse threads, streaming, within ``max_body_bytes``
and ``limits.max_decompression_ratio``; over either -> 413, refused after a few steps of work.

``inflate`` is tested as a pure function (a 1 GiB gzip bomb stops after about ``RATIO_FLOOR`` bytes: the count is in
the error), then through the app in process with the serve-local pass-through backend of ``tests.gateway.conftest``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import threading
import zlib
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import limits as limits_module
from gateway.errors import InvalidArgument, PayloadTooLarge
from gateway.limits import JOIN_OFF_LOOP_BYTES, RATIO_FLOOR, inflate
from tests.gateway.conftest import passthrough_models

_GIB = 1024 * 1024 * 1024
_MIB = 1024 * 1024
_WAIT_S = 60.0


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzip-compressed (about 1 MB), built in 1 MiB steps."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(_MIB)
    parts = [c.compress(zeros) for _ in range(1024)]
    parts.append(c.flush())
    return b"".join(parts)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)


# ---- inflate (pure) -----------------------------------------------------------------------------------------------


def test_gzip_bomb_stops_at_the_ratio_after_a_few_steps(gzip_bomb: bytes) -> None:
    assert len(gzip_bomb) < 2 * _MIB
    with pytest.raises(PayloadTooLarge, match="limits.max_decompression_ratio") as exc:
        inflate(gzip_bomb, "gzip", 64 * _MIB, 200)
    m = re.search(r"\((\d+) bytes from (\d+);", exc.value.message)
    assert m is not None, exc.value.message
    decompressed = int(m.group(1))
    assert RATIO_FLOOR < decompressed <= RATIO_FLOOR + _MIB, (
        decompressed
    )  # one step past the floor, not 1 GiB


def test_gzip_bomb_stops_at_the_size_limit_without_a_ratio(gzip_bomb: bytes) -> None:
    with pytest.raises(PayloadTooLarge, match=r"more than 8388608 bytes \(max_body_bytes\)"):
        inflate(gzip_bomb, "gzip", 8 * _MIB, 10**9)


def test_round_trips_and_exact_limits() -> None:
    data = json.dumps({"instances": [[i * 0.5, i] for i in range(20_000)]}).encode()
    assert inflate(gzip.compress(data), "gzip", len(data), 10**6) == data
    assert inflate(gzip.compress(data), "x-gzip", len(data), 10**6) == data
    assert inflate(_deflate(data), "deflate", len(data), 10**6) == data
    with pytest.raises(PayloadTooLarge, match="max_body_bytes"):
        inflate(gzip.compress(data), "gzip", len(data) - 1, 10**6)
    small = b"[" + b"0," * 100_000 + b"0]"  # compresses > 200x but stays under the floor: accepted
    assert len(small) < RATIO_FLOOR and len(small) > 200 * len(gzip.compress(small))
    assert inflate(gzip.compress(small), "gzip", 64 * _MIB, 200) == small


def test_bad_streams_are_invalid_argument() -> None:
    good = gzip.compress(b'{"instances": [1.0]}' * 100)
    for bad, text in (
        (good[: len(good) // 2], "truncated"),
        (good[:-9], "truncated"),
        (b"\x1f\x8b\x08\x00garbage-garbage", "Unable to decompress"),
        (b"not gzip at all", "Unable to decompress"),
    ):
        with pytest.raises(InvalidArgument, match=text):
            inflate(bad, "gzip", 64 * _MIB, 200)
    with pytest.raises(InvalidArgument, match="Unable to decompress the deflate"):
        inflate(good, "deflate", 64 * _MIB, 200)  # gzip framing is not the zlib format


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), limit=st.integers(0, 4000), garbage=st.binary(max_size=64))
def test_inflate_returns_the_data_or_a_gateway_error(data: bytes, limit: int, garbage: bytes) -> None:
    """Any valid stream inflates to its data within the limit (413 above); any bytes give the data, 400 or 413."""
    if len(data) <= limit:
        assert inflate(gzip.compress(data), "gzip", limit, 1) == data  # under the floor: no ratio
    else:
        with pytest.raises(PayloadTooLarge):
            inflate(gzip.compress(data), "gzip", limit, 1)
    for encoding in ("gzip", "deflate"):
        with suppress(InvalidArgument, PayloadTooLarge):
            inflate(garbage, encoding, limit, 1)


# ---- through the app --------------------------------------------------------------------------------------------


@asynccontextmanager
async def _app(backend: Any, **settings: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    from gateway.app import create_app
    from schemas.gateway_settings import GatewaySettings

    app = create_app(
        GatewaySettings.model_validate({"models": passthrough_models(backend.target), **settings})
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield app.state.runtime, client


_PATH = "/v1/models/half:predict"


async def test_rest_gzip_bomb_is_413_and_gives_its_budget_back(
    passthrough_backend: Any, gzip_bomb: bytes
) -> None:
    async with _app(passthrough_backend) as (rt, client):
        r = await client.post(_PATH, content=gzip_bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413, r.text
        assert "limits.max_decompression_ratio" in r.json()["error"]
        assert rt.buffered.current == 0
    async with _app(passthrough_backend, limits={"max_decompression_ratio": 10**6}) as (rt, client):
        r = await client.post(_PATH, content=gzip_bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["error"], r.text
        assert rt.buffered.current == 0


async def test_rest_gzip_and_deflate_bodies_are_answered(passthrough_backend: Any) -> None:
    body = json.dumps({"instances": [1.0, 2.0]}).encode()
    async with _app(passthrough_backend) as (_, client):
        for encoding, data in (
            ("gzip", gzip.compress(body)),
            ("deflate", _deflate(body)),
            ("GZIP", gzip.compress(body)),
        ):
            r = await client.post(_PATH, content=data, headers={"content-encoding": encoding})
            assert r.status_code == 200 and r.json() == {"predictions": [3.5, 4.0]}, (encoding, r.text)
        r = await client.post(
            _PATH, content=gzip.compress(gzip.compress(body)), headers={"content-encoding": "gzip, gzip"}
        )
        assert r.status_code == 400 and "only one compression" in r.json()["error"], r.text
        r = await client.post(_PATH, content=gzip.compress(body)[:-4], headers={"content-encoding": "gzip"})
        assert r.status_code == 400 and "truncated" in r.json()["error"], r.text


async def _healthy_while_held(
    client: httpx.AsyncClient,
    post: Coroutine[Any, Any, httpx.Response],
    started: threading.Event,
    release: threading.Event,
    never: str,
) -> httpx.Response:
    """``post``'s answer, sent while a step it reaches is held on its thread (``started`` once there, until
    ``release``): /healthz is answered meanwhile and the request is not."""
    task = asyncio.create_task(post)
    assert await asyncio.to_thread(started.wait, _WAIT_S), never
    health = await asyncio.wait_for(client.get("/healthz"), _WAIT_S)
    assert health.status_code == 200
    assert not task.done()
    release.set()
    return await asyncio.wait_for(task, _WAIT_S)


async def test_rest_gzip_is_inflated_on_a_parse_thread(
    passthrough_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inflate call is held on its thread (a parse thread, not the event loop's) while /healthz is answered."""
    started = threading.Event()
    release = threading.Event()
    threads: list[str] = []

    def held(*args: Any) -> bytes:
        threads.append(threading.current_thread().name)
        started.set()
        if not release.wait(_WAIT_S):
            raise TimeoutError("the test never released the inflate call")
        return inflate(*args)

    monkeypatch.setattr(limits_module, "inflate", held)
    body = gzip.compress(json.dumps({"instances": [1.0]}).encode())
    async with _app(passthrough_backend) as (_, client):
        post = client.post(_PATH, content=body, headers={"content-encoding": "gzip"})
        r = await _healthy_while_held(client, post, started, release, "the body was never inflated")
    assert r.status_code == 200 and r.json() == {"predictions": [3.5]}, r.text
    assert threads and threads[0].startswith("embedgate-parse"), threads


async def test_a_large_body_is_joined_on_a_parse_thread(
    passthrough_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of ``JOIN_OFF_LOOP_BYTES`` or more is joined from its chunks on a parse thread (one copy of tens of
    megabytes on the loop stalled every other request), while /healthz is answered; a small one on the loop."""
    started = threading.Event()
    release = threading.Event()
    threads: list[tuple[str, int]] = []

    def held(chunks: list[bytes]) -> bytes:
        size = sum(map(len, chunks))
        threads.append((threading.current_thread().name, size))
        if size >= JOIN_OFF_LOOP_BYTES:
            started.set()
            if not release.wait(_WAIT_S):
                raise TimeoutError("the test never released the join")
        return b"".join(chunks)

    monkeypatch.setattr(limits_module, "join_chunks", held)
    body = b'{"instances": [1.0]' + b" " * JOIN_OFF_LOOP_BYTES + b"}"
    async with _app(passthrough_backend) as (_, client):
        small = await client.post(_PATH, content=b'{"instances": [1.0]}')
        r = await _healthy_while_held(
            client, client.post(_PATH, content=body), started, release, "the body was never joined"
        )
    assert small.status_code == 200 and r.status_code == 200 and r.json() == {"predictions": [3.5]}, r.text
    (loop_thread, small_size), (parse_thread, large_size) = threads
    assert small_size < JOIN_OFF_LOOP_BYTES <= large_size
    assert parse_thread.startswith("embedgate-parse") and not loop_thread.startswith("embedgate-parse"), (
        threads
    )
