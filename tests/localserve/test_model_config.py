"""model_config.py: TF Serving's text format into ModelEntry values; bad configs name the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedgate.localserve.errors import ConfigError
from embedgate.localserve.model_config import (
    ModelEntry,
    PolicyKind,
    VersionPolicy,
    load_config_file,
    parse_config_text,
    single_model,
)

CONFIG = """
model_config_list {
  config { name: "a" base_path: "/m/a" model_platform: "tensorflow" }
  config {
    name: "b"
    base_path: "/m/b"
    model_version_policy { latest { num_versions: 2 } }
    version_labels { key: "stable" value: 3 }
    version_labels { key: "canary" value: 4 }
  }
  config { name: "c" base_path: "/m/c" model_version_policy { all {} } }
  config { name: "d" base_path: "/m/d" model_version_policy { specific { versions: 1 versions: 5 } } }
}
"""


def test_parses_every_policy_and_labels() -> None:
    a, b, c, d = parse_config_text(CONFIG)
    assert a == ModelEntry("a", Path("/m/a"))
    assert a.policy == VersionPolicy(PolicyKind.LATEST, num_versions=1)
    assert b.policy == VersionPolicy(PolicyKind.LATEST, num_versions=2)
    assert b.labels == {"stable": 3, "canary": 4}
    assert c.policy.kind is PolicyKind.ALL
    assert d.policy == VersionPolicy(PolicyKind.SPECIFIC, versions=frozenset({1, 5}))


def test_single_model_form() -> None:
    (entry,) = single_model("half", "/m/half")
    assert entry == ModelEntry("half", Path("/m/half"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }",
            "configured twice",
        ),
        ("model_config_list { config { base_path: '/x' } }", "name is empty"),
        ("model_config_list { config { name: 'a' } }", "base_path is empty"),
        ("model_config_list { config { name: 'a' base_path: '/x' model_platform: 'onnx' } }", "onnx"),
        (
            "model_config_list { config { name: 'a' base_path: '/x' model_version_policy { specific {} } } }",
            "lists no versions",
        ),
        ("model_config_list {}", "no models"),
        ("model_config_list { config { nme: 'a' } }", "not a valid ModelServerConfig"),
    ],
)
def test_bad_config_names_problem(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config_text(text, source="my.config")


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.config"
    with pytest.raises(ConfigError, match="absent.config: cannot read"):
        load_config_file(missing)
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list {}", encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.config: model_config_list has no models"):
        load_config_file(bad)
