"""A second exported model for the generated deployments, differently shaped from the demo: the two-tower model of
tests/export/test_standard_models.py (StringLookup / IntegerLookup tables, a shared ``mask_zero`` table, a weighted
multi-id feature) over 3 PS shards. Exported once per session (exports are CPU-heavy)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def twotower_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``ExportResult`` of the two-tower model with 3 shards (``model_dir`` = ``<tmp>/twotower``)."""
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from tests.export.test_standard_models import TWO_TOWER_DECL, _two_tower

    decl = Declaration.model_validate(TWO_TOWER_DECL)
    return export_model(_two_tower(), decl, tmp_path_factory.mktemp("twotower"), num_shards=3)
