//! The gRPC front's first look at a request message: the sizes of its `model_spec` strings, read from the wire
//! format before the message is parsed (`gateway.grpc_front.messages.check_spec_sizes`; reference
//! `check_spec_sizes_reference`, which this follows step for step, including where it stops reading).
//!
//! Every request message of TF Serving's API has its `model_spec` as field 1; `ModelSpec`'s strings are `name` (1),
//! `signature_name` (3) and `version_label` (4). At most `limit` fields are read at each level; whatever cannot be
//! read (a varint over 10 bytes, a length past the end, a group or an invalid wire type) ends the reading with what
//! was read, and the parser decides.

use pyo3::prelude::*;

/// The varint at `pos` within `buf[..end]` and the position after it; None when it does not end within 10 bytes or
/// `end`. Values keep every bit of their 10 bytes (u128), as the reference's Python integers do.
fn varint(buf: &[u8], mut pos: usize, end: usize) -> Option<(u128, usize)> {
    let mut value = 0u128;
    for shift in (0..70).step_by(7) {
        if pos >= end {
            return None;
        }
        let b = buf[pos];
        pos += 1;
        value |= u128::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some((value, pos));
        }
    }
    None
}

/// (field number, value start, value end) of the length-delimited fields among the first `limit` fields of
/// `buf[pos..end]`.
fn length_fields(
    buf: &[u8],
    mut pos: usize,
    end: usize,
    limit: usize,
) -> Vec<(u128, usize, usize)> {
    let mut out = Vec::new();
    for _ in 0..limit {
        if pos >= end {
            break;
        }
        let Some((key, next)) = varint(buf, pos, end) else {
            break;
        };
        pos = next;
        match key & 7 {
            0 => match varint(buf, pos, end) {
                Some((_, next)) => pos = next,
                None => break,
            },
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let Some((size, start)) = varint(buf, pos, end) else {
                    break;
                };
                if start as u128 + size > end as u128 {
                    break;
                }
                let stop = start + size as usize;
                out.push((key >> 3, start, stop));
                pos = stop;
            }
            _ => break,
        }
    }
    out
}

/// The first `model_spec` string longer than `max_bytes`: (its field number in `ModelSpec`, its size), or None.
fn too_long(raw: &[u8], max_bytes: usize, limit: usize) -> Option<(u8, usize)> {
    let (_, start, end) = length_fields(raw, 0, raw.len(), limit)
        .into_iter()
        .filter(|f| f.0 == 1)
        .last()?;
    length_fields(raw, start, end, limit)
        .into_iter()
        .find(|&(number, s, e)| matches!(number, 1 | 3 | 4) && e - s > max_bytes)
        .map(|(number, s, e)| (number as u8, e - s))
}

/// `too_long` for Python, without the GIL.
#[pyfunction]
fn spec_too_long(
    py: Python<'_>,
    raw: &[u8],
    max_bytes: usize,
    limit: usize,
) -> Option<(u8, usize)> {
    py.allow_threads(|| too_long(raw, max_bytes, limit))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(spec_too_long, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_spec_counts_and_its_first_long_string_is_named() {
        // model_spec { name: "abc", signature_name: "xxxxxx" }, then a second model_spec { name: "ab" }
        let first = [
            0x0a, 0x0d, 0x0a, 0x03, b'a', b'b', b'c', 0x1a, 0x06, b'x', b'x', b'x', b'x', b'x',
            b'x',
        ];
        assert_eq!(too_long(&first, 4, 64), Some((3, 6)));
        let mut both = first.to_vec();
        both.extend_from_slice(&[0x0a, 0x04, 0x0a, 0x02, b'a', b'b']);
        assert_eq!(too_long(&both, 4, 64), None);
        assert_eq!(too_long(&first[..10], 4, 64), None); // truncated: left to the parser
    }
}
