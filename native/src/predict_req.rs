//! serve-local's receive path: a serialized `PredictRequest` split, without the GIL, into its *content inputs* (the
//! `inputs` entries whose tensor is a numeric `tensor_content` of exactly its shape's bytes, located by offset) and
//! the small *rest* (every other top-level field, byte for byte, for protobuf to parse). The Python door and the
//! reference (protobuf's parse, then `decode_tensor`) are in `embedgate/localserve/request.py`.
//!
//! A content input's `inputs` entry holds exactly one `key` (1, UTF-8) and one `value` (2); the `TensorProto` only
//! `dtype` (1), `tensor_shape` (2), `version_number` (3) and a non-empty `tensor_content` (4), each at most once;
//! the shape only `dim`s (2; each at most one `size` (1) >= 0 and one UTF-8 `name` (2)) and an `unknown_rank` (3)
//! of 0; the dtype numeric; the content's length the dims' product times the dtype's width. Every other entry goes
//! to the rest, whole, as do `model_spec`, `output_filter` and unknown fields.
//!
//! `None` (the caller then parses the whole message with protobuf, which accepts it or names the error) for
//! malformed wire data anywhere, a group, an entry without exactly one UTF-8 key, or a key seen twice (protobuf's
//! map keeps the last; the split does not reproduce that).

use pyo3::prelude::*;
use std::collections::HashSet;

use crate::wire::{Reader, I32, LEN, VARINT};

const MAX_DIMS: usize = 254; // TensorShape's own limit (kMaxDims)

/// One content input: (alias, DataType number, dims, offset of `tensor_content` in the message, its length).
pub type Content = (String, i32, Vec<i64>, usize, usize);

/// How a content input's values are written at its offset (`split_inputs` with `packed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The values' little-endian bytes, exactly the shape's: `tensor_content`, or the packed `float_val` (5) of a
    /// DT_FLOAT tensor (fixed32 values are written as `tensor_content` is).
    Content,
    /// `int_val` (7) of a DT_INT32 or `int64_val` (10) of a DT_INT64 tensor, packed: one varint per value. Not
    /// counted here: the reader checks it decodes as many as `elements(dims)`.
    Varints,
    /// The dtype's values field written unpacked, one record (its tag, then one varint or fixed32) per value, as
    /// some writers do (ghz's Go protobuf, for one): a run of such records with nothing between them. Counted by
    /// the reader too.
    Tagged,
}

/// The packed values field a dtype's values are read from, and how they are written.
fn packed_field(dtype: i32) -> Option<(u64, Encoding)> {
    match dtype {
        1 => Some((5, Encoding::Content)),
        3 => Some((7, Encoding::Varints)),
        9 => Some((10, Encoding::Varints)),
        _ => None,
    }
}

/// The number of elements of a shape's `dims` (1 for a scalar), or None when a dim is negative or it overflows.
pub fn elements(dims: &[i64]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// Bytes per element of the numeric DataTypes whose `tensor_content` is read in place (tensors.py `_NUMPY`).
fn width(dtype: i32) -> Option<usize> {
    Some(match dtype {
        4 | 6 | 10 => 1,       // uint8, int8, bool
        5 | 14 | 17 | 19 => 2, // int16, bfloat16, uint16, half
        1 | 3 | 22 => 4,       // float, int32, uint32
        2 | 8 | 9 | 23 => 8,   // double, complex64, int64, uint64
        18 => 16,              // complex128
        _ => return None,
    })
}

/// A well-formed dim's size, or Err(()) for malformed wire data; Ok(None) when the dim is not a plain one.
fn dim(buf: &[u8]) -> Result<Option<i64>, ()> {
    let mut r = Reader::new(buf);
    let (mut size, mut sizes, mut names) = (0i64, 0, 0);
    while !r.done() {
        match r.tag().ok_or(())? {
            (1, VARINT) => {
                size = r.varint().ok_or(())? as i64;
                sizes += 1;
            }
            (2, LEN) => {
                std::str::from_utf8(r.bytes().ok_or(())?).map_err(|_| ())?;
                names += 1;
            }
            (_, wire) => {
                r.skip(wire).ok_or(())?;
                sizes = 2; // an unknown field: not plain
            }
        }
    }
    Ok((sizes <= 1 && names <= 1 && size >= 0).then_some(size))
}

/// The dims of a plain known-rank shape; Err(()) for malformed wire data, Ok(None) for any other shape.
fn shape(buf: &[u8]) -> Result<Option<Vec<i64>>, ()> {
    let mut r = Reader::new(buf);
    let mut dims = Vec::new();
    let mut plain = true;
    while !r.done() {
        match r.tag().ok_or(())? {
            (2, LEN) => match dim(r.bytes().ok_or(())?)? {
                Some(d) => dims.push(d),
                None => plain = false,
            },
            (3, VARINT) => plain &= r.varint().ok_or(())? == 0,
            (_, wire) => {
                r.skip(wire).ok_or(())?;
                plain = false;
            }
        }
    }
    Ok((plain && dims.len() <= MAX_DIMS).then_some(dims))
}

/// A content tensor as found in its message.
type Found = (i32, Vec<i64>, usize, usize, Encoding);

/// (dtype, dims, content offset within `buf`, content length, encoding) of a content tensor; Err(()) for malformed
/// wire data, Ok(None) for any other tensor. With `packed`, a tensor without `tensor_content` whose values are its
/// dtype's packed `*_val` field, one per element (`packed_field`), is a content tensor too.
fn tensor(buf: &[u8], packed: bool) -> Result<Option<Found>, ()> {
    let mut r = Reader::new(buf);
    let (mut dtype, mut dims, mut content) = (None, None, None);
    let (mut seen_dtype, mut seen_shape, mut seen_content, mut seen_version) = (0, 0, 0, 0);
    let mut values: Option<(u64, usize, usize, bool)> = None; // (field, offset, length, tagged)
    let mut seen_values = 0;
    let mut plain = true;
    while !r.done() {
        let start = r.at;
        match r.tag().ok_or(())? {
            (1, VARINT) => {
                dtype = Some(r.varint().ok_or(())? as i64);
                seen_dtype += 1;
            }
            (2, LEN) => {
                dims = shape(r.bytes().ok_or(())?)?;
                plain &= dims.is_some();
                seen_shape += 1;
            }
            (3, VARINT) => {
                r.varint().ok_or(())?;
                seen_version += 1;
            }
            (4, LEN) => {
                let (at, data) = r.bytes_at().ok_or(())?;
                content = Some((at, data.len()));
                seen_content += 1;
            }
            (field @ (5 | 7 | 10), LEN) if packed => {
                let (at, data) = r.bytes_at().ok_or(())?;
                values = Some((field, at, data.len(), false));
                seen_values += 1;
            }
            (field @ (7 | 10), wire @ VARINT) | (field @ 5, wire @ I32) if packed => {
                r.skip(wire).ok_or(())?;
                match values {
                    // the next record of the run: the run grows
                    Some((f, at, len, true)) if f == field && at + len == start => {
                        values = Some((f, at, r.at - at, true));
                    }
                    _ => {
                        values = Some((field, start, r.at - start, true));
                        seen_values += 1;
                    }
                }
            }
            (_, wire) => {
                r.skip(wire).ok_or(())?;
                plain = false;
            }
        }
    }
    if !plain
        || seen_dtype != 1
        || seen_shape > 1
        || seen_version > 1
        || seen_content + seen_values != 1
    {
        return Ok(None);
    }
    let Some(dtype) = dtype else {
        return Ok(None);
    };
    if let Some((field, at, len, tagged)) = values {
        return Ok(packed_values(
            dtype,
            dims.unwrap_or_default(),
            field,
            &buf[at..at + len],
            at,
            tagged,
        ));
    }
    let Some((at, len)) = content else {
        return Ok(None);
    };
    let Ok(dtype) = i32::try_from(dtype) else {
        return Ok(None);
    };
    let dims = dims.unwrap_or_default();
    let Some(w) = width(dtype) else {
        return Ok(None);
    };
    let want = elements(&dims).and_then(|n| n.checked_mul(w));
    Ok((len > 0 && Some(len) == want).then_some((dtype, dims, at, len, Encoding::Content)))
}

/// A tensor whose values are the packed `field` (`data`, at `at`), or with `tagged` its run of unpacked records: a
/// content tensor when the field is its dtype's and is not empty; packed fixed32 values must fill exactly the
/// shape's elements, the other encodings are counted by the reader.
fn packed_values(
    dtype: i64,
    dims: Vec<i64>,
    field: u64,
    data: &[u8],
    at: usize,
    tagged: bool,
) -> Option<Found> {
    let dtype = i32::try_from(dtype).ok()?;
    let (want_field, encoding) = packed_field(dtype)?;
    if field != want_field || data.is_empty() {
        return None;
    }
    if tagged {
        return Some((dtype, dims, at, data.len(), Encoding::Tagged));
    }
    if encoding == Encoding::Content
        && Some(data.len()) != elements(&dims).and_then(|n| n.checked_mul(4))
    {
        return None;
    }
    Some((dtype, dims, at, data.len(), encoding))
}

/// An `inputs` map entry: (key, the content tensor if it is one with its offset within `buf`); Err(()) when the
/// message must go to protobuf whole (malformed, or not exactly one UTF-8 key).
fn entry(buf: &[u8], packed: bool) -> Result<(String, Option<Found>), ()> {
    let mut r = Reader::new(buf);
    let (mut key, mut keys, mut value, mut values) = (None, 0, None, 0);
    let mut plain = true;
    while !r.done() {
        match r.tag().ok_or(())? {
            (1, LEN) => {
                key = Some(
                    std::str::from_utf8(r.bytes().ok_or(())?)
                        .map_err(|_| ())?
                        .to_owned(),
                );
                keys += 1;
            }
            (2, LEN) => {
                let (at, data) = r.bytes_at().ok_or(())?;
                value = tensor(data, packed)?.map(|(d, s, off, len, e)| (d, s, at + off, len, e));
                values += 1;
            }
            (_, wire) => {
                r.skip(wire).ok_or(())?;
                plain = false;
            }
        }
    }
    if keys != 1 {
        return Err(());
    }
    let content = if plain && values == 1 { value } else { None };
    Ok((key.unwrap_or_default(), content))
}

/// (rest, content inputs) of a serialized `PredictRequest` (module docs), or None.
pub fn split(raw: &[u8]) -> Option<(Vec<u8>, Vec<Content>)> {
    let (rest, contents, _) = split_inputs(raw, false)?;
    Some((rest, contents))
}

/// `split`, and with `packed` the tensors whose values are their dtype's packed `*_val` field are content inputs
/// too (`Encoding` says how each input's values are written).
pub fn split_inputs(raw: &[u8], packed: bool) -> Option<(Vec<u8>, Vec<Content>, Vec<Encoding>)> {
    let mut r = Reader::new(raw);
    let mut rest = Vec::new();
    let mut contents = Vec::new();
    let mut encodings = Vec::new();
    let mut keys = HashSet::new();
    while !r.done() {
        let start = r.at;
        let (number, wire) = r.tag()?;
        if (number, wire) == (2, LEN) {
            let (at, data) = r.bytes_at()?;
            let (key, content) = entry(data, packed).ok()?;
            if !keys.insert(key.clone()) {
                return None;
            }
            if let Some((dtype, dims, off, len, encoding)) = content {
                contents.push((key, dtype, dims, at + off, len));
                encodings.push(encoding);
                continue;
            }
        } else {
            r.skip(wire)?;
        }
        rest.extend_from_slice(&raw[start..r.at]);
    }
    Some((rest, contents, encodings))
}

/// `split` for Python (rest as bytes), run without the GIL.
#[pyfunction]
pub fn split_predict_request(py: Python<'_>, raw: &[u8]) -> Option<(Vec<u8>, Vec<Content>)> {
    py.allow_threads(|| split(raw))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(split_predict_request, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_inputs_are_located_and_the_rest_kept() {
        // model_spec { name: "m" } inputs { key: "x" value { dtype: 1 tensor_shape { dim { size: 1 } }
        // tensor_content: "abcd" } }
        let msg = [
            0x0a, 3, 0x0a, 1, b'm', 0x12, 19, 0x0a, 1, b'x', 0x12, 14, 0x08, 1, 0x12, 4, 0x12, 2,
            0x08, 1, 0x22, 4, b'a', b'b', b'c', b'd',
        ];
        let (rest, contents) = split(&msg).unwrap();
        assert_eq!(rest, &msg[..5]);
        assert_eq!(contents, vec![("x".to_owned(), 1, vec![1], 22, 4)]);
        assert_eq!(&msg[22..26], b"abcd");
        assert!(split(&msg[..msg.len() - 1]).is_none()); // truncated
        let mut wrong = msg;
        wrong[19] = 2; // dim size 2: 8 bytes expected, content stays in the rest
        let (rest, contents) = split(&wrong).unwrap();
        assert_eq!(rest, &wrong[..]);
        assert!(contents.is_empty());
    }
}
