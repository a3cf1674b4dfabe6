"""source.py: numeric, complete version directories only."""

from __future__ import annotations

from pathlib import Path

from embedgate.localserve.source import scan_versions


def test_scan_versions(tmp_path: Path) -> None:
    for name, marker in [
        ("1", "saved_model.pb"),
        ("0002", "saved_model.pbtxt"),
        ("3", None),
        ("tmp", "saved_model.pb"),
        (".build-7", "saved_model.pb"),
        ("-4", "saved_model.pb"),
    ]:
        d = tmp_path / name
        d.mkdir()
        if marker:
            (d / marker).write_bytes(b"")
    (tmp_path / "5").write_bytes(b"a file, not a dir")
    found = scan_versions(tmp_path)
    assert found == {1: tmp_path / "1", 2: tmp_path / "0002"}


def test_missing_base_path(tmp_path: Path) -> None:
    assert scan_versions(tmp_path / "absent") == {}
