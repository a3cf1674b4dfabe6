//! A structural scan of a serialized `PredictRequest` (the gRPC front's messages), without the GIL: is it a *plain*
//! request, whose protobuf parse is a handful of allocations and memory copies?
//!
//! Plain: top-level fields only `model_spec` (1, at most 64 KiB, its own fields only), `inputs` (2) and
//! `output_filter` (3); each `inputs` map entry only `key` (1) and `value` (2); each value `TensorProto` only
//! `dtype` (1), `tensor_shape` (2), `version_number` (3), `tensor_content` (4) and packed numeric values (5, 6, 7,
//! 10, 13, 16, 17; fixed-width ones whole, varints well-formed); each shape only `dim` (2, at most `MAX_DIMS`) and
//! `unknown_rank` (3); each dim only `size` (1) and `name` (2); strings valid UTF-8; at most `MAX_INPUTS` entries
//! and `MAX_FIELDS` fields in all; well-formed wire format throughout. Anything else (string tensors, repeated
//! non-packed values, unknown fields, a truncated message) is "not plain", and the caller checks it as before.
//!
//! The scan decides only where a message is parsed (the gRPC front's parse worker process or its own parse thread),
//! never whether it is accepted: the parse and every limit are checked by the same code either way.

use pyo3::prelude::*;

const MAX_INPUTS: usize = 1024;
const MAX_DIMS: usize = 64;
const MAX_SPEC: usize = 64 * 1024;
const MAX_FIELDS: usize = 1 << 16; // fields scanned in all: the scan and a plain message's parse stay short

use crate::wire::{self, LEN, VARINT};

thread_local! {
    static FIELDS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `wire::Reader` whose `tag` also counts the fields scanned in all, refusing beyond `MAX_FIELDS`.
struct Reader<'a>(wire::Reader<'a>);

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader(wire::Reader::new(buf))
    }

    /// (field number, wire type) of the next field.
    fn tag(&mut self) -> Option<(u64, u8)> {
        let seen = FIELDS.with(|c| {
            c.set(c.get() + 1);
            c.get()
        });
        if seen > MAX_FIELDS {
            return None;
        }
        self.0.tag()
    }
}

impl<'a> std::ops::Deref for Reader<'a> {
    type Target = wire::Reader<'a>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

fn plain_dim(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.tag()? {
            (1, VARINT) => {
                r.varint()?;
            }
            (2, LEN) => {
                std::str::from_utf8(r.bytes()?).ok()?;
            }
            _ => return None,
        }
    }
    Some(())
}

fn plain_shape(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    let mut dims = 0;
    while !r.done() {
        match r.tag()? {
            (2, LEN) => {
                dims += 1;
                if dims > MAX_DIMS {
                    return None;
                }
                plain_dim(r.bytes()?)?;
            }
            (3, VARINT) => {
                r.varint()?;
            }
            _ => return None,
        }
    }
    Some(())
}

fn plain_tensor(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.tag()? {
            (1 | 3, VARINT) => {
                r.varint()?;
            }
            (2, LEN) => plain_shape(r.bytes()?)?,
            (4, LEN) => {
                r.bytes()?; // tensor_content: one copy
            }
            // packed float, double: whole values; packed int, int64, half, uint32, uint64: well-formed varints
            (5, LEN) => fixed(r.bytes()?, 4)?,
            (6, LEN) => fixed(r.bytes()?, 8)?,
            (7 | 10 | 13 | 16 | 17, LEN) => varints(r.bytes()?)?,
            _ => return None,
        }
    }
    Some(())
}

fn fixed(buf: &[u8], width: usize) -> Option<()> {
    (buf.len() % width == 0).then_some(())
}

fn varints(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        r.varint()?;
    }
    Some(())
}

/// `ModelSpec`: `name` (1), `version` (2, an `Int64Value`: `value` (1) only), `signature_name` (3),
/// `version_label` (4).
fn plain_spec(buf: &[u8]) -> Option<()> {
    if buf.len() > MAX_SPEC {
        return None;
    }
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.tag()? {
            (1 | 3 | 4, LEN) => {
                std::str::from_utf8(r.bytes()?).ok()?;
            }
            (2, LEN) => {
                let mut v = Reader::new(r.bytes()?);
                while !v.done() {
                    match v.tag()? {
                        (1, VARINT) => {
                            v.varint()?;
                        }
                        _ => return None,
                    }
                }
            }
            _ => return None,
        }
    }
    Some(())
}

fn plain_entry(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.tag()? {
            (1, LEN) => {
                std::str::from_utf8(r.bytes()?).ok()?;
            }
            (2, LEN) => plain_tensor(r.bytes()?)?,
            _ => return None,
        }
    }
    Some(())
}

fn plain(buf: &[u8]) -> Option<()> {
    let mut r = Reader::new(buf);
    let mut inputs = 0;
    while !r.done() {
        match r.tag()? {
            (1, LEN) => plain_spec(r.bytes()?)?,
            (2, LEN) => {
                inputs += 1;
                if inputs > MAX_INPUTS {
                    return None;
                }
                plain_entry(r.bytes()?)?;
            }
            (3, LEN) => {
                std::str::from_utf8(r.bytes()?).ok()?;
            }
            (_, wire) => {
                // only the three fields above are plain; still walk the rest to reject a malformed tail
                r.skip(wire)?;
                return None;
            }
        }
    }
    Some(())
}

/// Whether `raw` is a plain `PredictRequest` (module docs); the scan runs without the GIL.
#[pyfunction]
pub fn plain_predict_request(py: Python<'_>, raw: &[u8]) -> bool {
    py.allow_threads(|| {
        FIELDS.with(|c| c.set(0));
        plain(raw).is_some()
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plain_predict_request, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_unknown_fields_are_not_plain() {
        // inputs { key: "x" value { dtype: 1 tensor_content: "abcd" } }
        let msg = [
            0x12, 11, 0x0a, 1, b'x', 0x12, 6, 0x08, 1, 0x22, 2, b'a', b'b',
        ];
        assert!(plain(&msg).is_some());
        assert!(plain(&msg[..msg.len() - 1]).is_none());
        assert!(plain(&[0x20, 1]).is_none()); // field 4, varint: not a PredictRequest field we call plain
        assert!(plain(&[]).is_some());
        FIELDS.with(|c| c.set(0));
        let many: Vec<u8> = [0x12, 0]
            .iter()
            .copied()
            .cycle()
            .take(2 * (MAX_FIELDS + 1))
            .collect();
        assert!(plain(&many).is_none()); // more fields than the budget
        FIELDS.with(|c| c.set(0));
        assert!(plain(&many[..2 * 1000]).is_some()); // 1000 empty inputs entries
    }
}
