"""gateway.limits and errors.public_message: pure parts (depth on raw bytes, structure checks, budgets, scrubbing)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import limits
from gateway.errors import InvalidArgument, PayloadTooLarge, ResourceExhausted, public_message
from gateway.limits import BufferedBytes, check_structure, json_depth, offload, parse_json, request_scope
from schemas.gateway_settings import LimitsSettings


def _depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_json_depth_ignores_brackets_in_strings(value: Any) -> None:
    data = json.dumps(value).encode()
    assert json_depth(data) == _depth(value)
    assert json_depth(data[:1] + data[1:]) == _depth(value)


def test_json_depth_string_state_crosses_chunk_boundaries() -> None:
    chunk = 1 << 20
    for cut in (
        chunk - 3,
        chunk - 2,
        chunk - 1,
        chunk,
    ):  # quote / escaped quote / backslash run at the boundary
        for inner in ('"' + "a" * (cut - 10) + '\\\\" , "]]]]"', '"' + "a" * (cut - 10) + '\\"]]]" , "x"'):
            doc = "[[" + inner + ", [[[1]]]]]"
            assert json_depth(doc.encode()) == _depth(json.loads(doc)), cut


def test_json_depth_across_chunks() -> None:
    data = b"[" * 3000 + b" " * (3 << 20) + b"]" * 3000
    assert json_depth(data) == 3000
    hidden = b'["' + b"]" * 5000 + b'", ' + b"[" * 40 + b"]" * 41  # closing brackets in a string hide nothing
    assert json_depth(hidden) == 41


async def test_parse_json_rejects_depth_and_lone_surrogates() -> None:
    with pytest.raises(InvalidArgument, match="limits.max_json_depth"):
        await parse_json(b'{"a": ' + b"[" * 33 + b"]" * 33 + b"}")
    with pytest.raises(InvalidArgument, match="surrogate"):
        await parse_json(b'{"a": ["\\ud800"]}')
    with pytest.raises(InvalidArgument, match="surrogate"):
        await parse_json(b'{"a": [NaN], "\\udc01": 1}')  # the NaN takes the slower parser
    assert await parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}  # a proper pair is fine


def test_check_structure_names_the_limit() -> None:
    lim = LimitsSettings(max_instances=2, max_ids_per_feature=3)
    check_structure({"instances": [{"f": [1, 2, 3]}, [1, 2, 3]]}, lim)
    check_structure({"inputs": {"f": [[1, 2, 3], [1]]}, "context": {"c": [1, 2, 3]}}, lim)
    cases = [
        ({"instances": [1, 2, 3]}, "limits.max_instances"),
        ({"examples": [{}, {}, {}]}, "limits.max_instances"),
        ({"inputs": [1, 2, 3]}, "limits.max_instances"),
        ({"inputs": {"f": [1, 2, 3]}}, "limits.max_instances"),
        ({"instances": [{"f": [1, 2, 3, 4]}]}, "feature 'f' at example 0 has 4 values"),
        ({"instances": [{"g": 1}, [1, 2, 3, 4]]}, "example 1"),
        ({"inputs": {"f": [[1], [1, 2, 3, 4]]}}, "feature 'f' at example 1"),
        ({"examples": [{}], "context": {"c": [1, 2, 3, 4]}}, "feature 'c'"),
    ]
    for doc, needle in cases:
        with pytest.raises(PayloadTooLarge, match=needle.replace("(", r"\(")):
            check_structure(doc, lim)


def test_buffered_bytes() -> None:
    b = BufferedBytes(10, retry_after=3)
    b.reserve(6)
    with pytest.raises(ResourceExhausted, match="max_buffered_bytes") as info:
        b.reserve(5)
    assert info.value.retry_after == 3
    b.release(6)
    b.reserve(10)


async def test_offload_runs_inline_unless_the_request_is_large() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    def where() -> str:
        return threading.current_thread().name

    main = threading.current_thread().name
    with ThreadPoolExecutor(1, thread_name_prefix="parse") as ex:
        assert await offload(where) == main
        with request_scope(LimitsSettings(offload_bytes=100), ex, 99):
            assert await offload(where) == main
        with request_scope(LimitsSettings(offload_bytes=100), ex, 100):
            assert (await offload(where)).startswith("parse")


@pytest.mark.parametrize(
    ("message", "leak"),
    [
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.1.2.3:8500: refused", "10.1.2.3"),
        ("Deadline exceeded before calling Predict on ps-0:8500", "ps-0"),
        ("DNS resolution failed for serving-entry.ns.svc.cluster.local:8500", "cluster.local"),
        ("connect to ipv6:[fe80::1%eth0]:8500 failed", "fe80"),
        ("unix:/var/run/tfs.sock: refused", "/var/run"),
        ("backend ps-0 is down", "ps-0"),
    ],
)
def test_public_message_removes_addresses(message: str, leak: str) -> None:
    out = public_message(message, ["ps-0:8500", "serving-entry:8500"])
    assert leak not in out and "<backend>" in out


@pytest.mark.parametrize(
    "message",
    [
        "JSON Parse error: Invalid value. at offset: 12",
        "feature 'user.id' at example 3: expected a list of int64 ids, got 1.5",
        "Failed to process element: 0 key: x of 'instances' list. Error: INVALID_ARGUMENT: ...",
        "Servable not found for request: Specific(half, 3)",
    ],
)
def test_public_message_keeps_ordinary_messages(message: str) -> None:
    assert public_message(message, ["ps-0:8500"]) == message


@settings(max_examples=200, deadline=None)
@given(_values)
def test_small_and_vectorised_depth_agree(value: Any) -> None:
    from gateway.limits import _small_depth

    data = json.dumps(value).encode()
    assert _small_depth(data) == json_depth(data) == _depth(value)


def test_public_message_keeps_bracketed_lists() -> None:
    msg = "no version served everywhere (entry: [2]; PS shard 0: [1, 2]; PS shard 1: [1])"
    assert public_message(msg, ["ps-0:8500"]) == msg


async def test_request_scope_takes_the_callers_threshold() -> None:
    """``offload_bytes=`` replaces ``limits.offload_bytes`` for one request (the gRPC front's plain messages)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    def where() -> str:
        return threading.current_thread().name

    main = threading.current_thread().name
    with ThreadPoolExecutor(1, thread_name_prefix="parse") as ex:
        with request_scope(LimitsSettings(offload_bytes=100), ex, 150, offload_bytes=200):
            assert await offload(where) == main
        with request_scope(LimitsSettings(offload_bytes=1000), ex, 200, offload_bytes=200):
            assert (await offload(where)).startswith("parse")


async def test_plain_scope_moves_the_threshold_to_plain_offload_bytes() -> None:
    """Inside a request scope, ``plain_scope`` makes the request large only from ``limits.plain_offload_bytes`` (an
    embedding model's REST body the native pass answered); outside any scope it changes nothing."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from gateway.limits import plain_scope

    def where() -> str:
        return threading.current_thread().name

    main = threading.current_thread().name
    limits = LimitsSettings(offload_bytes=100, plain_offload_bytes=1000)
    with ThreadPoolExecutor(1, thread_name_prefix="parse") as ex:
        with request_scope(limits, ex, 500):
            assert (await offload(where)).startswith("parse")
            with plain_scope(500):
                assert await offload(where) == main
            with plain_scope(1000):
                assert (await offload(where)).startswith("parse")
            assert (await offload(where)).startswith("parse")
        with plain_scope(5000):
            assert await offload(where) == main


class _Recorder:
    """An executor that records what it is given (this module's unit of work is the decision, not the trim)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> None:
        self.jobs.append((fn, args))


def test_memory_is_released_on_a_worker_only_after_a_body_large_enough_to_trim() -> None:
    big = limits._BIG_BODY
    pool = _Recorder()
    for n in (0, 1, 200_000, big - 1):  # a job per ordinary request handed the GIL to a worker each time
        limits.release_memory_soon(pool, n)  # type: ignore[arg-type]
    assert pool.jobs == []
    limits.release_memory_soon(pool, big)  # type: ignore[arg-type]
    assert pool.jobs == [(limits.release_memory, (big,))]
    limits.release_memory_soon(None, big)  # no executor: nothing to do, no error
