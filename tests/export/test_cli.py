"""The CLI commands, run in-process through embedgate.cli.main."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from embedgate.cli import main
from embedgate.export.tables import read_table, write_table
from schemas.manifest import Manifest
from tests.export.conftest import DECLARATION


def test_export_tables_import_placement(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keras_path = tmp_path / "tiny.keras"
    tiny.model.save(keras_path)
    decl = tmp_path / "decl.yaml"
    decl.write_text(yaml.safe_dump(DECLARATION))
    write_table(tmp_path / "users", np.array([1, 2, 3], np.int64), np.ones((3, 8), np.float32))
    out = tmp_path / "out"
    assert (
        main(
            [
                "export",
                "--model",
                str(keras_path),
                "--declaration",
                str(decl),
                "--out",
                str(out),
                "--shards",
                "2",
                "--table",
                f"user_emb={tmp_path / 'users'}",
            ]
        )
        == 0
    )
    assert "exported" in capsys.readouterr().out
    m = Manifest.load(out / "tiny")
    assert m.version == 1 and m.num_shards == 2 and m.table("user_emb").rows == 3

    assert (
        main(
            [
                "export",
                "--model",
                str(keras_path),
                "--declaration",
                str(decl),
                "--out",
                str(out),
                "--version",
                "1",
            ]
        )
        == 2
    )
    assert "version 1 already exists" in capsys.readouterr().err

    assert (
        main(
            [
                "tables",
                "export",
                "--model-dir",
                str(out / "tiny"),
                "--dest",
                str(tmp_path / "hps"),
                "--table",
                "user_emb",
            ]
        )
        == 0
    )
    keys, vecs = read_table(tmp_path / "hps" / "user_emb")
    assert keys.tolist() == [1, 2, 3] and vecs.shape == (3, 8)
    assert not (tmp_path / "hps" / "tag_emb").exists()

    write_table(tmp_path / "tags", np.array([5], np.int64), np.full((1, 4), 2.0, np.float32))
    assert (
        main(
            ["tables", "import", "--model-dir", str(out / "tiny"), "--table", f"tag_emb={tmp_path / 'tags'}"]
        )
        == 0
    )
    assert Manifest.load(out / "tiny").version == 2

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "key").write_bytes(b"\0" * 9)
    (tmp_path / "bad" / "emb_vector").write_bytes(b"")
    assert (
        main(["tables", "import", "--model-dir", str(out / "tiny"), "--table", f"tag_emb={tmp_path / 'bad'}"])
        == 2
    )
    assert "bad/key: length 9 is not a multiple of 8" in capsys.readouterr().err

    capsys.readouterr()
    assert (
        main(
            [
                "placement",
                "--model-dir",
                str(out / "tiny"),
                "--filter",
                "entry; True",
                "--filter",
                "ps_{i}; i % 2 == 1",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert 'name: "tiny_entry"' in text and 'name: "tiny_ps_1"' in text and "tiny_ps_0" not in text
    cfg = tmp_path / "host.config"
    assert (
        main(["placement", "--model-dir", str(out / "tiny"), "--filter", "ps_{i}; True", "--out", str(cfg)])
        == 0
    )
    assert cfg.read_text().count("config {") == 2
    assert main(["placement", "--model-dir", str(out / "tiny"), "--filter", "ps_{i}; open('x')"]) == 2
    assert "Call is not allowed" in capsys.readouterr().err
