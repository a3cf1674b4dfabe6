"""The export declaration: which Keras inputs are sparse (and how) and which are dense.

Written as YAML (``embedgate export --declaration FILE``) or built in Python; validated by pydantic. Example::

    model_name: demo
    sparse:
      - name: user_id            # feature name = entry input name = gateway feature name
        input: user_id           # Keras ids input (default: the feature name)
        table: user_emb          # the keras.layers.Embedding layer (= table; may be shared by features)
        kind: single             # single | multi
        pooled: user_vec         # layer whose output is the pooled [B, dim] embedding the model consumes
      - name: genres
        table: genre_emb
        kind: multi
        combiner: mean           # sum | mean | sqrtn
        weights: genres_weights  # Keras input (and gateway feature) with per-id weights [B, L]; optional
        mask: genres_mask        # Keras-only 0/1 input [B, L] for an unweighted multi feature (padding = 0)
        max_ids: 16
        pooled: genres_pool
    dense:
      - {name: price, dim: 1}
    tables:                      # optional per-table settings
      genre_emb: {default_value: 0.0, allow_nan: false}
      user_emb: {row_dtype: float16, ttl_s: 2592000}   # PS stores rows as float16; rows unwritten for 30 days expire
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.manifest import Combiner, FeatureKind, Name, RowDtype

__all__ = ["Declaration", "DeclarationError", "DenseDecl", "SparseDecl", "TableDecl", "load_declaration"]


class DeclarationError(ValueError):
    """A declaration that is unreadable, invalid, or does not match the model; the message names what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SparseDecl(_Strict):
    name: Name
    input: str | None = Field(None, description="Keras ids input; default: name")
    table: Name = Field(description="name of the keras.layers.Embedding layer holding the table")
    kind: FeatureKind = FeatureKind.SINGLE
    combiner: Combiner = Combiner.SUM
    weights: Name | None = Field(
        None, description="Keras input of per-id float weights [B, L] (0 on padding)"
    )
    mask: str | None = Field(None, description="Keras-only 0/1 padding mask input [B, L] (multi, no weights)")
    max_ids: int | None = Field(None, gt=0)
    pooled: str | None = Field(
        None,
        description="layer whose output is this feature's pooled [B, dim] embedding (Keras-model export)",
    )

    @property
    def ids_input(self) -> str:
        return self.input or self.name

    @model_validator(mode="after")
    def _check(self) -> SparseDecl:
        if self.kind is FeatureKind.SINGLE and (self.mask is not None or self.max_ids is not None):
            raise ValueError(f"sparse feature {self.name!r}: mask and max_ids apply to kind 'multi' only")
        if self.weights is not None and self.mask is not None:
            raise ValueError(f"sparse feature {self.name!r}: give weights or mask, not both")
        return self


class DenseDecl(_Strict):
    name: Name
    dim: int = Field(1, gt=0)


class TableDecl(_Strict):
    default_value: float = 0.0
    allow_nan: bool = False
    row_dtype: RowDtype = Field(
        "float32", description="how the PS stores rows (slab layout): float32, float16 or bfloat16"
    )
    ttl_s: float | None = Field(
        None, gt=0, description="seconds after its newest write a row expires (slab layout); None = never"
    )


class Declaration(_Strict):
    model_name: Name
    sparse: list[SparseDecl] = Field(default_factory=list)
    dense: list[DenseDecl] = Field(default_factory=list)
    tables: dict[Name, TableDecl] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Declaration:
        if not self.sparse:
            raise ValueError("no sparse feature declared: an embedding model needs at least one")
        seen: set[str] = set()
        for n in (
            [f.name for f in self.sparse]
            + [f.name for f in self.dense]
            + [f.weights for f in self.sparse if f.weights]
        ):
            if n in seen:
                raise ValueError(f"input name {n!r} is used by more than one feature")
            seen.add(n)
        used = {f.table for f in self.sparse}
        for t in self.tables:
            if t not in used:
                raise ValueError(f"tables: {t!r} is not the table of any sparse feature")
        return self

    @classmethod
    def load(cls, path: str | Path) -> Declaration:
        return load_declaration(path)


def load_declaration(path: str | Path) -> Declaration:
    """Read a YAML (or JSON) declaration; errors name the file and the field."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DeclarationError(f"{p}: cannot read declaration: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise DeclarationError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise DeclarationError(f"{p}: a declaration is a mapping, got {type(data).__name__}")
    try:
        return Declaration.model_validate(data)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise DeclarationError(f"{p}: invalid declaration: {'; '.join(parts)}") from exc
