//! REST predict features of an embedding model -> the arrays of a `gateway.features.FeatureBatch`.
//!
//! `checked_features(checked, layout)` reads the body `check_predict` already parsed (no second parse) and
//! `body_features(body, layout)` parses a raw body; both follow the reference `gateway.features.batch_from_instances`
//! / `batch_from_columns` (before `map_lookups`, which the caller runs) for the forms they take: row objects and
//! columns of integer ids and JSON numbers. They answer only bodies the reference accepts and whose values they type
//! exactly; anything else (every error, `b64` examples, strings, booleans, nulls, the literal `-0` or `-0.0`, a
//! columnar batch of 0 examples) returns `None` and the reference runs, so every error text is the reference's.
//! Lookup layers are the caller's business: it does not call this for a model with string features.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde_json::{Map, Value};

use crate::{as_double, CheckedBody};

/// One sparse feature of the manifest: ids name, multi-valued, `max_ids` (None: no limit), weights name.
pub(crate) struct Sparse {
    pub(crate) name: String,
    pub(crate) multi: bool,
    pub(crate) max_ids: Option<usize>,
    pub(crate) weights: Option<String>,
}

/// What a key of a row object or of `inputs` names: sparse feature k's ids or weights, or dense input k.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Ids(usize),
    Weights(usize),
    Dense(usize),
}

/// A manifest's features in manifest order, built once per manifest by `gateway.native`.
#[pyclass(frozen, module = "embedgate_native")]
pub(crate) struct FeatureLayout {
    pub(crate) sparse: Vec<Sparse>,
    pub(crate) dense: Vec<(String, usize)>,
    /// Every key a feature may be sent under, in manifest order (ids, then its weights; then dense).
    keys: Vec<(Vec<u8>, Role)>,
    /// Two roles share a key: `rest_body` leaves such a manifest to the reference.
    pub(crate) ambiguous: bool,
}

#[pymethods]
impl FeatureLayout {
    /// `sparse`: `(name, multi, max_ids or -1, weights name or "")` per sparse feature; `dense`: `(name, dim)`.
    #[new]
    fn new(sparse: Vec<(String, bool, i64, String)>, dense: Vec<(String, usize)>) -> Self {
        let sparse = sparse
            .into_iter()
            .map(|(name, multi, max_ids, weights)| Sparse {
                name,
                multi,
                max_ids: usize::try_from(max_ids).ok(),
                weights: if weights.is_empty() {
                    None
                } else {
                    Some(weights)
                },
            })
            .collect::<Vec<Sparse>>();
        let mut keys: Vec<(Vec<u8>, Role)> = Vec::new();
        for (k, f) in sparse.iter().enumerate() {
            keys.push((f.name.as_bytes().to_vec(), Role::Ids(k)));
            if let Some(w) = &f.weights {
                keys.push((w.as_bytes().to_vec(), Role::Weights(k)));
            }
        }
        for (k, (name, _)) in dense.iter().enumerate() {
            keys.push((name.as_bytes().to_vec(), Role::Dense(k)));
        }
        let mut names: Vec<&[u8]> = keys.iter().map(|(n, _)| n.as_slice()).collect();
        names.sort_unstable();
        let ambiguous = names.windows(2).any(|w| w[0] == w[1]);
        FeatureLayout {
            sparse,
            dense,
            keys,
            ambiguous,
        }
    }
}

impl FeatureLayout {
    /// The role of `key` and its position in `keys`, trying position `hint` first (keys usually come in the same
    /// order in every example); None for an unknown key.
    #[inline]
    pub(crate) fn role(&self, key: &[u8], hint: usize) -> Option<(Role, usize)> {
        if let Some((name, role)) = self.keys.get(hint) {
            if name.as_slice() == key {
                return Some((*role, hint));
            }
        }
        let at = self
            .keys
            .iter()
            .position(|(name, _)| name.as_slice() == key)?;
        Some((self.keys[at].1, at))
    }
}

/// One sparse feature's CSR arrays; `weights` stays None until an example sends weights.
pub(crate) struct SparseOut {
    pub(crate) ids: Vec<i64>,
    pub(crate) splits: Vec<i64>,
    pub(crate) weights: Option<Vec<f32>>,
}

pub(crate) struct Parsed {
    pub(crate) row: bool,
    pub(crate) size: usize,
    pub(crate) sparse: Vec<SparseOut>,
    pub(crate) dense: Vec<Vec<f32>>,
}

/// The ids of one example's value: a single feature takes an id or a one-element list, a multi feature a list of
/// at most `max_ids` ids; ids are JSON integers within int64.
fn push_ids(value: &Value, f: &Sparse, out: &mut Vec<i64>) -> Option<usize> {
    match value {
        Value::Array(items) => {
            if f.multi {
                if f.max_ids.is_some_and(|m| items.len() > m) {
                    return None;
                }
            } else if items.len() != 1 {
                return None;
            }
            for x in items {
                out.push(x.as_i64()?);
            }
            Some(items.len())
        }
        Value::Number(_) if !f.multi => {
            out.push(value.as_i64()?);
            Some(1)
        }
        _ => None,
    }
}

/// Float32 of a JSON number as the reference narrows it (double, then round to nearest; beyond float32 -> +-inf).
fn float32(v: &Value) -> Option<f32> {
    Some(as_double(v)? as f32)
}

/// One example's weights (`count` of them, one per id): a list of numbers, or a bare number for a single feature;
/// finite after narrowing to float32.
fn push_weights(value: &Value, multi: bool, count: usize, out: &mut Vec<f32>) -> Option<()> {
    let mut push = |v: &Value| -> Option<()> {
        let w = float32(v)?;
        if !w.is_finite() {
            return None;
        }
        out.push(w);
        Some(())
    };
    match value {
        Value::Array(items) if items.len() == count => items.iter().try_for_each(push),
        Value::Number(_) if !multi && count == 1 => push(value),
        _ => None,
    }
}

/// One example's dense values: a list of `dim` numbers, or a bare number when `dim == 1`.
fn push_dense(value: &Value, dim: usize, out: &mut Vec<f32>) -> Option<()> {
    match value {
        Value::Array(items) if items.len() == dim => {
            for x in items {
                out.push(float32(x)?);
            }
            Some(())
        }
        Value::Number(_) if dim == 1 => {
            out.push(float32(value)?);
            Some(())
        }
        _ => None,
    }
}

impl FeatureLayout {
    pub(crate) fn empty(&self, size: usize) -> (Vec<SparseOut>, Vec<Vec<f32>>) {
        let sparse = self
            .sparse
            .iter()
            .map(|_| {
                let mut splits = Vec::with_capacity(size + 1);
                splits.push(0);
                SparseOut {
                    ids: Vec::with_capacity(size),
                    splits,
                    weights: None,
                }
            })
            .collect();
        let dense = self
            .dense
            .iter()
            .map(|(_, dim)| Vec::with_capacity(size * dim))
            .collect();
        (sparse, dense)
    }

    /// Row format: every example an object holding every ids and dense feature, weights optional per example
    /// (missing weights are 1), no other key.
    fn rows(&self, instances: &[Value]) -> Option<Parsed> {
        let size = instances.len();
        if size == 0 {
            return None;
        }
        let (mut sparse, mut dense) = self.empty(size);
        for item in instances {
            let obj: &Map<String, Value> = item.as_object()?;
            let mut known = 0usize;
            for (f, out) in self.sparse.iter().zip(sparse.iter_mut()) {
                let n = push_ids(obj.get(&f.name)?, f, &mut out.ids)?;
                out.splits.push(out.ids.len() as i64);
                known += 1;
                let Some(wname) = &f.weights else { continue };
                match obj.get(wname) {
                    Some(w) => {
                        known += 1;
                        let filled = out.ids.len() - n; // ids before this example
                        let weights = out.weights.get_or_insert_with(|| vec![1.0; filled]);
                        push_weights(w, f.multi, n, weights)?;
                    }
                    None => {
                        if let Some(weights) = out.weights.as_mut() {
                            weights.resize(weights.len() + n, 1.0);
                        }
                    }
                }
            }
            for ((name, dim), out) in self.dense.iter().zip(dense.iter_mut()) {
                push_dense(obj.get(name)?, *dim, out)?;
                known += 1;
            }
            if known != obj.len() {
                return None; // an unknown feature
            }
        }
        Some(Parsed {
            row: true,
            size,
            sparse,
            dense,
        })
    }

    /// Columnar format: an object of lists of one length (at least 1), one per ids and dense feature, weights
    /// columns optional, no other key.
    fn columns(&self, inputs: &Value) -> Option<Parsed> {
        let obj = inputs.as_object()?;
        let column = |name: &str| -> Option<&Vec<Value>> { obj.get(name)?.as_array() };
        let size = column(&self.sparse.first()?.name)?.len();
        if size == 0 {
            return None;
        }
        let (mut sparse, mut dense) = self.empty(size);
        let mut known = 0usize;
        for (f, out) in self.sparse.iter().zip(sparse.iter_mut()) {
            let values = column(&f.name)?;
            if values.len() != size {
                return None;
            }
            known += 1;
            let mut counts = Vec::with_capacity(size);
            for v in values {
                counts.push(push_ids(v, f, &mut out.ids)?);
                out.splits.push(out.ids.len() as i64);
            }
            let Some(wname) = &f.weights else { continue };
            if obj.contains_key(wname) {
                let ws = column(wname)?;
                if ws.len() != size {
                    return None;
                }
                known += 1;
                let mut weights = Vec::with_capacity(out.ids.len());
                for (w, &n) in ws.iter().zip(&counts) {
                    push_weights(w, f.multi, n, &mut weights)?;
                }
                out.weights = Some(weights);
            }
        }
        for ((name, dim), out) in self.dense.iter().zip(dense.iter_mut()) {
            let values = column(name)?;
            if values.len() != size {
                return None;
            }
            known += 1;
            for v in values {
                push_dense(v, *dim, out)?;
            }
        }
        if known != obj.len() {
            return None; // an unknown feature
        }
        Some(Parsed {
            row: false,
            size,
            sparse,
            dense,
        })
    }

    /// Pure: the features of a parsed predict body, or None when the reference must decide.
    fn parse(&self, doc: &Value) -> Option<Parsed> {
        let obj = doc.as_object()?;
        match (obj.get("instances"), obj.get("inputs")) {
            (Some(Value::Array(instances)), None) => self.rows(instances),
            (None, Some(inputs)) => self.columns(inputs),
            _ => None,
        }
    }
}

/// `(row format?, size, [(ids, row_splits, weights or None)] in manifest order, [dense float32 [size, dim]])`.
pub(crate) type Arrays<'py> = (bool, usize, Bound<'py, PyList>, Bound<'py, PyList>);

pub(crate) fn to_python<'py>(
    py: Python<'py>,
    layout: &FeatureLayout,
    parsed: Option<Parsed>,
) -> PyResult<Option<Arrays<'py>>> {
    let Some(p) = parsed else { return Ok(None) };
    let sparse = PyList::empty(py);
    for s in p.sparse {
        let ids = PyArray1::from_vec(py, s.ids);
        let splits = PyArray1::from_vec(py, s.splits);
        let weights = s.weights.map(|w| PyArray1::from_vec(py, w));
        sparse.append((ids, splits, weights))?;
    }
    let dense = PyList::empty(py);
    for ((_, dim), values) in layout.dense.iter().zip(p.dense) {
        dense.append(PyArray1::from_vec(py, values).reshape([p.size, *dim])?)?;
    }
    Ok(Some((p.row, p.size, sparse, dense)))
}

/// The features of a body `check_predict` passed, from its parsed form (without the GIL); None: run the reference.
#[pyfunction]
fn checked_features<'py>(
    py: Python<'py>,
    checked: &CheckedBody,
    layout: &FeatureLayout,
) -> PyResult<Option<Arrays<'py>>> {
    let parsed = py.allow_threads(|| layout.parse(&checked.doc));
    to_python(py, layout, parsed)
}

/// As `checked_features`, from a raw body (strict JSON; no limits checked: the caller checked the body).
#[pyfunction]
fn body_features<'py>(
    py: Python<'py>,
    body: &[u8],
    layout: &FeatureLayout,
) -> PyResult<Option<Arrays<'py>>> {
    let parsed = py.allow_threads(|| {
        let doc: Value = serde_json::from_slice(body).ok()?;
        layout.parse(&doc)
    });
    to_python(py, layout, parsed)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FeatureLayout>()?;
    m.add_function(wrap_pyfunction!(checked_features, m)?)?;
    m.add_function(wrap_pyfunction!(body_features, m)?)?;
    Ok(())
}
