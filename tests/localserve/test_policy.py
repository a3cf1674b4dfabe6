"""policy.py: aspired versions for latest / all / specific (pure)."""

from __future__ import annotations

from embedgate.localserve.model_config import PolicyKind, VersionPolicy
from embedgate.localserve.policy import aspired_versions


def test_latest_default_is_one() -> None:
    assert aspired_versions([1, 3, 2], VersionPolicy()) == {3}


def test_latest_n() -> None:
    assert aspired_versions([1, 3, 2, 10], VersionPolicy(PolicyKind.LATEST, num_versions=2)) == {10, 3}
    assert aspired_versions([4], VersionPolicy(PolicyKind.LATEST, num_versions=5)) == {4}


def test_all_and_specific() -> None:
    assert aspired_versions([1, 2], VersionPolicy(PolicyKind.ALL)) == {1, 2}
    specific = VersionPolicy(PolicyKind.SPECIFIC, versions=frozenset({2, 7}))
    assert aspired_versions([1, 2, 3], specific) == {2}


def test_nothing_on_disk() -> None:
    for policy in (VersionPolicy(), VersionPolicy(PolicyKind.ALL)):
        assert aspired_versions([], policy) == frozenset()
