"""The one partition function: which PS shard holds an embedding id.

``shard_for(ids, num_shards)`` is pure and vectorised. The manifest records its name (``splitmix64_mod``) so every
reader (exporter, gateway, updater, producer, a foreign trainer) routes an id to the same shard. Definition, on the
id's 64-bit two's-complement pattern ``x`` with wrapping unsigned 64-bit arithmetic::

    z = x + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    shard = z % num_shards

That is one step of the SplitMix64 generator seeded with ``x``: ids that are dense small integers (vocabulary
indices) still spread evenly over shards.
"""

from __future__ import annotations

from typing import Final, overload

import numpy as np
import numpy.typing as npt

__all__ = ["PARTITION_FUNCTION", "mix64", "shard_for"]

PARTITION_FUNCTION: Final = "splitmix64_mod"

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(ids: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """SplitMix64 of each id (int64 or uint64 array-like), as uint64. Wraps modulo 2**64 by design."""
    x = np.atleast_1d(np.asarray(ids))
    if x.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, got dtype {x.dtype}")
    z = x.astype(np.int64, copy=False).view(np.uint64) if x.dtype.kind == "i" else x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GAMMA
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


@overload
def shard_for(ids: int | np.integer, num_shards: int) -> int: ...


@overload
def shard_for(ids: npt.ArrayLike, num_shards: int) -> npt.NDArray[np.int64]: ...


def shard_for(ids: npt.ArrayLike, num_shards: int) -> int | npt.NDArray[np.int64]:
    """Shard index in ``[0, num_shards)`` of each id: a Python ``int`` for one integer id (``int``, a NumPy integer
    scalar), else an int64 array shaped like ``np.atleast_1d(ids)``."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    shards = (mix64(ids) % np.uint64(num_shards)).astype(np.int64)
    if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
        return int(shards[0])
    return shards
