//! The entry's serialized `PredictRequest` written in one pass (`gateway.embedding.entry_request`; reference:
//! `schemas.wire.predict_request_for` of `gateway.embedding.entry_inputs`).
//!
//! The caller gives the serialized `model_spec` field (protobuf writes it) and, per input, its name, `DataType`
//! number, shape and the raw little-endian bytes of its values as one or more parts (e.g. a table's rows as each
//! PS shard answered them: no concatenation first). The result is one `bytes` object, sized once, into which every
//! part is copied once, without the GIL: the same bytes `schemas.wire` frames around its arrays (an `inputs` map
//! entry per input: key, then the `TensorProto` value with `dtype`, `tensor_shape` and `tensor_content`).
//!
//! Field numbers (tensorflow/core/framework/tensor.proto, tensor_shape.proto; tensorflow_serving/apis/predict.proto):
//! `PredictRequest.inputs` 2 (map entry: key 1, value 2); `TensorProto.dtype` 1, `tensor_shape` 2, `tensor_content` 4;
//! `TensorShapeProto.dim` 2; `Dim.size` 1.

use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

const INPUTS: u8 = (2 << 3) | 2;
const KEY: u8 = (1 << 3) | 2;
const VALUE: u8 = (2 << 3) | 2;
const DTYPE: u8 = 1 << 3; // varint
const SHAPE: u8 = (2 << 3) | 2;
const DIM: u8 = (2 << 3) | 2;
const SIZE: u8 = 1 << 3; // varint
const CONTENT: u8 = (4 << 3) | 2;

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One input's framing up to its `tensor_content` bytes: the map entry's tag and length, key, value tag and length,
/// dtype, shape, and the content tag and length (left out, as protobuf leaves out an empty field, when `nbytes` is 0).
pub(crate) fn framing(name: &str, dtype: i32, shape: &[i64], nbytes: usize) -> Vec<u8> {
    let mut meta = Vec::with_capacity(32 + 4 * shape.len());
    meta.push(DTYPE);
    put_varint(&mut meta, dtype as i64 as u64); // enum values are int32, negative ones sign-extended
    if !shape.is_empty() {
        let mut dims = Vec::with_capacity(4 * shape.len());
        for &size in shape {
            dims.push(DIM);
            if size == 0 {
                dims.push(0); // a size of 0 is the default: an empty Dim
            } else {
                dims.push((1 + varint_len(size as u64)) as u8);
                dims.push(SIZE);
                put_varint(&mut dims, size as u64);
            }
        }
        meta.push(SHAPE);
        put_varint(&mut meta, dims.len() as u64);
        meta.extend_from_slice(&dims);
    }
    if nbytes > 0 {
        meta.push(CONTENT);
        put_varint(&mut meta, nbytes as u64);
    }
    let key = name.as_bytes();
    let mut head = Vec::with_capacity(key.len() + meta.len() + 16);
    head.push(KEY);
    put_varint(&mut head, key.len() as u64);
    head.extend_from_slice(key);
    head.push(VALUE);
    put_varint(&mut head, (meta.len() + nbytes) as u64);
    head.extend_from_slice(&meta);
    let mut entry = Vec::with_capacity(head.len() + 8);
    entry.push(INPUTS);
    put_varint(&mut entry, (head.len() + nbytes) as u64);
    entry.extend_from_slice(&head);
    entry
}

/// The serialized `PredictRequest`: `head` (its serialized `model_spec`), then per input `(name, dtype, shape,
/// parts)` the map entry whose `tensor_content` is the parts' bytes (uint8 views, C-contiguous) joined in order.
/// A shape's element count is not checked against the bytes (the caller's arrays give both).
#[pyfunction]
pub fn entry_request<'py>(
    py: Python<'py>,
    head: &[u8],
    inputs: Vec<(String, i32, Vec<i64>, Vec<PyReadonlyArray1<'py, u8>>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut pieces: Vec<(Vec<u8>, Vec<&[u8]>)> = Vec::with_capacity(inputs.len());
    let mut total = head.len();
    for (name, dtype, shape, parts) in &inputs {
        if shape.iter().any(|&d| d < 0) {
            return Err(PyValueError::new_err(format!(
                "input {name:?}: negative dimension in {shape:?}"
            )));
        }
        let mut slices = Vec::with_capacity(parts.len());
        for p in parts {
            if !p.is_contiguous() {
                return Err(PyValueError::new_err(format!(
                    "input {name:?}: a part is not contiguous"
                )));
            }
            slices.push(p.as_slice()?);
        }
        let nbytes: usize = slices.iter().map(|s| s.len()).sum();
        let frame = framing(name, *dtype, shape, nbytes);
        total += frame.len() + nbytes;
        pieces.push((frame, slices));
    }
    fresh_bytes(py, total, true, |buf: &mut [u8]| {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(head);
        for (frame, slices) in &pieces {
            put(frame);
            for s in slices {
                put(s);
            }
        }
        assert_eq!(
            at, total,
            "entry_request: the request's size was miscounted"
        );
    })
}

/// A new `bytes` object of `len` bytes, filled by `fill` without zeroing it first (`PyBytes::new_with` would: a
/// second pass over a multi-megabyte message); `fill` runs without the GIL when `release` is set. `fill` must write
/// every byte (the entry writers assert it; `DirectCall.take_message` copies exactly the message's chunks).
pub(crate) fn fresh_bytes<'py>(
    py: Python<'py>,
    len: usize,
    release: bool,
    fill: impl FnOnce(&mut [u8]) + Send,
) -> PyResult<Bound<'py, PyBytes>> {
    let n = isize::try_from(len)
        .map_err(|_| PyOverflowError::new_err("too long for a bytes object"))?;
    // SAFETY: a new bytes object of `len` bytes, uninitialised and seen by no other thread until it is returned (so
    // filling it needs no interpreter lock); `fill` writes every byte before Python sees it.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n);
        let obj = Bound::from_owned_ptr_or_err(py, ptr)?;
        let data = pyo3::ffi::PyBytes_AsString(obj.as_ptr()) as usize;
        let write = move || fill(std::slice::from_raw_parts_mut(data as *mut u8, len));
        if release {
            py.allow_threads(write);
        } else {
            write();
        }
        Ok(obj.downcast_into_unchecked::<PyBytes>())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(entry_request, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_protobuf() {
        for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
        }
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, vec![0xac, 0x02]);
    }

    #[test]
    fn framing_of_an_empty_tensor_has_no_content_field() {
        let f = framing("x", 1, &[0, 2], 0);
        let want: Vec<u8> = vec![
            0x12, 15, 0x0a, 1, b'x', 0x12, 10, 0x08, 1, 0x12, 6, 0x12, 0, 0x12, 2, 0x08, 2,
        ];
        assert_eq!(f, want);
    }
}
