"""GatewaySettings: YAML, env overrides (EMBEDGATE_, __ nesting), rejection of bad values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.deployment import EmbeddingModel, PassthroughModel
from schemas.gateway_settings import GatewaySettings, load_settings

YAML = """
port: 9000
request_timeout_s: 5
grpc:
  keepalive_time_s: 20
models:
  - kind: passthrough
    name: half
    target: 127.0.0.1:8500
    version_labels: {stable: 1}
  - kind: embedding
    name: demo
    manifest: models/demo
    entry: 127.0.0.1:8600
    shards:
      - replicas: [127.0.0.1:8601, 127.0.0.1:8602]
"""


def test_yaml_defaults_and_relative_manifest(tmp_path: Path) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text(YAML)
    s = load_settings(f)
    assert s.port == 9000 and s.request_timeout_s == 5 and s.grpc.keepalive_time_s == 20
    assert s.max_in_flight == 256 and s.log.format == "json" and s.host == "127.0.0.1"
    assert isinstance(s.models[0], PassthroughModel) and s.models[0].version_labels == {"stable": 1}
    emb = s.models[1]
    assert isinstance(emb, EmbeddingModel) and emb.manifest == (tmp_path / "models/demo").resolve()
    assert emb.shards[0].replicas == ["127.0.0.1:8601", "127.0.0.1:8602"]


def test_env_overrides_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text(YAML)
    monkeypatch.setenv("EMBEDGATE_PORT", "9100")
    monkeypatch.setenv("EMBEDGATE_GRPC__KEEPALIVE_TIME_S", "7")
    monkeypatch.setenv("EMBEDGATE_LOG__LEVEL", "DEBUG")
    s = load_settings(f)
    assert s.port == 9100 and s.grpc.keepalive_time_s == 7 and s.grpc.keepalive_timeout_s == 10
    assert s.log.level == "DEBUG"
    monkeypatch.setenv(
        "EMBEDGATE_MODELS", json.dumps([{"kind": "passthrough", "name": "x", "target": "h:1"}])
    )
    assert [m.name for m in load_settings(f).models] == ["x"]


@pytest.mark.parametrize(
    "bad",
    [
        {"request_timeout_s": 0},
        {"max_in_flight": -1},
        {"overload_status": 500},
        {"port": 70000},
        {"unknown_key": 1},
        {"grpc": {"keepalive_time_s": "soon"}},
        {"log": {"format": "xml"}},
        {"models": []},
        {"models": [{"kind": "passthrough", "name": "a", "target": "nohostport"}]},
        {
            "models": [
                {"kind": "passthrough", "name": "a", "target": "h:1"},
                {"kind": "passthrough", "name": "a", "target": "h:2"},
            ]
        },
        {
            "models": [
                {
                    "kind": "embedding",
                    "name": "demo",
                    "manifest": "/m",
                    "entry": "h:1",
                    "shards": [{"replicas": ["h:2"]}],
                },
                {"kind": "passthrough", "name": "demo_ps_0", "target": "h:2"},
            ]
        },
        {
            "models": [
                {
                    "kind": "embedding",
                    "name": "demo",
                    "manifest": "/m",
                    "entry": "h:1",
                    "shards": [{"replicas": ["h:2"]}],
                },
                {"kind": "passthrough", "name": "sneaky", "target": "h:2", "backend_name": "demo_ps_0"},
            ]
        },
    ],
)
def test_bad_values_rejected(bad: dict[str, object]) -> None:
    base: dict[str, object] = {"models": [{"kind": "passthrough", "name": "m", "target": "h:1"}]}
    with pytest.raises(ValidationError):
        GatewaySettings(**{**base, **bad})


def test_unreadable_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read gateway config"):
        load_settings(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        load_settings(tmp_path / "bad.yaml")
