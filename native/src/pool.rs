//! Pooling of one sparse feature for a `pooled` entry (`gateway.embedding.pool`; reference: `_combine`, numpy).
//!
//! Bit for bit what the reference computes in float32: the gathered rows times the weights (when sent), summed per
//! example as numpy's `add.reduceat` sums (the segment's first row, plus numpy's pairwise sum of the rest: blocks
//! of eight partial sums from eight ids on, halves above 128), divided by the weights' (or ids') count for `mean`
//! and by the square root of the squared weights' sum for `sqrtn`; a zero row where that divisor is 0.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

const SUM: u8 = 0;
const MEAN: u8 = 1;
const SQRTN: u8 = 2;

/// numpy's pairwise float32 sum of `get(lo..lo + n)` (`pairwise_sum` in numpy's loops; -0.0 is the start value).
fn pairwise(get: &impl Fn(usize) -> f32, lo: usize, n: usize) -> f32 {
    if n < 8 {
        let mut res = -0.0f32;
        for i in 0..n {
            res += get(lo + i);
        }
        res
    } else if n <= 128 {
        let mut r = [0f32; 8];
        for (j, v) in r.iter_mut().enumerate() {
            *v = get(lo + j);
        }
        let mut i = 8;
        while i < n - n % 8 {
            for (j, v) in r.iter_mut().enumerate() {
                *v += get(lo + i + j);
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += get(lo + i);
            i += 1;
        }
        res
    } else {
        let mut half = n / 2;
        half -= half % 8;
        pairwise(get, lo, half) + pairwise(get, lo + half, n - half)
    }
}

/// `add.reduceat` of one non-empty segment `[lo, hi)`: its first value plus the pairwise sum of the others.
fn segment(get: &impl Fn(usize) -> f32, lo: usize, hi: usize) -> f32 {
    get(lo) + pairwise(get, lo + 1, hi - lo - 1)
}

struct Feature<'a> {
    table: &'a [f32],
    dim: usize,
    rows: &'a [i32],
    weights: Option<&'a [f32]>,
}

impl Feature<'_> {
    /// The weighted value of id `i`'s column `j` (the reference's `rows * weights[:, None]`).
    #[inline]
    fn value(&self, i: usize, j: usize) -> f32 {
        let v = self.table[self.rows[i] as usize * self.dim + j];
        match self.weights {
            Some(w) => v * w[i],
            None => v,
        }
    }

    fn single(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows.len() * self.dim);
        for i in 0..self.rows.len() {
            for j in 0..self.dim {
                out.push(self.value(i, j));
            }
        }
        out
    }

    fn multi(&self, splits: &[i64], combiner: u8) -> Vec<f32> {
        let size = splits.len() - 1;
        let mut out = vec![0f32; size * self.dim];
        for b in 0..size {
            let (lo, hi) = (splits[b] as usize, splits[b + 1] as usize);
            if lo == hi {
                continue;
            }
            let denom = match (combiner, self.weights) {
                (SUM, _) => 1.0,
                (MEAN, None) => (hi - lo) as f32,
                (MEAN, Some(w)) => segment(&|i| w[i], lo, hi),
                (_, None) => ((hi - lo) as f32).sqrt(),
                (_, Some(w)) => segment(&|i| w[i] * w[i], lo, hi).sqrt(),
            };
            if denom == 0.0 {
                continue;
            }
            let row = &mut out[b * self.dim..(b + 1) * self.dim];
            for (j, v) in row.iter_mut().enumerate() {
                let summed = segment(&|i| self.value(i, j), lo, hi);
                *v = if combiner == SUM {
                    summed
                } else {
                    summed / denom
                };
            }
        }
        out
    }
}

/// float32 [B, dim]: one sparse feature pooled. `table`: float32 [U, dim] (its table's distinct rows); `rows`: int32,
/// each id's row in `table`; `row_splits`: int64 [B + 1] of a multi feature, None for a single one (B = ids);
/// `weights`: float32 like `rows`, or None; `combiner`: 0 sum, 1 mean, 2 sqrtn. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (table, rows, row_splits, weights, combiner))]
pub fn pool_feature<'py>(
    py: Python<'py>,
    table: PyReadonlyArray2<'py, f32>,
    rows: PyReadonlyArray1<'py, i32>,
    row_splits: Option<PyReadonlyArray1<'py, i64>>,
    weights: Option<PyReadonlyArray1<'py, f32>>,
    combiner: u8,
) -> PyResult<Bound<'py, PyAny>> {
    let bad = |what: &str| PyValueError::new_err(format!("pool_feature: {what}"));
    let shape = table.shape();
    let (count, dim) = (shape[0], shape[1]);
    let table = table
        .as_slice()
        .map_err(|_| bad("table must be contiguous"))?;
    let rows = rows
        .as_slice()
        .map_err(|_| bad("rows must be contiguous"))?;
    if rows.iter().any(|&r| r < 0 || r as usize >= count) {
        return Err(bad("a row index outside the table"));
    }
    let weights = match &weights {
        Some(w) => Some(
            w.as_slice()
                .map_err(|_| bad("weights must be contiguous"))?,
        ),
        None => None,
    };
    if weights.is_some_and(|w| w.len() != rows.len()) || combiner > SQRTN {
        return Err(bad("weights must match rows; combiner 0, 1 or 2"));
    }
    let splits = match &row_splits {
        Some(s) => Some(
            s.as_slice()
                .map_err(|_| bad("row_splits must be contiguous"))?,
        ),
        None => None,
    };
    if let Some(s) = splits {
        let ordered = s.first() == Some(&0) && s.windows(2).all(|p| p[0] <= p[1]);
        if !ordered || s.last().copied() != Some(rows.len() as i64) {
            return Err(bad("row_splits must rise from 0 to the number of ids"));
        }
    }
    let feature = Feature {
        table,
        dim,
        rows,
        weights,
    };
    let (size, out) = py.allow_threads(|| match splits {
        Some(s) => (s.len() - 1, feature.multi(s, combiner)),
        None => (rows.len(), feature.single()),
    });
    Ok(PyArray1::from_vec(py, out).reshape([size, dim])?.into_any())
}

/// Registers this module's functions on `embedgate_native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pool_feature, m)?)?;
    Ok(())
}
