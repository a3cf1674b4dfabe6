"""Stream cuts without a broker: the command-line form, the exporter's check, the manifest field, and the CLI's
errors (a bad --stream-cut and an unreachable Kafka fail in one line before anything is exported)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from embedgate.cli import main
from embedgate.export.exporter import ExportError, check_stream_cut
from embedgate.export.streamcut import StreamCutError, format_stream_cut, parse_stream_cut
from schemas.manifest import Manifest
from tests.support.ports import free_port

_MANIFEST = {
    "model_name": "m",
    "version": 1,
    "tables": [{"name": "t", "dim": 2}],
    "sparse_features": [{"name": "f", "table": "t"}],
    "partition": {"num_shards": 2},
    "entry": {"outputs": [{"name": "p", "shape": [1]}]},
}


def test_parse_and_format_round_trip() -> None:
    cut = parse_stream_cut(" embedgate.deltas.m:0=12, embedgate.deltas.m:1=0,odd:topic:3=7")
    assert cut == {"embedgate.deltas.m:0": 12, "embedgate.deltas.m:1": 0, "odd:topic:3": 7}
    assert parse_stream_cut(format_stream_cut(cut)) == cut
    assert format_stream_cut({}) == ""


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("t:0", "t:0"),
        ("t=4", "t=4"),
        ("t:x=4", "t:x=4"),
        ("t:0=-1", "t:0=-1"),
        (":0=1", ":0=1"),
        ("t:0=1,,t:1=2", ""),
        ("t:0=1,t:0=2", "t:0=2"),
    ],
)
def test_parse_names_the_bad_item(text: str, bad: str) -> None:
    with pytest.raises(StreamCutError, match=f"item {bad!r}"):
        parse_stream_cut(text)


def test_exporter_checks_the_cut() -> None:
    assert check_stream_cut(None) == {}
    assert check_stream_cut({"t:1": 5}) == {"t:1": 5}
    with pytest.raises(ExportError, match="key 't' is not"):
        check_stream_cut({"t": 5})
    with pytest.raises(ExportError, match="offset -3"):
        check_stream_cut({"t:0": -3})
    with pytest.raises(ExportError, match="offset True"):
        check_stream_cut({"t:0": True})


def test_manifest_records_the_cut_and_checks_its_keys() -> None:
    assert Manifest.model_validate(_MANIFEST).stream_cut == {}  # older manifests: none
    m = Manifest.model_validate({**_MANIFEST, "stream_cut": {"embedgate.deltas.m:0": 4}})
    assert Manifest.model_validate_json(m.dumps()).stream_cut == {"embedgate.deltas.m:0": 4}
    with pytest.raises(ValueError, match="stream_cut"):
        Manifest.model_validate({**_MANIFEST, "stream_cut": {"nopartition": 4}})
    with pytest.raises(ValueError, match="stream_cut"):
        Manifest.model_validate({**_MANIFEST, "stream_cut": {"t:0": -1}})


def _decl(tmp_path: Path) -> Path:
    decl = tmp_path / "decl.yaml"
    decl.write_text(
        yaml.safe_dump({"model_name": "m", "sparse": [{"name": "f", "table": "t", "pooled": "v"}]})
    )
    return decl


def test_cli_rejects_a_bad_cut_before_exporting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["export", "--model", str(tmp_path / "absent.keras"), "--declaration", str(_decl(tmp_path))]
    args += ["--out", str(tmp_path / "out"), "--stream-cut", "t:0=1,t:zero=2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stream cut item 't:zero=2'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_auto_with_kafka_down_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    args = ["export", "--model", str(tmp_path / "absent.keras"), "--declaration", str(_decl(tmp_path))]
    args += ["--out", str(tmp_path / "out"), "--stream-cut", "auto", "--bootstrap", bootstrap]
    args += ["--kafka-timeout", "5"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"embedgate: error: --stream-cut auto: Kafka at {bootstrap}: ")
    assert err.endswith("nothing exported") and "\n" not in err
    assert not (tmp_path / "out").exists()
