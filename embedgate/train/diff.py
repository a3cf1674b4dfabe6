"""``changed_rows(before, after)``: which rows of an embedding table changed, bit for bit (numpy only, any framework).

A trainer keeps a copy of each table as it last published it, and after some steps publishes exactly the rows that
differ. Optimizers with slots (Adam, Adagrad, momentum) move rows that had no gradient in a step, so "the ids in this
batch" is not the set of changed rows; a diff is. A PyTorch-style loop::

    from embedgate.train import RowPublisher, changed_rows

    with RowPublisher("models/ranker", "127.0.0.1:9092") as pub:
        last = model.item_emb.weight.detach().cpu().numpy().copy()
        for step, batch in enumerate(loader):
            loss = model(batch).mean(); loss.backward(); opt.step(); opt.zero_grad()
            if step % 50 == 0:
                now = model.item_emb.weight.detach().cpu().numpy()
                rows = changed_rows(last, now)
                pub.publish("item_emb", rows, now[rows])   # row index = id of a plain table
                last[rows] = now[rows]
        pub.flush(timeout=60)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["changed_rows"]


def changed_rows(before: npt.ArrayLike, after: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Sorted indices ``i`` where row ``after[i]`` differs from ``before[i]`` in any element, compared by their bits
    (so ``-0.0`` vs ``0.0`` and a changed NaN count as changes, an unchanged NaN does not). Both are ``[n, dim]``
    arrays of the same shape and dtype size (float32 tables: 4 bytes per element); ``ValueError`` otherwise.
    A table that grew (``after`` has more rows) is not supported: diff the common rows and add the new ones."""
    a = np.ascontiguousarray(before)
    b = np.ascontiguousarray(after)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(
            f"changed_rows: expected two [n, dim] arrays of one shape, got {a.shape} and {b.shape}"
        )
    if a.dtype.itemsize != b.dtype.itemsize or a.dtype.kind not in "fiu" or b.dtype.kind not in "fiu":
        raise ValueError(
            f"changed_rows: expected numeric arrays of one element size, got {a.dtype} and {b.dtype}"
        )
    row_bytes = a.shape[1] * a.dtype.itemsize
    if row_bytes % 8 or not len(a):
        return _changed_rows_reference(a, b)
    # Compare 8 bytes at a time, then reduce each row's flags as one wider word (8 flags = one uint64 compared
    # with 0) instead of a boolean any() over the row: the same answer, about twice as fast on [100k, 16] float32.
    ne = a.view(np.uint64) != b.view(np.uint64)
    words = ne.shape[1]
    width = next((k for k in (8, 4, 2) if words % k == 0), 1)
    flags = ne.view(np.dtype(f"u{width}")) if width > 1 else ne
    return np.flatnonzero(flags.any(axis=1)).astype(np.int64)


def _changed_rows_reference(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> npt.NDArray[np.int64]:
    """:func:`changed_rows` element by element (rows of any byte size); the fast path is tested against it."""
    view = np.dtype(f"u{a.dtype.itemsize}")
    diff = a.view(view) != b.view(view)
    return np.flatnonzero(diff.any(axis=1)).astype(np.int64)
