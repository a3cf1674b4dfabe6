//! Embedding lookups' per-id work: the lookup plan (`plan_lookups`) and the hot-row cache's id -> slot index
//! (`SlotIndex`). The Python references are `gateway.embedding.plan_lookups` and the `dict` of `gateway.cache._Slab`;
//! `gateway/native.py` is the only door.
//!
//! Plan contract (the reference's, exactly): ids are deduplicated per table over the whole batch (every feature
//! reading the table), routed with splitmix64 (`schemas/partition.py`: shard = mix64(id) % num_shards, on the id's
//! two's-complement bits) and grouped by (shard, table) in that order, ascending (signed) ids within a group. Each
//! id of a feature gets its row in its table's answers concatenated in shard order, which is the id's position in
//! the table's unique ids sorted by (shard, id).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const M1: u64 = 0xBF58_476D_1CE4_E5B9;
const M2: u64 = 0x94D0_49BB_1331_11EB;

/// SplitMix64 of an id's 64 bits (`schemas.partition.mix64`), wrapping.
#[inline]
fn mix64(id: i64) -> u64 {
    let mut z = (id as u64).wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(M1);
    z = (z ^ (z >> 27)).wrapping_mul(M2);
    z ^ (z >> 31)
}

/// Hashes one i64 key with mix64: ids are often dense small integers, which the table's probing needs spread.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64((self.0 as i64) ^ i64::from(b));
        }
    }
    fn write_i64(&mut self, id: i64) {
        self.0 = mix64(id);
    }
}

pub(crate) type IdMap<V> = HashMap<i64, V, BuildHasherDefault<IdHasher>>;

/// The plan of one batch: `grouped` (every (shard, table) group's unique ids, groups in (shard, table) order),
/// `bounds` (group g is `grouped[bounds[g]..bounds[g + 1]]`, g = shard * num_tables + table) and `rows` (per id of
/// every feature in feature order, its row in its table's answers).
pub(crate) struct Plan {
    pub(crate) grouped: Vec<i64>,
    pub(crate) bounds: Vec<i64>,
    pub(crate) rows: Vec<i32>,
}

/// Deduplicates i64 ids: an open-addressing table (linear probing, power-of-two capacity, at most half full)
/// from id to its index in `unique` (first-seen order). mix64 spreads dense small ids over the slots.
struct Dedup {
    keys: Vec<i64>,
    slots: Vec<u32>, // index into `unique` + 1; 0 = empty
    mask: usize,
    unique: Vec<i64>,
}

impl Dedup {
    fn new(expected: usize) -> Self {
        let cap = (expected.max(8) * 2)
            .next_power_of_two()
            .min(1 << 16)
            .max(16);
        Dedup {
            keys: vec![0; cap],
            slots: vec![0; cap],
            mask: cap - 1,
            unique: Vec::new(),
        }
    }

    /// The index of `id` in `unique`, added there if new.
    #[inline]
    fn index(&mut self, id: i64) -> u32 {
        let mut at = (mix64(id) as usize) & self.mask;
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                break;
            }
            if self.keys[at] == id {
                return slot - 1;
            }
            at = (at + 1) & self.mask;
        }
        let u = self.unique.len() as u32;
        self.unique.push(id);
        self.keys[at] = id;
        self.slots[at] = u + 1;
        if self.unique.len() * 2 > self.slots.len() {
            self.grow();
        }
        u
    }

    /// The index in `unique` of an id `index` added.
    #[inline]
    fn find(&self, id: i64) -> u32 {
        let mut at = (mix64(id) as usize) & self.mask;
        while self.keys[at] != id || self.slots[at] == 0 {
            at = (at + 1) & self.mask;
        }
        self.slots[at] - 1
    }

    fn grow(&mut self) {
        let cap = self.slots.len() * 2;
        self.keys = vec![0; cap];
        self.slots = vec![0; cap];
        self.mask = cap - 1;
        for (u, &id) in self.unique.iter().enumerate() {
            let mut at = (mix64(id) as usize) & self.mask;
            while self.slots[at] != 0 {
                at = (at + 1) & self.mask;
            }
            self.keys[at] = id;
            self.slots[at] = u as u32 + 1;
        }
    }
}

/// One table's unique ids (`dedup.unique`) sorted by (shard, id) and, per unique id in first-seen order, its
/// position there. Sorts the bare ids (a primitive sort), then a stable counting sort by shard.
fn order_by_shard(dedup: &Dedup, num_shards: usize) -> (Vec<(u32, i64)>, Vec<i32>) {
    let mut ids = dedup.unique.clone();
    ids.sort_unstable();
    let shards: Vec<u32> = ids
        .iter()
        .map(|&id| (mix64(id) % num_shards as u64) as u32)
        .collect();
    let mut start = vec![0usize; num_shards + 1];
    for &s in &shards {
        start[s as usize + 1] += 1;
    }
    for s in 0..num_shards {
        start[s + 1] += start[s];
    }
    let mut sorted = vec![(0u32, 0i64); ids.len()];
    let mut row_of = vec![0i32; ids.len()];
    for (&id, &s) in ids.iter().zip(&shards) {
        let pos = start[s as usize];
        start[s as usize] += 1;
        sorted[pos] = (s, id);
        row_of[dedup.find(id) as usize] = pos as i32;
    }
    (sorted, row_of)
}

pub(crate) fn plan(
    features: &[&[i64]],
    tables: &[usize],
    num_tables: usize,
    num_shards: usize,
) -> Plan {
    let total: usize = features.iter().map(|f| f.len()).sum();
    let mut rows = vec![0i32; total];
    let mut offsets = Vec::with_capacity(features.len());
    let mut at = 0usize;
    for f in features {
        offsets.push(at);
        at += f.len();
    }
    // per table: its unique ids sorted by (shard, id)
    let mut per_table: Vec<Vec<(u32, i64)>> = Vec::with_capacity(num_tables);
    for t in 0..num_tables {
        let mine: Vec<usize> = (0..features.len()).filter(|&k| tables[k] == t).collect();
        let count: usize = mine.iter().map(|&k| features[k].len()).sum();
        let mut dedup = Dedup::new(count);
        for &k in &mine {
            let out = &mut rows[offsets[k]..offsets[k] + features[k].len()];
            for (slot, &id) in out.iter_mut().zip(features[k]) {
                *slot = dedup.index(id) as i32; // first-seen index for now, the row below
            }
        }
        let (sorted, row_of) = order_by_shard(&dedup, num_shards);
        for &k in &mine {
            for slot in rows[offsets[k]..offsets[k] + features[k].len()].iter_mut() {
                *slot = row_of[*slot as usize];
            }
        }
        per_table.push(sorted);
    }
    let mut grouped = Vec::with_capacity(per_table.iter().map(Vec::len).sum());
    let mut bounds = Vec::with_capacity(num_shards * num_tables + 1);
    bounds.push(0i64);
    let mut cursor = vec![0usize; num_tables];
    for s in 0..num_shards as u32 {
        for (t, sorted) in per_table.iter().enumerate() {
            let c = &mut cursor[t];
            while *c < sorted.len() && sorted[*c].0 == s {
                grouped.push(sorted[*c].1);
                *c += 1;
            }
            bounds.push(grouped.len() as i64);
        }
    }
    Plan {
        grouped,
        bounds,
        rows,
    }
}

/// `(grouped, bounds, rows)` of the lookup plan of one batch (module docstring). `ids[k]`: feature k's ids (int64,
/// contiguous), `tables[k]`: the index of its table in `[0, num_tables)`. Runs without the GIL.
#[pyfunction]
pub fn plan_lookups<'py>(
    py: Python<'py>,
    ids: Vec<PyReadonlyArray1<'py, i64>>,
    tables: Vec<usize>,
    num_tables: usize,
    num_shards: usize,
) -> PyResult<(
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i32>>,
)> {
    if ids.len() != tables.len() {
        return Err(PyValueError::new_err(
            "plan_lookups: one table index per feature",
        ));
    }
    if num_shards == 0 || tables.iter().any(|&t| t >= num_tables) {
        return Err(PyValueError::new_err(
            "plan_lookups: a table index or num_shards out of range",
        ));
    }
    let slices = ids
        .iter()
        .map(|a| {
            a.as_slice()
                .map_err(|_| PyTypeError::new_err("plan_lookups: ids must be contiguous"))
        })
        .collect::<PyResult<Vec<&[i64]>>>()?;
    let total: usize = slices.iter().map(|s| s.len()).sum();
    if total >= i32::MAX as usize {
        return Err(PyValueError::new_err(
            "plan_lookups: too many ids for int32 rows",
        ));
    }
    let done = py.allow_threads(|| plan(&slices, &tables, num_tables, num_shards));
    Ok((
        PyArray1::from_vec(py, done.grouped),
        PyArray1::from_vec(py, done.bounds),
        PyArray1::from_vec(py, done.rows),
    ))
}

/// The hot-row cache's id -> slot index of one table (`gateway.cache._Slab.index`): the `dict` methods the cache
/// uses, plus `slots`, the read path's bulk lookup.
#[pyclass(module = "embedgate_native")]
#[derive(Default)]
pub struct SlotIndex {
    pub(crate) map: IdMap<i64>,
}

#[pymethods]
impl SlotIndex {
    #[new]
    fn new() -> Self {
        SlotIndex::default()
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    fn __contains__(&self, id: i64) -> bool {
        self.map.contains_key(&id)
    }

    fn __setitem__(&mut self, id: i64, slot: i64) {
        self.map.insert(id, slot);
    }

    fn __getitem__(&self, id: i64) -> PyResult<i64> {
        self.map
            .get(&id)
            .copied()
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(id))
    }

    #[pyo3(signature = (id, default=None))]
    fn get(&self, id: i64, default: Option<i64>) -> Option<i64> {
        self.map.get(&id).copied().or(default)
    }

    #[pyo3(signature = (id, default=None))]
    fn pop(&mut self, id: i64, default: Option<i64>) -> Option<i64> {
        self.map.remove(&id).or(default)
    }

    /// int64 [n]: the slot of each of `ids` (int64, contiguous), `missing` where the index does not hold it.
    fn slots<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, i64>,
        missing: i64,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = ids
            .as_slice()
            .map_err(|_| PyTypeError::new_err("SlotIndex.slots: ids must be contiguous"))?;
        let out: Vec<i64> = ids
            .iter()
            .map(|id| self.map.get(id).copied().unwrap_or(missing))
            .collect();
        Ok(PyArray1::from_vec(py, out))
    }

    /// The read path of one (shard, table) in one pass (`gateway.cache.RowCache.get_many`): (hit mask bool [n],
    /// float32 [hits, dim]: the held rows of `rows` for the hits, in order), and `used[slot]` of the k-th hit set to
    /// `tick + k` (its LRU tick). `ids` int64 and `rows` float32 [capacity, dim] contiguous; `used` int64 [capacity].
    fn read<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, i64>,
        rows: PyReadonlyArray2<'py, f32>,
        mut used: PyReadwriteArray1<'py, i64>,
        tick: i64,
    ) -> PyResult<(Bound<'py, PyArray1<bool>>, Bound<'py, PyArray2<f32>>)> {
        let bad =
            |what: &str| PyTypeError::new_err(format!("SlotIndex.read: {what} must be contiguous"));
        let ids = ids.as_slice().map_err(|_| bad("ids"))?;
        let dim = rows.shape()[1];
        let capacity = rows.shape()[0];
        let rows = rows.as_slice().map_err(|_| bad("rows"))?;
        let used = used.as_slice_mut().map_err(|_| bad("used"))?;
        if used.len() < capacity {
            return Err(PyValueError::new_err(
                "SlotIndex.read: used is shorter than rows",
            ));
        }
        let mut mask = vec![false; ids.len()];
        let mut out: Vec<f32> = Vec::with_capacity(ids.len() * dim);
        let mut k = 0i64;
        for (hit, id) in mask.iter_mut().zip(ids) {
            let Some(&slot) = self.map.get(id) else {
                continue;
            };
            let slot = usize::try_from(slot)
                .ok()
                .filter(|s| *s < capacity)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "SlotIndex.read: slot {slot} of id {id} is outside the rows"
                    ))
                })?;
            *hit = true;
            used[slot] = tick + k;
            k += 1;
            out.extend_from_slice(&rows[slot * dim..(slot + 1) * dim]);
        }
        let found = PyArray1::from_vec(py, out).reshape([k as usize, dim])?;
        Ok((PyArray1::from_vec(py, mask), found))
    }
}

/// Registers this module's functions and classes on `embedgate_native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_lookups, m)?)?;
    m.add_class::<SlotIndex>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_matches_the_reference() {
        // schemas.partition.mix64([0, 1, -1])
        assert_eq!(mix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn plan_dedupes_per_table_and_orders_groups() {
        let a: &[i64] = &[5, 3, 5];
        let b: &[i64] = &[3, 7];
        let p = plan(&[a, b], &[0, 0], 1, 1);
        assert_eq!(p.grouped, vec![3, 5, 7]);
        assert_eq!(p.bounds, vec![0, 3]);
        assert_eq!(p.rows, vec![1, 0, 1, 0, 2]);
    }
}
