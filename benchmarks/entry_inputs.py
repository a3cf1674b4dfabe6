"""The entry's inputs the gateway would write for a batch, with rows given by the caller instead of looked up.

Benchmarks that send the entry request themselves (the entry alone, a pass-through body of entry inputs) build it
with the gateway's own code: its lookup plan, then :func:`gateway.embedding.entry_inputs` in the manifest's entry
input mode (``unique_rows``: each distinct row once per table plus indices; ``pooled``: one row per feature).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["entry_inputs_for"]


def entry_inputs_for(
    batch: Any, manifest: Any, rows: Callable[[str, np.ndarray], np.ndarray]
) -> list[tuple[str, np.ndarray]]:
    """The entry's inputs for ``batch`` (a ``FeatureBatch`` of ``manifest``), in signature order, each looked-up
    table's rows being ``rows(table, ids)`` (float32 ``[len(ids), dim]``, ``ids`` the plan's ids of one shard)."""
    from gateway.embedding import entry_inputs, plan_lookups

    plan = plan_lookups(batch, manifest)
    values = [{t: rows(t, ids) for t, ids in shard.items()} for shard in plan.shard_ids]
    return entry_inputs(plan, values, batch, manifest)
