"""The decoders' contract, whatever the bytes: a delta (or None for an HPS beacon) or a DeltaError naming the problem,
never another exception and never ``decoder_error`` (a crash the decoder did not name). A corpus of hostile messages
with the reason each must get, then hypothesis over mutated binary/JSON/HPS messages and generated hostile JSON.

``EMBEDGATE_FUZZ_EXAMPLES`` sets the examples per hypothesis test (default 1000, half for JSON objects: about 3000
messages in ``make test`` with the corpus and the nesting cases); the
100 000-message run is ``python -m tests.schemas.delta_fuzz --messages 100000`` (tests/schemas/delta_fuzz.py).
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.deltas import DECODER_ERROR, DeltaError, decode_delta
from tests.schemas.delta_fuzz import Message, hostile_corpus, judge, main, random_message

_EXAMPLES = int(os.environ.get("EMBEDGATE_FUZZ_EXAMPLES", "1000"))
_FUZZ = settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _holds(msg: Message) -> None:
    out = judge(msg)
    assert out.crash is None, (
        f"{msg.name}: {type(out.crash).__name__}: {out.crash} (value {msg.value!r:.200})"
    )


@pytest.mark.parametrize(("msg", "reason"), [pytest.param(m, r, id=m.name) for m, r in hostile_corpus()])
def test_each_hostile_message_is_refused_with_its_reason(msg: Message, reason: str) -> None:
    out = judge(msg)
    assert out.crash is None, repr(out.crash)
    assert out.reason == reason


def test_an_unexpected_exception_inside_a_decoder_becomes_a_decoder_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The boundary itself: whatever a decoder's insides raise (a bug, MemoryError) leaves it as a DeltaError."""
    import schemas.deltas as deltas

    def broken(buf: bytes) -> object:
        raise MemoryError

    monkeypatch.setattr(deltas, "_decode_binary", broken)
    with pytest.raises(DeltaError) as info:
        decode_delta(b"EGDM" + b"\0" * 40)
    assert info.value.reason == DECODER_ERROR and "MemoryError" in str(info.value)
    assert isinstance(info.value.__cause__, MemoryError)


@_FUZZ
@given(st.randoms(use_true_random=False))
def test_generated_hostile_messages(rnd: random.Random) -> None:
    _holds(random_message(rnd))


@_FUZZ
@given(st.binary(max_size=400), st.sampled_from([b"", b"EGDM", b"{", b"HCTR"]), st.booleans())
def test_arbitrary_bytes(body: bytes, prefix: bytes, hps: bool) -> None:
    _holds(Message("bytes", prefix + body, hps=hps))


_JSON_LEAVES = st.one_of(
    st.integers(-(2**200), 2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["ids", "values", "op", "x"]), inner)
    ),
    max_leaves=20,
)
_FIELDS = ["model", "table", "op", "ids", "values", "timestamp_ms", "sequence", "producer", "extra"]


@settings(_FUZZ, max_examples=max(1, _EXAMPLES // 2))
@given(st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=9))
def test_generated_json_objects(obj: dict[str, object]) -> None:
    import json

    base: dict[str, object] = {"model": "fz", "table": "item", "op": "upsert", "ids": [1]}
    base.update({"values": [[1.0, 2.0, 3.0, 4.0]], "timestamp_ms": 1})
    base.update(obj)
    text = json.dumps(base, allow_nan=True)
    _holds(Message("json", text.encode("utf-8", "surrogatepass")))


@pytest.mark.parametrize("depth", [1, 3, 4, 500, 990, 1000, 1010, 5000, 100_000])
@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ('{"a":', "}")])
@pytest.mark.parametrize("field", ["ids", "values", "model", "extra"])
def test_any_nesting_depth(depth: int, opener: str, closer: str, field: str) -> None:
    """Around the interpreter's recursion limit (1000) and far beyond it, in each kind of field."""
    _holds(Message("json-deep", f'{{"{field}":{opener * depth}1{closer * depth}}}'.encode()))
    _holds(Message("json-deep-unclosed", f'{{"{field}":{opener * depth}'.encode()))


def test_the_bounded_command_reports_no_crash(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m tests.schemas.delta_fuzz`` (the 100 000-message run) on a few messages: the corpus, then fuzz."""
    assert main(["--messages", "300", "--seed", "3"]) == 0
    assert "crashes: 0" in capsys.readouterr().out
