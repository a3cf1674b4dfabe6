"""``changed_rows``: the word-wise fast path against the element-wise reference, bit-level cases, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from embedgate.train import changed_rows
from embedgate.train.diff import _changed_rows_reference


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.uint8, np.float16]))
    rows = draw(st.integers(0, 40))
    dim = draw(st.integers(1, 37))
    before = draw(hnp.arrays(dtype, (rows, dim), elements=hnp.from_dtype(np.dtype(dtype), allow_nan=True)))
    after = before.copy()
    flat = after.reshape(-1).view(np.dtype(f"u{after.dtype.itemsize}"))
    for i in draw(st.lists(st.integers(0, max(0, flat.size - 1)), max_size=6)) if flat.size else []:
        flat[i] ^= draw(st.integers(1, 255))  # flip bits: a row differs in this element
    return before, after


@settings(max_examples=150, deadline=None)
@given(_pairs())
def test_fast_path_equals_the_reference(pair: tuple[np.ndarray, np.ndarray]) -> None:
    before, after = pair
    got = changed_rows(before, after)
    assert got.dtype == np.int64
    assert np.array_equal(got, _changed_rows_reference(before, after))
    assert np.array_equal(changed_rows(after, after), np.zeros(0, np.int64))


@pytest.mark.parametrize("dim", [1, 2, 3, 4, 8, 16, 24, 64])
def test_bits_decide_and_every_word_of_a_row_counts(dim: int) -> None:
    before = np.zeros((5, dim), np.float32)
    after = before.copy()
    after[1, 0] = -0.0  # another bit pattern of an equal float: a change
    after[3, dim - 1] = np.nan
    before[4, :] = np.nan  # the same NaN in both: no change
    after[4, :] = np.nan
    assert changed_rows(before, after).tolist() == [1, 3]
    for col in range(dim):  # a change in any word of the row is seen
        b = before.copy()
        b[2, col] = 1.0
        assert changed_rows(b, after).tolist() == [1, 2, 3]


def test_a_strided_view_is_compared_as_its_values() -> None:
    base = np.arange(60, dtype=np.float32).reshape(10, 6)
    now = base.copy()
    now[7, 3] += 1
    assert changed_rows(base[:, :4], now[:, :4]).tolist() == [7]
    assert changed_rows(base[::2], now[::2]).tolist() == []


def test_bad_input_is_refused_with_the_shapes() -> None:
    with pytest.raises(ValueError, match=r"got \(3, 4\) and \(3, 5\)"):
        changed_rows(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="one element size, got float32 and float64"):
        changed_rows(np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match=r"got \(4,\) and \(4,\)"):
        changed_rows(np.zeros(4), np.zeros(4))
