"""Hostile delta messages for the decoders' contract (only deltas or :class:`schemas.deltas.DeltaError`), shared by
the fuzz tests (tests/schemas/test_deltas_fuzz.py) and a bounded command that runs many of them:

    PYTHONPATH=$PWD .venv/bin/python -m tests.schemas.delta_fuzz --messages 100000 [--seed 1]

It prints how many messages decoded, how many were refused (per reason) and how many **crashed** (an exception other
than DeltaError, or a DeltaError whose reason is ``decoder_error``, i.e. one the decoder did not name); it exits 1 on
any crash. Messages come from a seeded generator: mutations of valid binary, JSON and HPS messages (flipped and
inserted bytes, cuts, header fields set to extremes, splices) and generated hostile JSON (deep nesting, long integers,
huge floats, NaN, non-UTF-8). Bounded by ``--messages``; no I/O but stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schemas.deltas import (
    DECODER_ERROR,
    DeltaError,
    DeltaOp,
    EmbeddingDelta,
    check_against_manifest,
    decode_delta,
    decode_hps,
    encode_delta,
    encode_delta_json,
    encode_hps,
)
from schemas.manifest import Manifest

__all__ = ["MANIFEST", "Message", "Outcome", "hostile_corpus", "judge", "main", "random_message"]

MANIFEST = Manifest.model_validate(
    {
        "model_name": "fz",
        "version": 1,
        "tables": [{"name": "item", "dim": 4}, {"name": "user", "dim": 3, "allow_nan": True}],
        "sparse_features": [{"name": "item_id", "table": "item"}, {"name": "user_id", "table": "user"}],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "p", "shape": [1]}]},
    }
)
HPS_TOPIC = "hps_et.fz.item"
_EXTREMES_U32 = (0, 1, 2, 3, 4, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1)
_EXTREMES_U8 = (0, 1, 63, 64, 65, 127, 128, 200, 255)
_EXTREMES_I64 = (0, 1, -1, 2**62, 2**63 - 1, -(2**63))


@dataclass(frozen=True)
class Message:
    """One record's value as a decoder sees it: ``hps`` selects :func:`decode_hps` on ``topic`` (with ``key``)."""

    name: str
    value: bytes | None
    hps: bool = False
    topic: str = HPS_TOPIC
    key: bytes | None = None


@dataclass(frozen=True)
class Outcome:
    """What a decoder did with one message: ``reason`` None = decoded (and checked against the manifest);
    ``crash`` = the exception that broke the contract (None: it held)."""

    reason: str | None
    crash: BaseException | None = None


def judge(msg: Message) -> Outcome:
    """Decode ``msg`` as the updater does (decoder, then the manifest check). Catches everything but a keyboard
    interrupt: a crash is reported, not raised."""
    try:
        if msg.hps:
            delta = decode_hps(msg.topic, msg.value, key=msg.key, timestamp_ms=5, sequence=7)
        else:
            delta = decode_delta(msg.value)
        if delta is not None:
            if not isinstance(delta, EmbeddingDelta):
                return Outcome(None, TypeError(f"decoder returned {type(delta).__name__}"))
            check_against_manifest(delta, MANIFEST)
    except DeltaError as exc:
        return Outcome(exc.reason, exc if exc.reason == DECODER_ERROR else None)
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - that is what is being looked for
        return Outcome(None, exc)
    return Outcome(None)


# -- valid seeds ----------------------------------------------------------------------------------------------------
def _delta(rng: random.Random, *, table: str = "item", n: int | None = None) -> EmbeddingDelta:
    n = n if n is not None else rng.randint(1, 6)
    dim = MANIFEST.table(table).dim
    op = DeltaOp.DELETE if rng.random() < 0.2 else DeltaOp.UPSERT
    values = np.asarray([[rng.uniform(-2, 2) for _ in range(dim)] for _ in range(n)], np.float32)
    return EmbeddingDelta(
        model="fz",
        table=table,
        op=op,
        ids=[rng.randint(-(2**63), 2**63 - 1) for _ in range(n)],
        values=values if op is DeltaOp.UPSERT else None,
        timestamp_ms=rng.randint(0, 2**41),
        sequence=rng.randint(0, 1000),
        producer=rng.choice(["", "trainer-0", "prod\u00e9"]),
    )


def _hps(rng: random.Random, n: int | None = None) -> bytes:
    n = n if n is not None else rng.randint(1, 6)
    return encode_hps(
        np.asarray([rng.randint(-(2**63), 2**63 - 1) for _ in range(n)], np.int64),
        np.asarray([[rng.uniform(-2, 2) for _ in range(4)] for _ in range(n)], np.float32),
    )


# -- mutations ------------------------------------------------------------------------------------------------------
def _flip(rng: random.Random, b: bytearray) -> None:
    if b:
        b[rng.randrange(len(b))] = rng.randrange(256)


def _insert(rng: random.Random, b: bytearray) -> None:
    at = rng.randint(0, len(b))
    b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))


def _cut(rng: random.Random, b: bytearray) -> None:
    del b[rng.randint(0, len(b)) :]


def _delete(rng: random.Random, b: bytearray) -> None:
    if b:
        at = rng.randrange(len(b))
        del b[at : at + rng.randint(1, 16)]


def _field(rng: random.Random, b: bytearray) -> None:
    """A header field of the binary format (or the HPS value size) set to an extreme."""
    fields = [(24, "<I", _EXTREMES_U32), (28, "<I", _EXTREMES_U32), (8, "<q", _EXTREMES_I64)]
    fields += [(16, "<q", _EXTREMES_I64), (32, "<B", _EXTREMES_U8), (33, "<B", _EXTREMES_U8)]
    fields += [(34, "<B", _EXTREMES_U8), (4, "<B", (0, 1, 2, 255)), (5, "<B", (0, 1, 2, 3, 255))]
    fields += [(4, "<I", _EXTREMES_U32)]  # HPS: bytes per vector
    at, fmt, values = rng.choice(fields)
    if at + struct.calcsize(fmt) <= len(b):
        struct.pack_into(fmt, b, at, rng.choice(values))


def _duplicate(rng: random.Random, b: bytearray) -> None:
    if b:
        start = rng.randrange(len(b))
        piece = b[start : start + rng.randint(1, 64)]
        at = rng.randint(0, len(b))
        b[at:at] = piece * rng.randint(1, 4)


_MUTATIONS: tuple[Callable[[random.Random, bytearray], None], ...] = (
    _flip,
    _flip,
    _insert,
    _cut,
    _delete,
    _field,
    _field,
    _duplicate,
)


def _mutated(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        rng.choice(_MUTATIONS)(rng, b)
    return bytes(b)


# -- hostile JSON ---------------------------------------------------------------------------------------------------
def _json_scalar(rng: random.Random) -> str:
    return rng.choice(
        [
            lambda: str(rng.randint(-(2**70), 2**70)),
            lambda: "9" * rng.choice((19, 20, 21, 64, 65, 4300, 4301, 5000, 20000)),
            lambda: "-" + "1" * rng.choice((20, 64, 5000)),
            lambda: f"{rng.uniform(-1, 1)}e{rng.randint(-400, 400)}",
            lambda: rng.choice(["NaN", "Infinity", "-Infinity", "1e39", "-3.5e38", "1e-50", "0.0"]),
            lambda: "1" * 5000 + ".5",
            lambda: json.dumps(rng.choice(["emb", "fz", "item", "upsert", "delete", "\ud800", "x" * 300])),
            lambda: rng.choice(["true", "false", "null", "[]", "{}"]),
        ]
    )()


def _json_value(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 3 or r < 0.5:
        return _json_scalar(rng)
    if r < 0.8:
        return "[" + ",".join(_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    keys = ["model", "table", "op", "ids", "values", "x"]
    return (
        "{"
        + ",".join(f'"{rng.choice(keys)}":{_json_value(rng, depth + 1)}' for _ in range(rng.randint(0, 3)))
        + "}"
    )


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice((50, 999, 1000, 1001, 5000, 100_000))
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    inner = opener * depth + "1" + closer * depth
    field = rng.choice(["ids", "values", "model", "extra"])
    return f'{{"{field}":{inner}}}'.encode()


def _hostile_json(rng: random.Random) -> bytes:
    good = json.loads(encode_delta_json(_delta(rng)))
    text = {k: json.dumps(v) for k, v in good.items()}
    for _ in range(rng.randint(1, 3)):
        text[rng.choice([*text, "extra"])] = _json_value(rng)
    out = ("{" + ",".join(f'"{k}":{v}' for k, v in text.items()) + "}").encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:
        out = _mutated(rng, out)
    return out


def random_message(rng: random.Random) -> Message:
    """One hostile message (see the module doc)."""
    kind = rng.random()
    if kind < 0.30:
        return Message("binary", _mutated(rng, encode_delta(_delta(rng))))
    if kind < 0.50:
        return Message("json", _hostile_json(rng))
    if kind < 0.58:
        return Message("json-nested", _nested(rng))
    if kind < 0.68:
        return Message("json-mutated", _mutated(rng, encode_delta_json(_delta(rng))))
    if kind < 0.85:
        return Message("hps", _mutated(rng, _hps(rng)), hps=True, key=None if rng.random() < 0.9 else b"k")
    if kind < 0.90:
        return Message(
            "hps-topic", _hps(rng), hps=True, topic=rng.choice(["hps_et..", "hps_et.a-b.c", "x", ""])
        )
    return Message("random", bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))))


# -- the corpus -----------------------------------------------------------------------------------------------------
def _json_with(**fields: object) -> bytes:
    body: dict[str, object] = {"model": "fz", "table": "item", "op": "upsert", "ids": [1]}
    body.update({"values": [[1.0, 2.0, 3.0, 4.0]], "timestamp_ms": 1})
    body.update(fields)
    return json.dumps(body).encode()


def _raw_json(ids: str = "[1]", values: str = "[[1,2,3,4]]", ts: str = "1", table: str = "item") -> bytes:
    return (
        f'{{"model":"fz","table":"{table}","op":"upsert","ids":{ids},"values":{values},"timestamp_ms":{ts}}}'
    ).encode()


def hostile_corpus() -> list[tuple[Message, str]]:
    """Named hostile messages and the reason each must be refused with."""
    rng = random.Random(0)
    good = encode_delta(_delta(rng, n=2))
    delete = encode_delta(_delta(rng, n=1).model_copy(update={"op": DeltaOp.DELETE, "values": None}))

    def patched(raw: bytes, at: int, fmt: str, value: int) -> bytes:
        b = bytearray(raw)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)

    named = encode_delta(_delta(rng, n=1).model_copy(update={"producer": "ab"}))
    at = 36 + len("fz") + len("item")
    bad_producer = named[:at] + b"\xff\xfe" + named[at + 2 :]
    deep = 100_000
    cases: list[tuple[Message, str]] = [
        (Message("empty", b""), "truncated"),
        (Message("null value", None), "bad_magic"),
        (Message("whitespace", b"   \n"), "bad_magic"),
        (Message("lone brace", b"{"), "invalid_json"),
        (Message("deep arrays in ids", _raw_json(ids="[" * deep + "]" * deep)), "invalid_json"),
        (Message("deep arrays in values", _raw_json(values="[" * deep + "]" * deep)), "invalid_json"),
        (Message("deep objects", b'{"a":' * deep + b"1" + b"}" * deep), "invalid_json"),
        (Message("deep, unclosed", b'{"ids":' + b"[" * deep), "invalid_json"),
        (Message("5,000-digit id", _raw_json(ids="[" + "9" * 5000 + "]")), "invalid_json"),
        (Message("5,000-digit timestamp", _raw_json(ts="9" * 5000)), "invalid_json"),
        (Message("5,000-digit value", _raw_json(values="[[" + "9" * 5000 + ",1,1,1]]")), "invalid_json"),
        (Message("negative 5,000-digit id", _raw_json(ids="[-" + "1" * 5000 + "]")), "invalid_json"),
        (Message("id above int64", _raw_json(ids="[9223372036854775808]")), "invalid_field"),
        (Message("timestamp above int64", _raw_json(ts="9223372036854775808")), "invalid_field"),
        (Message("float id", _raw_json(ids="[1.5e300]")), "invalid_json"),
        (Message("value 1e39", _raw_json(values="[[1e39,1,1,1]]")), "invalid_field"),
        (Message("value 1e400 (Inf)", _raw_json(values="[[1e400,1,1,1]]")), "nan_values"),
        (Message("5,000-digit float", _raw_json(values="[[" + "1" * 5000 + ".5,1,1,1]]")), "nan_values"),
        (Message("NaN value", _raw_json(values="[[NaN,1,1,1]]")), "nan_values"),
        (Message("Infinity value", _raw_json(values="[[-Infinity,1,1,1]]")), "nan_values"),
        (Message("NaN id", _raw_json(ids="[NaN]")), "invalid_json"),
        (Message("non-UTF-8 JSON", b'{"model":"\xff\xfe"}'), "invalid_json"),
        (Message("lone surrogate", _raw_json().replace(b'"fz"', b'"\\ud800"')), "invalid_field"),
        (Message("1 MB key", b'{"' + b"k" * 1_000_000 + b'":1}'), "invalid_json"),
        (Message("1 MB op", _json_with(op="o" * 1_000_000)), "unknown_op"),
        (Message("ragged rows", _raw_json(ids="[1,2]", values="[[1,2,3,4],[1]]")), "shape_mismatch"),
        (Message("rows not lists", _raw_json(values="[1,2,3,4]")), "invalid_json"),
        (Message("values an object", _raw_json(values='{"a":1}')), "invalid_json"),
        (Message("truncated binary", good[:-3]), "truncated"),
        (Message("header only", good[:36]), "truncated"),
        (Message("magic only", good[:4]), "truncated"),
        (Message("n = 2^32-1", patched(good, 24, "<I", 2**32 - 1)), "truncated"),
        (Message("dim = 2^32-1", patched(good, 28, "<I", 2**32 - 1)), "truncated"),
        (
            Message("n and dim 2^32-1", patched(patched(good, 24, "<I", 2**32 - 1), 28, "<I", 2**32 - 1)),
            "truncated",
        ),
        (Message("n = 0", patched(good, 24, "<I", 0)), "shape_mismatch"),
        (Message("model length 255", patched(good, 32, "<B", 255)), "truncated"),
        (Message("producer length 255", patched(good, 34, "<B", 255)), "truncated"),
        (Message("delete with dim", patched(delete, 28, "<I", 4)), "shape_mismatch"),
        (Message("trailing bytes", good + b"\0" * 8), "shape_mismatch"),
        (Message("timestamp -1", patched(good, 8, "<q", -1)), "invalid_field"),
        (Message("version 255", patched(good, 4, "<B", 255)), "bad_version"),
        (Message("non-UTF-8 producer", bad_producer), "invalid_field"),
        (Message("random bytes", bytes(range(256))), "bad_magic"),
        (Message("HPS on a delta topic", _hps(rng)), "bad_magic"),
        (Message("HPS empty", b"", hps=True), "truncated"),
        (Message("HPS truncated record", _hps(rng)[:-1], hps=True), "truncated"),
        (Message("HPS value size 0", patched(_hps(rng), 4, "<I", 0), hps=True), "shape_mismatch"),
        (
            Message("HPS value size 2^32-1", patched(_hps(rng), 4, "<I", 2**32 - 1), hps=True),
            "shape_mismatch",
        ),
        (Message("HPS value size 2^32-4", patched(_hps(rng), 4, "<I", 2**32 - 4), hps=True), "truncated"),
        (
            Message("HPS wrong dim", encode_hps(np.arange(2), np.ones((2, 5), np.float32)), hps=True),
            "dim_mismatch",
        ),
        (
            Message("HPS NaN", encode_hps(np.arange(1), np.full((1, 4), np.nan, np.float32)), hps=True),
            "nan_values",
        ),
        (Message("HPS with a key", _hps(rng), hps=True, key=b"k"), "unexpected_key"),
        (Message("HPS bad topic", _hps(rng), hps=True, topic="hps_et.fz"), "bad_topic"),
        (Message("HPS bad magic", b"XXXX" + _hps(rng)[4:], hps=True), "bad_magic"),
    ]
    return cases


# -- the command ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.schemas.delta_fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--messages", type=int, default=10_000, help="how many fuzzed messages (default 10000)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    outcomes: Counter[str] = Counter()
    crashes: list[tuple[Message, BaseException]] = []
    t0 = time.perf_counter()
    corpus = [m for m, _ in hostile_corpus()]
    for i in range(args.messages):
        msg = corpus[i] if i < len(corpus) else random_message(rng)
        out = judge(msg)
        if out.crash is not None:
            crashes.append((msg, out.crash))
            outcomes["CRASH"] += 1
        else:
            outcomes[out.reason or "decoded"] += 1
    took = time.perf_counter() - t0
    print(
        f"{args.messages} messages (seed {args.seed}, the first {len(corpus)} the hostile corpus) in {took:.1f} s"
    )
    for what, count in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {what:16} {count}")
    print(f"crashes: {len(crashes)}")
    for msg, exc in crashes[:10]:
        print(f"  {msg.name}: {type(exc).__name__}: {str(exc)[:200]} (value {msg.value!r:.120})")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
