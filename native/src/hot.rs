//! The all-cached read path of a `unique_rows` entry in one call (`gateway.cache.RowCache.cached_entry_request`):
//! the lookup plan (`plan.rs`), every planned row read from the hot-row cache's slabs (`SlotIndex`), their LRU ticks,
//! and the entry's serialized `PredictRequest` (`entry.rs`'s framing), without building the plan's, the cache's or
//! the request's intermediate arrays in Python.
//!
//! It answers only when the cache holds every row the batch reads; on the first miss it returns None having changed
//! nothing, and the caller runs the general path (plan, `CachedRowSource.lookup`, `gateway.embedding.entry_request`),
//! which is its reference: the same bytes, the same LRU ticks and the same hit count
//! (`tests/gateway/test_native_hot.py`).
//!
//! Order of everything, as the reference does it:
//! * a table's `rows__<table>` rows are its unique ids sorted by (shard, id), the plan's row numbering;
//! * the k-th row read gets the tick `tick + k`, reads going shard by shard and, within a shard, table by table in
//!   the manifest's order (`RowCache.get_many` over the plan's `shard_ids`);
//! * rows go as float32 or as bfloat16 (`entry.row_dtype`), rounded as `schemas.wire.bfloat16_bits` rounds them;
//! * inputs: `rows__<table>` for each table a sparse feature reads (manifest order), then per sparse feature its
//!   `index__`, `splits__` (multi) and `weights__` (features with weights), then the dense features.

use numpy::{
    PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn, PyReadwriteArray1,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::entry::{framing, fresh_bytes};
use crate::plan::{plan, SlotIndex};

// tensorflow/core/framework/types.proto
const DT_FLOAT: i32 = 1;
const DT_INT32: i32 = 3;
const DT_BFLOAT16: i32 = 14;

/// float32 -> bfloat16 bits, to nearest with ties to even, NaN kept NaN (quiet, sign kept): TensorFlow's cast, and
/// `schemas.wire.bfloat16_bits` (the reference) bit for bit.
#[inline]
fn bfloat16(x: f32) -> u16 {
    let u = x.to_bits();
    if x.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    (u.wrapping_add(0x7fff).wrapping_add((u >> 16) & 1) >> 16) as u16
}

#[cfg(not(target_endian = "little"))]
compile_error!("tensor_content is little-endian: this writer copies native memory as is");

/// The bytes of a slice of plain numbers (little-endian, as `tensor_content` holds them).
fn bytes_of<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: T is f32 / i32 here (no padding, every bit pattern valid as u8); the length is the slice's byte size.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// One sparse feature: its table's index, ids, `index__` name, (`splits__` name, row splits) of a multi feature,
/// and (`weights__` name, the weights sent or None for all ones) of a feature with weights.
type Feature<'py> = (
    usize,
    PyReadonlyArray1<'py, i64>,
    String,
    Option<(String, PyReadonlyArray1<'py, i64>)>,
    Option<(String, Option<PyReadonlyArray1<'py, f32>>)>,
);

/// One table of the manifest: its `rows__` name when a sparse feature reads it, its slab's index, rows
/// (float32 [capacity, dim]) and LRU ticks (int64 [capacity]).
type Table<'py> = (
    Option<String>,
    PyRef<'py, SlotIndex>,
    PyReadonlyArray2<'py, f32>,
    PyReadwriteArray1<'py, i64>,
);

fn contiguous<'a, T: numpy::Element>(
    a: &'a numpy::PyReadonlyArray<'_, T, impl numpy::ndarray::Dimension>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        PyTypeError::new_err(format!("cached_entry_request: {what} must be contiguous"))
    })
}

/// `(request bytes, rows read)` when the cache holds every row of the batch, else None with nothing changed (see the
/// module docs). `head`: the serialized `model_spec` field; `dense`: (name, float32 array) in the batch's order.
#[pyfunction]
pub fn cached_entry_request<'py>(
    py: Python<'py>,
    head: &[u8],
    features: Vec<Feature<'py>>,
    mut tables: Vec<Table<'py>>,
    dense: Vec<(String, PyReadonlyArrayDyn<'py, f32>)>,
    num_shards: usize,
    tick: i64,
    row_dtype: i32,
) -> PyResult<Option<(Bound<'py, PyBytes>, usize)>> {
    let num_tables = tables.len();
    let row_width = match row_dtype {
        DT_FLOAT => 4,
        DT_BFLOAT16 => 2,
        _ => {
            return Err(PyValueError::new_err(
                "cached_entry_request: rows go as float32 or bfloat16",
            ))
        }
    };
    if num_shards == 0 || features.iter().any(|f| f.0 >= num_tables) {
        return Err(PyValueError::new_err(
            "cached_entry_request: a table index or num_shards out of range",
        ));
    }
    let ids = features
        .iter()
        .map(|f| contiguous(&f.1, "ids"))
        .collect::<PyResult<Vec<&[i64]>>>()?;
    let table_of: Vec<usize> = features.iter().map(|f| f.0).collect();
    if ids.iter().map(|s| s.len()).sum::<usize>() >= i32::MAX as usize {
        return Ok(None);
    }
    let mut splits: Vec<Option<(&str, Vec<i32>)>> = Vec::with_capacity(features.len());
    let mut weights: Vec<Option<(&str, Option<&[f32]>)>> = Vec::with_capacity(features.len());
    for (f, ids) in features.iter().zip(&ids) {
        splits.push(match &f.3 {
            None => None,
            Some((name, s)) => {
                let s = contiguous(s, "row splits")?;
                let Ok(s) = s
                    .iter()
                    .map(|&x| i32::try_from(x))
                    .collect::<Result<Vec<i32>, _>>()
                else {
                    return Ok(None);
                };
                Some((name.as_str(), s))
            }
        });
        weights.push(match &f.4 {
            None => None,
            Some((name, None)) => Some((name.as_str(), None)),
            Some((name, Some(w))) => {
                let w = contiguous(w, "weights")?;
                if w.len() != ids.len() {
                    return Err(PyValueError::new_err(
                        "cached_entry_request: weights and ids differ in length",
                    ));
                }
                Some((name.as_str(), Some(w)))
            }
        });
    }
    let dims: Vec<usize> = tables.iter().map(|t| t.2.shape()[1]).collect();
    let capacities: Vec<usize> = tables.iter().map(|t| t.2.shape()[0]).collect();
    let done = {
        let maps: Vec<&crate::plan::IdMap<i64>> = tables.iter().map(|t| &t.1.map).collect();
        py.allow_threads(|| {
            let planned = plan(&ids, &table_of, num_tables, num_shards);
            // every planned row's slot, per table in its row order, and the reads in tick order
            let mut slots: Vec<Vec<usize>> = vec![Vec::new(); num_tables];
            let mut reads: Vec<(usize, usize)> = Vec::with_capacity(planned.grouped.len());
            for s in 0..num_shards {
                for (t, map) in maps.iter().enumerate() {
                    let g = s * num_tables + t;
                    let group = &planned.grouped
                        [planned.bounds[g] as usize..planned.bounds[g + 1] as usize];
                    for id in group {
                        let slot = usize::try_from(*map.get(id)?).ok()?;
                        if slot >= capacities[t] {
                            return Some(Err(format!(
                                "slot {slot} of id {id} is outside the rows"
                            )));
                        }
                        slots[t].push(slot);
                        reads.push((t, slot));
                    }
                }
            }
            Some(Ok((planned, slots, reads)))
        })
    };
    let (planned, slots, reads) = match done {
        None => return Ok(None),
        Some(Err(e)) => return Err(PyValueError::new_err(format!("cached_entry_request: {e}"))),
        Some(Ok(d)) => d,
    };
    {
        let mut used = tables
            .iter_mut()
            .map(|t| {
                t.3.as_slice_mut().map_err(|_| {
                    PyTypeError::new_err("cached_entry_request: used must be contiguous")
                })
            })
            .collect::<PyResult<Vec<&mut [i64]>>>()?;
        if used.iter().zip(&capacities).any(|(u, &c)| u.len() < c) {
            return Err(PyValueError::new_err(
                "cached_entry_request: used is shorter than rows",
            ));
        }
        for (k, &(t, slot)) in reads.iter().enumerate() {
            used[t][slot] = tick + k as i64;
        }
    }
    let rows = tables
        .iter()
        .map(|t| contiguous(&t.2, "rows"))
        .collect::<PyResult<Vec<&[f32]>>>()?;
    // all ones for the longest feature that has a weights input and was sent none
    let unweighted = weights
        .iter()
        .zip(&ids)
        .filter(|(w, _)| matches!(w, Some((_, None))))
        .map(|(_, i)| i.len());
    let ones: Vec<f32> = vec![1.0; unweighted.max().unwrap_or(0)];
    // (framing, content parts) of every input, in request order
    let mut pieces: Vec<(Vec<u8>, Vec<&[u8]>)> = Vec::new();
    let mut gathers: Vec<(usize, usize)> = Vec::new(); // (table, position in pieces) of each rows__ input
    for (t, table) in tables.iter().enumerate() {
        if let Some(name) = &table.0 {
            let shape = [slots[t].len() as i64, dims[t] as i64];
            gathers.push((t, pieces.len()));
            pieces.push((
                framing(
                    name,
                    row_dtype,
                    &shape,
                    slots[t].len() * dims[t] * row_width,
                ),
                Vec::new(),
            ));
        }
    }
    let mut at = 0usize;
    for (k, f) in features.iter().enumerate() {
        let n = ids[k].len();
        let index = &planned.rows[at..at + n];
        at += n;
        pieces.push((
            framing(&f.2, DT_INT32, &[n as i64], n * 4),
            vec![bytes_of(index)],
        ));
        if let Some((name, s)) = &splits[k] {
            pieces.push((
                framing(name, DT_INT32, &[s.len() as i64], s.len() * 4),
                vec![bytes_of(s)],
            ));
        }
        if let Some((name, w)) = &weights[k] {
            let w: &[f32] = match w {
                Some(w) => w,
                None => &ones[..n],
            };
            pieces.push((
                framing(name, DT_FLOAT, &[n as i64], n * 4),
                vec![bytes_of(w)],
            ));
        }
    }
    for (name, array) in &dense {
        let values = contiguous(array, "dense features")?;
        let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
        pieces.push((
            framing(name, DT_FLOAT, &shape, values.len() * 4),
            vec![bytes_of(values)],
        ));
    }
    let mut total = head.len();
    for (frame, parts) in &pieces {
        total += frame.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    }
    for &(t, _) in &gathers {
        total += slots[t].len() * dims[t] * row_width;
    }
    let wire = fresh_bytes(py, total, true, |buf: &mut [u8]| {
        let mut out = 0usize;
        let mut put = |bytes: &[u8]| {
            buf[out..out + bytes.len()].copy_from_slice(bytes);
            out += bytes.len();
        };
        put(head);
        let mut next_gather = gathers.iter().peekable();
        for (p, (frame, parts)) in pieces.iter().enumerate() {
            put(frame);
            if let Some(&(t, _)) = next_gather.next_if(|g| g.1 == p) {
                let d = dims[t];
                let mut half = vec![0u8; 2 * d];
                for &slot in &slots[t] {
                    let row = &rows[t][slot * d..(slot + 1) * d];
                    if row_dtype == DT_FLOAT {
                        put(bytes_of(row));
                    } else {
                        for (pair, &x) in half.chunks_exact_mut(2).zip(row) {
                            pair.copy_from_slice(&bfloat16(x).to_le_bytes());
                        }
                        put(&half);
                    }
                }
            }
            for part in parts {
                put(part);
            }
        }
        assert_eq!(
            out, total,
            "cached_entry_request: the request's size was miscounted"
        );
    })?;
    Ok(Some((wire, reads.len())))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cached_entry_request, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfloat16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(bfloat16(1.0), 0x3f80);
        assert_eq!(bfloat16(f32::from_bits(0x3f80_8000)), 0x3f80); // a tie, to the even one
        assert_eq!(bfloat16(f32::from_bits(0x3f81_8000)), 0x3f82); // a tie, to the even one (up)
        assert_eq!(bfloat16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(bfloat16(f32::INFINITY), 0x7f80);
        assert_eq!(bfloat16(f32::from_bits(0x7f7f_ffff)), 0x7f80); // the largest float rounds to infinity
        assert_eq!(bfloat16(f32::from_bits(0xff80_0001)), 0xffc0); // a signalling NaN comes out quiet, sign kept
    }

    #[test]
    fn bytes_of_is_little_endian_tensor_content() {
        assert_eq!(bytes_of(&[1i32, -2]), [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]);
        assert_eq!(bytes_of(&[1.0f32]), 1.0f32.to_le_bytes());
    }
}
