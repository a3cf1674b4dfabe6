from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from embedgate.export.placement import (
    SERVED_VERSIONS,
    PlacementError,
    model_config,
    parse_filter,
    select,
)


def _parse(text: str) -> Any:
    from tensorflow_serving.config import model_server_config_pb2

    return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())


def test_layout_filters_render_a_model_server_config(tiny: Any) -> None:
    md = tiny.export.model_dir
    cfg = _parse(model_config(select(md, ["entry; True", "ps_{i}; i % 2 == 1"])))
    got = [(c.name, c.base_path, c.model_platform) for c in cfg.model_config_list.config]
    assert got == [
        ("tiny_entry", str(md.resolve() / "entry"), "tensorflow"),
        ("tiny_ps_1", str(md.resolve() / "ps_1"), "tensorflow"),
    ]
    for c in cfg.model_config_list.config:
        assert (Path(c.base_path) / "1" / "saved_model.pb").is_file()
        # the previous version stays loaded while the next one loads (a full re-export loses no request)
        assert c.model_version_policy.WhichOneof("policy_choice") == "latest"
        assert c.model_version_policy.latest.num_versions == SERVED_VERSIONS == 2
    even = _parse(
        model_config(
            select(md, ["ps_{i}; i % 2 == 0 and not i > 5"], name_prefix="x", base_path_root="/models/")
        )
    )
    assert [(c.name, c.base_path) for c in even.model_config_list.config] == [
        ("x_ps_0", "/models/tiny/ps_0"),
        ("x_ps_2", "/models/tiny/ps_2"),
    ]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("ps_{i}; i < 2", ["ps_0", "ps_1"]),
        ("ps_{i}; (i + 1) // 2 == 1", ["ps_1", "ps_2"]),
        ("ps_{i}; 0 <= i != 1", ["ps_0", "ps_2"]),
        ("entry; False", []),
        ("ps_{i}; -i == 0 or i * 3 == 6", ["ps_0", "ps_2"]),
    ],
)
def test_expressions(text: str, ok: list[str]) -> None:
    f = parse_filter(text)
    assert [sg for sg in ["entry", "ps_0", "ps_1", "ps_2"] if f.selects(sg)] == ok


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ps_{i} i == 1", r"expected '<pattern>; <expression>'"),
        ("ps_{i}; __import__('os')", r"Call is not allowed"),
        ("ps_{i}; i.real == 1", r"Attribute is not allowed"),
        ("ps_{i}; j == 1", r"unknown name 'j'"),
        ("entry; i == 0", r"uses i but the pattern has no"),
        ("ps_{i}; i ** 99999 > 1", r"Pow is not allowed"),
        ("ps_{i}; i == 'a'", r"constant 'a' is not an integer"),
        ("ps_{i}; i ==", r"not valid syntax"),
        ("ps_*; True", r"pattern 'ps_\*' may hold"),
        ("ps_{i}; [i]", r"List is not allowed"),
    ],
)
def test_rejected_filters(text: str, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        parse_filter(text)


def test_runtime_errors(tiny: Any) -> None:
    with pytest.raises(PlacementError, match="division by zero for i = 0"):
        parse_filter("ps_{i}; 1 % i == 0").selects("ps_0")
    with pytest.raises(PlacementError, match="gives 1, not True/False"):
        parse_filter("ps_{i}; i").selects("ps_1")
    with pytest.raises(PlacementError, match="no servable matches"):
        select(tiny.export.model_dir, ["ps_{i}; i > 100"])
