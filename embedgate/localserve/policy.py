"""Aspired versions: which of the versions on disk a model's version policy wants loaded. Pure and idempotent."""

from __future__ import annotations

from collections.abc import Iterable

from embedgate.localserve.model_config import PolicyKind, VersionPolicy

__all__ = ["aspired_versions"]


def aspired_versions(on_disk: Iterable[int], policy: VersionPolicy) -> frozenset[int]:
    """The versions to serve: the ``num_versions`` largest (latest), all of them, or the listed ones present."""
    versions = sorted(set(on_disk), reverse=True)
    if policy.kind is PolicyKind.LATEST:
        return frozenset(versions[: max(policy.num_versions, 1)])
    if policy.kind is PolicyKind.ALL:
        return frozenset(versions)
    return frozenset(v for v in versions if v in policy.versions)
