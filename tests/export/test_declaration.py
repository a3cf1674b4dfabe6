"""Bad declarations and bad export targets: clear errors naming the file, feature and problem; nothing written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from embedgate.export.declaration import Declaration, DeclarationError, load_declaration
from embedgate.export.exporter import ExportError, export_model
from schemas.manifest import Manifest
from tests.export.conftest import DECLARATION


@pytest.fixture(scope="module")
def model() -> Any:
    from tests.export.conftest import build_tiny_model

    return build_tiny_model()


def _decl(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(DECLARATION)
    d.update(changes)
    return d


def _sparse(i: int, **changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(DECLARATION)
    d["sparse"][i].update(changes)
    return d


def test_yaml_file_round_trip(tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(DECLARATION))
    assert load_declaration(p) == Declaration.model_validate(DECLARATION)


def test_no_sparse_feature(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("model_name: m\ndense: [{name: price}]\n")
    with pytest.raises(DeclarationError, match=r"d\.yaml: invalid declaration: .*no sparse feature declared"):
        load_declaration(p)


def test_bad_yaml_and_unknown_field(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("model_name: [unclosed\n")
    with pytest.raises(DeclarationError, match=r"d\.yaml: not valid YAML"):
        load_declaration(p)
    p.write_text("model_name: m\nsparse: [{name: a, table: t, pooled: p, combiner: max}]\n")
    with pytest.raises(DeclarationError, match=r"sparse\.0\.combiner"):
        load_declaration(p)
    with pytest.raises(DeclarationError, match="cannot read"):
        load_declaration(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        (_sparse(0, table="nope"), r"sparse feature 'user': the model has no layer 'nope'"),
        (
            _sparse(0, table="ctr"),
            r"sparse feature 'user': layer 'ctr' is a Dense, not a keras.layers.Embedding",
        ),
        (_sparse(0, input="uid"), r"sparse feature 'user': 'uid' is not an input of the model"),
        (_sparse(2, weights="tags_weights"), r"sparse feature 'tags': 'tags_weights' is not an input"),
        (_sparse(1, pooled="nope"), r"sparse feature 'genres': the model has no layer 'nope'"),
        (
            _sparse(1, table="item_emb"),
            (
                r"sparse feature 'genres': pooled layer 'genres_pool' outputs shape "
                r"\(None, 4\), expected \(None, 6\) to match the dim 6 of table 'item_emb'"
            ),
        ),
        (
            _decl(dense=[{"name": "price", "dim": 2}, {"name": "ctx", "dim": 3}]),
            r"dense feature 'price': model input has shape \(None, 1\), declared dim 2",
        ),
        (_decl(dense=[{"name": "ctx", "dim": 3}]), r"cannot cut the entry sub-graph.*dense feature"),
        (
            _decl(
                dense=[{"name": "price", "dim": 1}, {"name": "ctx", "dim": 3}, {"name": "extra", "dim": 1}]
            ),
            r"dense feature 'extra': 'extra' is not an input",
        ),
    ],
)
def test_declaration_does_not_match_model(
    model: Any, out_dir: Path, decl: dict[str, Any], message: str
) -> None:
    with pytest.raises(DeclarationError, match=message):
        export_model(model, Declaration.model_validate(decl), out_dir)
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_undeclared_embedding_stays_in_entry(out_dir: Path) -> None:
    import keras

    uid = keras.Input((1,), name="uid")
    a = keras.layers.Flatten(name="a_vec")(keras.layers.Embedding(10, 4, name="declared")(uid))
    b = keras.layers.Flatten()(keras.layers.Embedding(10, 4, name="forgotten")(uid))
    m = keras.Model(uid, keras.layers.Dense(1, name="y")(keras.layers.Concatenate()([a, b])))
    decl = Declaration.model_validate(
        {
            "model_name": "m",
            "sparse": [{"name": "a", "input": "uid", "table": "declared", "pooled": "a_vec"}],
            "dense": [{"name": "uid", "dim": 1}],
        }
    )
    with pytest.raises(
        DeclarationError, match=r"Embedding layer 'forgotten' is still inside the entry sub-graph"
    ):
        export_model(m, decl, out_dir)


def test_validation_errors_in_python() -> None:
    with pytest.raises(ValueError, match="mask and max_ids apply to kind 'multi' only"):
        Declaration.model_validate(_sparse(0, mask="m"))
    with pytest.raises(ValueError, match="input name 'price' is used by more than one feature"):
        Declaration.model_validate(_decl(dense=[{"name": "price"}, {"name": "price"}]))
    with pytest.raises(ValueError, match="tables: 'zzz' is not the table of any sparse feature"):
        Declaration.model_validate(_decl(tables={"zzz": {}}))


def test_existing_version_refused_then_overwritten(model: Any, out_dir: Path) -> None:
    decl = Declaration.model_validate(DECLARATION)
    r1 = export_model(model, decl, out_dir, num_shards=1)
    r2 = export_model(model, decl, out_dir, num_shards=1)
    assert (r1.version, r2.version) == (1, 2)
    with pytest.raises(ExportError, match=r"tiny/entry/1: version 1 already exists"):
        export_model(model, decl, out_dir, num_shards=1, version=1)
    r3 = export_model(model, decl, out_dir, num_shards=1, version=1, overwrite=True)
    assert r3.version == 1
    assert Manifest.load(out_dir / "tiny").version == 2  # the manifest keeps describing the newest version
    assert sorted(p.name for p in (out_dir / "tiny" / "entry").iterdir()) == ["1", "2"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["tiny"]  # no temp dir left


def test_failure_mid_export_leaves_no_version_dir(
    model: Any, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedgate.export import exporter

    decl = Declaration.model_validate(DECLARATION)
    real = exporter.write_ps_shard
    calls = []

    def failing(path: Path, *args: Any, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("disk full (simulated)")
        real(path, *args, **kwargs)

    monkeypatch.setattr(exporter, "write_ps_shard", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        export_model(model, decl, out_dir, num_shards=2)
    assert not out_dir.exists() or list(out_dir.iterdir()) == []  # new model: nothing at all

    monkeypatch.setattr(exporter, "write_ps_shard", real)
    export_model(model, decl, out_dir, num_shards=2)
    monkeypatch.setattr(exporter, "write_ps_shard", failing)
    calls.clear()
    with pytest.raises(RuntimeError, match="simulated"):
        export_model(model, decl, out_dir, num_shards=2)
    tree = sorted(str(p.relative_to(out_dir)) for p in out_dir.glob("*/*/*"))
    assert tree == ["tiny/entry/1", "tiny/ps_0/1", "tiny/ps_1/1"]  # version 2 never appeared
    assert sorted(p.name for p in out_dir.iterdir()) == ["tiny"]


def test_failure_while_publishing_rolls_back(
    model: Any, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedgate.export import exporter

    decl = Declaration.model_validate(DECLARATION)
    export_model(model, decl, out_dir, num_shards=2)
    before = (out_dir / "tiny" / "manifest.json").read_text()
    real_rename = Path.rename
    seen = []

    def rename(self: Path, target: Any) -> Any:
        if Path(target).name == "2" and Path(target).parent.name == "entry":
            raise OSError("rename failed (simulated)")
        seen.append(target)
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        export_model(model, decl, out_dir, num_shards=2)
    monkeypatch.undo()
    assert any(Path(t).name == "2" for t in seen)  # PS dirs had been placed before the failure...
    assert sorted(str(p.relative_to(out_dir)) for p in out_dir.glob("*/*/*")) == [
        "tiny/entry/1",
        "tiny/ps_0/1",
        "tiny/ps_1/1",
    ]  # ...and were removed again
    assert (out_dir / "tiny" / "manifest.json").read_text() == before
    assert exporter.next_version(out_dir / "tiny") == 2
