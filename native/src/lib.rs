//! embedgate's compiled hot path. The only Python door is `gateway/native.py`.
//!
//! `predict_tensors(body, names, dtypes)` types a REST predict body (TF Serving's row or columnar format) into one
//! numpy array per signature input, by the same rules as the Python reference (`gateway/codec/json_tensor.py`).
//! It answers only bodies the reference would accept and whose values it can type exactly (numbers and booleans);
//! for anything else (every error, strings, `b64`, NaN/Infinity tokens, literals it cannot prove lossless) it
//! returns `None` and the caller runs the reference, which produces TF Serving's error texts.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde_json::{Map, Value};

mod client;
mod direct;
mod entry;
mod features;
mod gate;
mod hot;
mod plan;
mod pool;
mod predict_req;
mod response;
mod rest_body;
mod rest_gate;
mod scan;
mod shape_check;
mod spec_sizes;
mod tensor_features;
mod wire;

// tensorflow/core/framework/types.proto DataType numbers
const DT_FLOAT: i32 = 1;
const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_UINT8: i32 = 4;
const DT_INT16: i32 = 5;
const DT_INT8: i32 = 6;
const DT_INT64: i32 = 9;
const DT_BOOL: i32 = 10;
const DT_UINT32: i32 = 22;
const DT_UINT64: i32 = 23;

/// The flat values of one input, in the numpy dtype the reference gives it.
enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
}

impl Data {
    fn new(dtype: i32) -> Option<Data> {
        Some(match dtype {
            DT_FLOAT => Data::F32(Vec::new()),
            DT_DOUBLE => Data::F64(Vec::new()),
            DT_INT32 | DT_UINT8 | DT_INT16 | DT_INT8 => Data::I32(Vec::new()),
            DT_INT64 => Data::I64(Vec::new()),
            DT_UINT32 => Data::U32(Vec::new()),
            DT_UINT64 => Data::U64(Vec::new()),
            DT_BOOL => Data::Bool(Vec::new()),
            _ => return None,
        })
    }

    /// Appends one leaf; None when the reference would not take it as is (it then decides, usually an error).
    fn push(&mut self, v: &Value) -> Option<()> {
        match self {
            Data::F32(out) => out.push(as_double(v)? as f32),
            Data::F64(out) => out.push(as_double(v)?),
            Data::I32(out) => out.push(i32::try_from(v.as_i64()?).ok()?),
            Data::I64(out) => out.push(v.as_i64()?),
            Data::U32(out) => out.push(u32::try_from(v.as_u64()?).ok()?),
            Data::U64(out) => out.push(v.as_u64()?),
            Data::Bool(out) => out.push(v.as_bool()?),
        }
        Some(())
    }

    fn into_array<'py>(self, py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Data::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::F64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::I32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::I64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::U32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::U64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Data::Bool(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        })
    }
}

/// A JSON number as the reference's double: integer literals converted (round to nearest even, as Python's
/// float(int)), decimal literals correctly rounded. serde_json reads the literal `-0` as -0.0 where the reference
/// reads the integer 0: such values are left to the reference.
fn as_double(v: &Value) -> Option<f64> {
    let n = match v {
        Value::Number(n) => n,
        _ => return None,
    };
    if let Some(u) = n.as_u64() {
        return Some(u as f64);
    }
    if let Some(i) = n.as_i64() {
        return Some(i as f64);
    }
    let f = n.as_f64()?;
    if f == 0.0 && f.is_sign_negative() {
        return None;
    }
    Some(f)
}

fn is_b64(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.len() == 1 && matches!(m.get("b64"), Some(Value::String(_))))
}

fn is_element_object(v: &Value) -> bool {
    matches!(v, Value::Object(_)) && !is_b64(v)
}

/// Shape from the first element at each level (TF Serving's inference).
fn shape_of(value: &Value) -> Vec<usize> {
    let mut shape = Vec::new();
    let mut v = value;
    while let Value::Array(items) = v {
        shape.push(items.len());
        match items.first() {
            Some(first) => v = first,
            None => break,
        }
    }
    shape
}

fn fill(val: &Value, level: usize, shape: &[usize], out: &mut Data) -> Option<()> {
    match val {
        Value::Array(items) => {
            if level >= shape.len() || items.len() != shape[level] {
                return None;
            }
            for x in items {
                fill(x, level + 1, shape, out)?;
            }
            Some(())
        }
        _ if level == shape.len() => out.push(val),
        _ => None,
    }
}

/// One input accumulated over the instances of a row-format body (the first item fixes the shape).
struct Column {
    item_shape: Option<Vec<usize>>,
    data: Data,
}

impl Column {
    fn add(&mut self, value: &Value) -> Option<()> {
        let shape = shape_of(value);
        match &self.item_shape {
            None => self.item_shape = Some(shape.clone()),
            Some(s) if *s != shape => return None,
            Some(_) => {}
        }
        fill(value, 0, &shape, &mut self.data)
    }
}

struct Typed {
    columns: Vec<(Vec<usize>, Data)>,
    row: bool,
}

fn single(value: &Value, dtype: i32) -> Option<(Vec<usize>, Data)> {
    let shape = shape_of(value);
    let mut data = Data::new(dtype)?;
    fill(value, 0, &shape, &mut data)?;
    Some((shape, data))
}

fn from_instances(
    instances: &[Value],
    names: &[String],
    dtypes: &[i32],
) -> Option<Vec<(Vec<usize>, Data)>> {
    let first = instances.first()?;
    let mut columns = Vec::with_capacity(names.len());
    for &d in dtypes {
        columns.push(Column {
            item_shape: None,
            data: Data::new(d)?,
        });
    }
    if is_element_object(first) {
        for elem in instances {
            let obj: &Map<String, Value> = match elem {
                Value::Object(m) if !is_b64(elem) => m,
                _ => return None,
            };
            if obj.len() != names.len() {
                return None;
            }
            for (name, column) in names.iter().zip(columns.iter_mut()) {
                column.add(obj.get(name)?)?;
            }
        }
    } else {
        if names.len() != 1 {
            return None;
        }
        for elem in instances {
            if is_element_object(elem) {
                return None;
            }
            columns[0].add(elem)?;
        }
    }
    let n = instances.len();
    Some(
        columns
            .into_iter()
            .map(|c| {
                let mut shape = vec![n];
                shape.extend(c.item_shape.unwrap_or_default());
                (shape, c.data)
            })
            .collect(),
    )
}

fn from_inputs(val: &Value, names: &[String], dtypes: &[i32]) -> Option<Vec<(Vec<usize>, Data)>> {
    match val {
        Value::Object(obj) if !is_b64(val) => names
            .iter()
            .zip(dtypes)
            .map(|(name, &d)| single(obj.get(name)?, d))
            .collect(),
        _ if names.len() == 1 => Some(vec![single(val, dtypes[0])?]),
        _ => None,
    }
}

/// Pure: the typed inputs of `body`, or None when the reference must decide.
fn type_body(body: &[u8], names: &[String], dtypes: &[i32]) -> Option<Typed> {
    let doc: Value = serde_json::from_slice(body).ok()?;
    type_doc(&doc, names, dtypes)
}

/// Pure: the typed inputs of a parsed body, or None when the reference must decide.
fn type_doc(doc: &Value, names: &[String], dtypes: &[i32]) -> Option<Typed> {
    if names.is_empty() || names.len() != dtypes.len() {
        return None;
    }
    let obj = doc.as_object()?;
    if let Some(sig) = obj.get("signature_name") {
        sig.as_str()?;
    }
    match (obj.get("instances"), obj.get("inputs")) {
        (Some(Value::Array(instances)), None) if !instances.is_empty() => Some(Typed {
            columns: from_instances(instances, names, dtypes)?,
            row: true,
        }),
        (None, Some(inputs)) => Some(Typed {
            columns: from_inputs(inputs, names, dtypes)?,
            row: false,
        }),
        _ => None,
    }
}

/// `(arrays by input name, "instances" | "inputs")`, or None (see the module docs). `names` sorted, `dtypes`
/// their DataType numbers. Parsing and typing run without the GIL.
#[pyfunction]
fn predict_tensors<'py>(
    py: Python<'py>,
    body: &[u8],
    names: Vec<String>,
    dtypes: Vec<i32>,
) -> PyResult<Option<(Bound<'py, PyDict>, &'static str)>> {
    let typed = py.allow_threads(|| type_body(body, &names, &dtypes));
    arrays(py, typed, &names)
}

fn arrays<'py>(
    py: Python<'py>,
    typed: Option<Typed>,
    names: &[String],
) -> PyResult<Option<(Bound<'py, PyDict>, &'static str)>> {
    let Some(typed) = typed else { return Ok(None) };
    let out = PyDict::new(py);
    for (name, (shape, data)) in names.iter().zip(typed.columns) {
        out.set_item(name, data.into_array(py, &shape)?)?;
    }
    Ok(Some((out, if typed.row { "instances" } else { "inputs" })))
}

/// Deepest bracket nesting of the JSON text (the root object counts 1), brackets inside strings not counted, as
/// `gateway.limits.json_depth` counts it: on the text, so members a later duplicate key replaces count too.
fn raw_depth(body: &[u8]) -> usize {
    let (mut level, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                level += 1;
                deepest = deepest.max(level);
            }
            b']' | b'}' => level = level.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn list_len(v: &Value) -> Option<usize> {
    match v {
        Value::Array(items) => Some(items.len()),
        _ => None,
    }
}

/// `gateway.limits.check_structure`: no batch longer than `max_instances`, no per-example list longer than `max_ids`.
fn within_counts(obj: &Map<String, Value>, max_instances: usize, max_ids: usize) -> bool {
    let short = |v: &Value| list_len(v).is_none_or(|n| n <= max_ids);
    for key in ["instances", "examples"] {
        if let Some(Value::Array(items)) = obj.get(key) {
            if items.len() > max_instances {
                return false;
            }
            for item in items {
                let ok = match item {
                    Value::Object(m) => m.values().all(short),
                    Value::Array(_) => short(item),
                    _ => true,
                };
                if !ok {
                    return false;
                }
            }
        }
    }
    match obj.get("inputs") {
        Some(Value::Array(items)) if items.len() > max_instances => return false,
        Some(Value::Object(m)) => {
            for column in m.values() {
                if let Value::Array(items) = column {
                    if items.len() > max_instances || !items.iter().all(short) {
                        return false;
                    }
                }
            }
        }
        _ => {}
    }
    if let Some(Value::Object(m)) = obj.get("context") {
        if !m.values().all(short) {
            return false;
        }
    }
    true
}

/// A REST predict body that passed `check_predict`, kept parsed for typing once the model's inputs are known.
#[pyclass(frozen, module = "embedgate_native")]
struct CheckedBody {
    doc: Value,
}

#[pymethods]
impl CheckedBody {
    /// As `predict_tensors`, from the parsed body.
    fn tensors<'py>(
        &self,
        py: Python<'py>,
        names: Vec<String>,
        dtypes: Vec<i32>,
    ) -> PyResult<Option<(Bound<'py, PyDict>, &'static str)>> {
        let typed = py.allow_threads(|| type_doc(&self.doc, &names, &dtypes));
        arrays(py, typed, &names)
    }
}

/// The `signature_name` and the parsed body of a REST predict body that is strict JSON (no NaN/Infinity tokens, no
/// lone surrogates, nothing after the root), a root object, and within the limits (depth, batch, per-example
/// lists); None when the reference must check it (`gateway.limits.parse_document`), which also words the error.
/// The name is given as [`name_or_size`] does ("" when absent).
#[pyfunction]
fn check_predict(
    py: Python<'_>,
    body: &[u8],
    max_depth: usize,
    max_instances: usize,
    max_ids: usize,
    max_name: usize,
) -> PyResult<Option<(PyObject, CheckedBody)>> {
    let checked = py.allow_threads(|| {
        if raw_depth(body) > max_depth {
            return None;
        }
        let doc: Value = serde_json::from_slice(body).ok()?;
        let obj = doc.as_object()?;
        if !within_counts(obj, max_instances, max_ids) {
            return None;
        }
        match obj.get("signature_name") {
            None | Some(Value::String(_)) => Some(doc),
            Some(_) => None,
        }
    });
    let Some(doc) = checked else {
        return Ok(None);
    };
    let sig = doc.get("signature_name").and_then(Value::as_str).unwrap_or("");
    let sig = name_or_size(py, sig, max_name)?;
    Ok(Some((sig, CheckedBody { doc })))
}

/// A client-sent name as Python receives it: the text when it has at most `max_name` UTF-8 bytes, else its size
/// in bytes (an int), so that a name no servable has is refused without its text being copied into a Python
/// string while the interpreter is held (a 60 MB `signature_name` took tens of milliseconds).
pub(crate) fn name_or_size(py: Python<'_>, name: &str, max_name: usize) -> PyResult<PyObject> {
    Ok(if name.len() <= max_name {
        PyString::new(py, name).into_any().unbind()
    } else {
        name.len().into_pyobject(py)?.into_any().unbind()
    })
}

#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn embedgate_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(predict_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(check_predict, m)?)?;
    m.add_class::<CheckedBody>()?;
    m.add_class::<gate::GrpcGate>()?;
    m.add_class::<rest_gate::RestGate>()?;
    m.add_class::<direct::DirectCall>()?;
    m.add_class::<client::GrpcClient>()?;
    response::register(m)?;
    plan::register(m)?;
    pool::register(m)?;
    features::register(m)?;
    rest_body::register(m)?;
    entry::register(m)?;
    scan::register(m)?;
    predict_req::register(m)?;
    hot::register(m)?;
    tensor_features::register(m)?;
    spec_sizes::register(m)?;
    shape_check::register(m)?;
    Ok(())
}
