//! The gRPC front's shape check of a `PredictRequest`'s input tensors (`gateway.grpc_front.messages.check_tensor`,
//! the reference) from the serialized message, without the GIL: the bytes the inputs decode to when every tensor
//! passes, else `None` and the reference checks the parsed message and words the refusal.
//!
//! Called on a message protobuf has already parsed, so the wire data is well-formed; what the walk must match is
//! protobuf's reading of it. It answers only where that reading is plain: `None` for an input key seen twice (the map
//! keeps the last), an entry with more than one key or value, a tensor with more than one `dtype` or `tensor_shape`
//! (a repeated message field is merged), or a dim with more than one `size`. Per tensor, as the reference: an
//! unknown rank decodes to nothing; otherwise more than `max_rank` dims, a negative size or a first size above
//! `max_instances` is a refusal (`None`), and the element count, capped at `max_bytes / item + 1` as it grows, times
//! the dtype's element bytes `item` (`items[dtype]`, `default_item` beyond the table) must stay within `max_bytes`.

use pyo3::prelude::*;
use std::collections::HashSet;

use crate::wire::{Reader, LEN, VARINT};

/// The limits and element sizes of one check.
pub struct Limits<'a> {
    pub items: &'a [u64],
    pub default_item: u64,
    pub max_rank: usize,
    pub max_instances: i64,
    pub max_bytes: u64,
}

/// A dim's size (the last `size` field, 0 without one); None when it has several.
fn dim_size(buf: &[u8]) -> Option<i64> {
    let mut r = Reader::new(buf);
    let (mut size, mut seen) = (0i64, 0);
    while !r.done() {
        match r.tag()? {
            (1, VARINT) => {
                size = r.varint()? as i64; // int64: two's complement
                seen += 1;
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    (seen <= 1).then_some(size)
}

/// (unknown_rank, sizes) of a `TensorShapeProto`.
fn shape(buf: &[u8]) -> Option<(bool, Vec<i64>)> {
    let mut r = Reader::new(buf);
    let (mut unknown, mut sizes) = (false, Vec::new());
    while !r.done() {
        match r.tag()? {
            (2, LEN) => sizes.push(dim_size(r.bytes()?)?),
            (3, VARINT) => unknown = r.varint()? != 0,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some((unknown, sizes))
}

/// The bytes one `TensorProto` decodes to, or None (a refusal, or a reading that is not plain).
fn tensor_bytes(buf: &[u8], lim: &Limits<'_>) -> Option<u64> {
    let mut r = Reader::new(buf);
    let (mut dtype, mut dtypes) = (0i64, 0);
    let (mut shape_buf, mut shapes): (&[u8], i32) = (&[], 0);
    while !r.done() {
        match r.tag()? {
            (1, VARINT) => {
                dtype = i64::from(r.varint()? as i32); // an enum is an int32 on the wire
                dtypes += 1;
            }
            (2, LEN) => {
                shape_buf = r.bytes()?;
                shapes += 1;
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    if dtypes > 1 || shapes > 1 {
        return None;
    }
    let (unknown, sizes) = shape(shape_buf)?;
    if unknown {
        return Some(0);
    }
    if sizes.len() > lim.max_rank || sizes.iter().any(|&s| s < 0) {
        return None;
    }
    if sizes.first().is_some_and(|&s| s > lim.max_instances) {
        return None;
    }
    let item = usize::try_from(dtype)
        .ok()
        .and_then(|d| lim.items.get(d).copied())
        .unwrap_or(lim.default_item)
        .max(1);
    let cap = lim.max_bytes / item;
    let mut count: u64 = 1;
    for &s in &sizes {
        count = count.saturating_mul(s as u64).min(cap.saturating_add(1));
    }
    (count <= cap).then_some(count * item)
}

/// (key, value) of an `inputs` map entry; None when it has several of either.
fn entry(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut r = Reader::new(buf);
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    let (mut keys, mut values) = (0, 0);
    while !r.done() {
        match r.tag()? {
            (1, LEN) => {
                key = r.bytes()?;
                keys += 1;
            }
            (2, LEN) => {
                value = r.bytes()?;
                values += 1;
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    (keys <= 1 && values <= 1).then_some((key, value))
}

/// The bytes every input of the serialized `PredictRequest` `raw` decodes to (module docs), or None.
pub fn input_bytes(raw: &[u8], lim: &Limits<'_>) -> Option<u64> {
    let mut r = Reader::new(raw);
    let mut keys = HashSet::new();
    let mut total: u64 = 0;
    while !r.done() {
        match r.tag()? {
            (2, LEN) => {
                let (key, value) = entry(r.bytes()?)?;
                if !keys.insert(key) {
                    return None;
                }
                total = total.saturating_add(tensor_bytes(value, lim)?);
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(total)
}

/// `input_bytes` for Python, run without the GIL.
#[pyfunction]
#[pyo3(signature = (raw, items, default_item, max_rank, max_instances, max_bytes))]
pub fn predict_input_bytes(
    py: Python<'_>,
    raw: &[u8],
    items: Vec<u64>,
    default_item: u64,
    max_rank: usize,
    max_instances: i64,
    max_bytes: u64,
) -> Option<u64> {
    let lim = Limits {
        items: &items,
        default_item,
        max_rank,
        max_instances,
        max_bytes,
    };
    py.allow_threads(|| input_bytes(raw, &lim))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(predict_input_bytes, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ITEMS: [u64; 10] = [8, 4, 8, 4, 1, 2, 1, 8, 8, 8];

    fn lim(max_bytes: u64) -> Limits<'static> {
        Limits {
            items: &ITEMS,
            default_item: 8,
            max_rank: 64,
            max_instances: 100,
            max_bytes,
        }
    }

    /// inputs { key: k value { dtype: 1 tensor_shape { dim { size: a } dim { size: b } } } }
    fn request(k: u8, a: u8, b: u8) -> Vec<u8> {
        let tensor = [0x08, 1, 0x12, 8, 0x12, 2, 0x08, a, 0x12, 2, 0x08, b];
        let mut entry = vec![0x0a, 1, k, 0x12, tensor.len() as u8];
        entry.extend_from_slice(&tensor);
        let mut msg = vec![0x12, entry.len() as u8];
        msg.extend(entry);
        msg
    }

    #[test]
    fn sums_the_inputs_and_refuses_what_the_reference_refuses() {
        let mut two = request(b'x', 3, 2);
        two.extend(request(b'y', 1, 1));
        assert_eq!(input_bytes(&two, &lim(1 << 20)), Some(4 * 6 + 4));
        assert_eq!(input_bytes(&request(b'x', 3, 2), &lim(23)), None); // 24 bytes > 23
        assert_eq!(input_bytes(&request(b'x', 101, 1), &lim(1 << 20)), None); // batch > max_instances
        assert_eq!(input_bytes(&request(b'x', 5, 0), &lim(1 << 20)), Some(0));
        let mut twice = request(b'x', 1, 1);
        twice.extend(request(b'x', 1, 1));
        assert_eq!(input_bytes(&twice, &lim(1 << 20)), None); // a key seen twice: protobuf keeps the last
        assert_eq!(input_bytes(&[], &lim(1)), Some(0));
    }
}
