"""Publishing by the model's own keys: ``model_keys`` / ``table_mappings`` and ``embedgate publish --key``.

The PS keys must be exactly what the gateway looks up for the same raw value (``LookupMapping.keys_for``); a raw
``--id`` to a table behind a lookup layer, and a value outside the vocabulary, are refused with a message saying so.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from gateway.lookup_mapping import (
    OOV_KEY,
    HashInput,
    LookupKind,
    LookupMapping,
    dump_lookups,
    string_key,
)
from schemas.deltas import decode_delta
from schemas.manifest import Manifest
from tests.support.kafka import Broker
from updater.producer import KeyedTableError, model_keys, table_mappings

_REPO = Path(__file__).resolve().parents[2]
_VOCAB = ["cat_01", "cat_02", "cat_03"]

MANIFEST = Manifest.model_validate(
    {
        "model_name": "kemb",
        "version": 1,
        "tables": [
            {"name": "cat_emb", "dim": 2},
            {"name": "item_emb", "dim": 2},
            {"name": "h_emb", "dim": 2},
        ],
        "sparse_features": [
            {"name": "category", "table": "cat_emb"},
            {"name": "item_id", "table": "item_emb"},
            {"name": "tag", "table": "h_emb"},
        ],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "p", "shape": [1]}]},
    }
)
STRING = LookupMapping("category", LookupKind.STRING, "cat_lookup", np.sort([string_key(v) for v in _VOCAB]))
HASHING = LookupMapping(
    "tag", LookupKind.HASHING, "tag_hash", np.zeros(0, np.int64), OOV_KEY, 7, HashInput.STRING, None
)


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "kemb"
    d.mkdir()
    (d / "manifest.json").write_text(MANIFEST.dumps())
    (d / "lookups.json").write_text(dump_lookups([STRING, HASHING]))
    return d


def test_table_mappings_follow_the_features() -> None:
    got = table_mappings(MANIFEST, {"category": STRING, "tag": HASHING})
    assert got == {"cat_emb": STRING, "h_emb": HASHING}


def test_model_keys_match_the_gateway() -> None:
    assert (
        model_keys("cat_emb", STRING, ["cat_02", "cat_01"]).tolist()
        == STRING.keys_for(["cat_02", "cat_01"]).tolist()
    )
    assert model_keys("cat_emb", STRING, ["cat_02"]).tolist() == [string_key("cat_02")]
    values = ["a", "b", "alice", "日本語"]
    assert model_keys("h_emb", HASHING, values).tolist() == HASHING.keys_for(values).tolist()


def test_model_keys_refuse_what_no_client_reads() -> None:
    with pytest.raises(
        KeyedTableError, match=r"'cat_99' \(value 1\) is not in the vocabulary of lookup layer 'cat_lookup'"
    ):
        model_keys("cat_emb", STRING, ["cat_01", "cat_99"])
    with pytest.raises(
        KeyedTableError, match=r"table 'cat_emb' \(behind layer 'cat_lookup'\).*expected a string"
    ):
        model_keys("cat_emb", STRING, [3])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "embedgate", "publish", *args],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_publish_cli_refuses_a_raw_id_for_a_keyed_table(tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    proc = _cli(
        "--bootstrap",
        "127.0.0.1:1",
        "--manifest",
        str(d),
        "--table",
        "cat_emb",
        "--id",
        "1",
        "--fill",
        "0.25",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "published" not in proc.stdout
    assert "keyed through lookup layer 'cat_lookup' (string)" in proc.stderr
    assert "--key cat_01" in proc.stderr
    oov = _cli("--manifest", str(d), "--table", "cat_emb", "--key", "nope", "--fill", "0.25")
    assert oov.returncode == 2 and "not in the vocabulary" in oov.stderr, oov.stderr
    plain = _cli("--manifest", str(d), "--table", "item_emb", "--key", "x", "--fill", "0.25")
    assert plain.returncode == 2 and "no lookup layer" in plain.stderr, plain.stderr


@pytest.mark.integration
async def test_publish_cli_by_key(kafka: Broker, unique: str, tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    topic = f"{unique}.deltas"
    common = ["--bootstrap", kafka.bootstrap, "--topic", topic, "--manifest", str(d)]
    first = _cli(*common, "--table", "cat_emb", "--key", "cat_01", "--key", "cat_03", "--fill", "0.25")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("published 2 rows of kemb.cat_emb")
    second = _cli(*common, "--table", "h_emb", "--key", "alice", "--delete")
    assert second.returncode == 0, second.stderr
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    ids: dict[str, list[int]] = {}
    try:
        deadline = time.monotonic() + 30
        while sum(len(v) for v in ids.values()) < 3 and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                for r in recs:
                    delta = decode_delta(r.value)
                    ids.setdefault(delta.table, []).extend(delta.ids.tolist())
    finally:
        await consumer.stop()
    assert sorted(ids["cat_emb"]) == sorted([string_key("cat_01"), string_key("cat_03")])
    assert ids["h_emb"] == HASHING.keys_for(["alice"]).tolist()
