//! gRPC Predict features of an embedding model, read from the serialized `PredictRequest` -> the arrays of a
//! `gateway.features.FeatureBatch`, by the rules of the reference `gateway.grpc_front.features.batch_from_tensors`
//! (before `map_lookups`, which the caller runs), without protobuf's parse of the tensors or numpy's per-tensor work.
//!
//! It answers only requests whose every input is a `tensor_content` tensor of exactly its shape's bytes, or a tensor
//! whose values are its dtype's packed `float_val` / `int_val` / `int64_val` field with one value per element (as
//! `tf.make_tensor_proto` writes a one-element tensor) or that field's unpacked records in one run (as Go's
//! protobuf writes one) (`predict_req::split_inputs`), and that the reference
//! accepts as they are: ids int64 or int32, weights and dense values
//! float32, every feature of the manifest present once and nothing else, one row per example, single features
//! `[B]` or `[B, 1]`, multi features `[B, L]` padded with -1 and within `max_ids`, weights of the ids' shape and
//! finite where they count, dense `[B, dim]` (or `[B]` for dim 1). Anything else (every error, other dtypes, other
//! `*_val` fields, values repeated to fill a shape, strings) returns None and the reference runs, so every error
//! text is the reference's.

use pyo3::prelude::*;

use crate::features::{to_python, Arrays, FeatureLayout, Parsed, Role, SparseOut};
use crate::predict_req::{elements, split_inputs, Content, Encoding};
use crate::wire::{Reader, I32};

const DT_FLOAT: i32 = 1;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;
const PAD_ID: i64 = -1;

/// A varint as protobuf reads it for `dtype`: int64 as it is, int32 from its low 32 bits.
fn int_of(v: u64, dtype: i32) -> Option<i64> {
    match dtype {
        DT_INT64 => Some(v as i64),
        DT_INT32 => Some(i64::from(v as u32 as i32)),
        _ => None,
    }
}

/// Exactly `n` values of `data`: packed varints (`Encoding::Varints`), or a run of unpacked records
/// (`Encoding::Tagged`: each a tag, then a varint or a fixed32, as the split found them; a fixed32 as its bits).
/// None when they are malformed or not `n` (the reference words the error).
fn values(data: &[u8], n: usize, tagged: bool) -> Option<Vec<u64>> {
    let mut r = Reader::new(data);
    let mut out = Vec::with_capacity(n);
    while !r.done() {
        if out.len() == n {
            return None;
        }
        let fixed32 = tagged && r.tag()?.1 == I32;
        out.push(if fixed32 {
            let at = r.at;
            r.skip(I32)?;
            u64::from(u32::from_le_bytes(data[at..at + 4].try_into().ok()?))
        } else {
            r.varint()?
        });
    }
    (out.len() == n).then_some(out)
}

fn ids_of(raw: &[u8], c: &Content, encoding: Encoding) -> Option<Vec<i64>> {
    let data = &raw[c.3..c.3 + c.4];
    if encoding != Encoding::Content {
        let tagged = encoding == Encoding::Tagged;
        let values = values(data, elements(&c.2)?, tagged)?;
        return values.into_iter().map(|v| int_of(v, c.1)).collect();
    }
    Some(match c.1 {
        DT_INT64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        DT_INT32 => data
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        _ => return None,
    })
}

fn floats_of(raw: &[u8], c: &Content, encoding: Encoding) -> Option<Vec<f32>> {
    if c.1 != DT_FLOAT {
        return None;
    }
    let data = &raw[c.3..c.3 + c.4];
    match encoding {
        Encoding::Content => Some(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        Encoding::Tagged => Some(
            values(data, elements(&c.2)?, true)?
                .into_iter()
                .map(|v| f32::from_bits(v as u32))
                .collect(),
        ),
        Encoding::Varints => None,
    }
}

/// Pure: the batch of `raw` for `layout`, or None when the reference must decide (module docs).
fn parse(raw: &[u8], layout: &FeatureLayout) -> Option<Parsed> {
    if layout.ambiguous {
        return None;
    }
    let (rest, contents, encodings) = split_inputs(raw, true)?;
    let mut r = Reader::new(&rest);
    while !r.done() {
        let (number, wire) = r.tag()?;
        if number == 2 {
            return None; // an input that is not a content tensor
        }
        r.skip(wire)?;
    }
    let (ns, nd) = (layout.sparse.len(), layout.dense.len());
    let mut ids: Vec<Option<(&Content, Encoding)>> = vec![None; ns];
    let mut weights: Vec<Option<(&Content, Encoding)>> = vec![None; ns];
    let mut dense: Vec<Option<(&Content, Encoding)>> = vec![None; nd];
    for (c, &e) in contents.iter().zip(&encodings) {
        let slot = match layout.role(c.0.as_bytes(), 0)?.0 {
            Role::Ids(k) => &mut ids[k],
            Role::Weights(k) => &mut weights[k],
            Role::Dense(k) => &mut dense[k],
        };
        *slot = Some((c, e));
    }
    let ids: Vec<(&Content, Encoding)> = ids.into_iter().collect::<Option<_>>()?;
    let dense: Vec<(&Content, Encoding)> = dense.into_iter().collect::<Option<_>>()?;
    let first = ids.first().or(dense.first())?.0;
    let size = usize::try_from(*first.2.first()?).ok()?;
    if size == 0
        || contents
            .iter()
            .any(|c| c.2.first().copied() != Some(size as i64))
    {
        return None;
    }
    let mut sparse = Vec::with_capacity(ns);
    for (k, f) in layout.sparse.iter().enumerate() {
        let (c, e) = ids[k];
        let values = ids_of(raw, c, e)?;
        let w = match weights[k] {
            Some((wc, we)) if wc.2 == c.2 => Some(floats_of(raw, wc, we)?),
            Some(_) => return None,
            None => None,
        };
        let out = if !f.multi {
            if c.2.len() > 2 || (c.2.len() == 2 && c.2[1] != 1) {
                return None;
            }
            if w.as_ref().is_some_and(|w| !w.iter().all(|x| x.is_finite())) {
                return None;
            }
            SparseOut {
                ids: values,
                splits: (0..=size as i64).collect(),
                weights: w,
            }
        } else {
            if c.2.len() != 2 {
                return None;
            }
            let width = usize::try_from(c.2[1]).ok()?;
            let mut kept = Vec::with_capacity(values.len());
            let mut kept_w = w.as_ref().map(|_| Vec::with_capacity(values.len()));
            let mut splits = Vec::with_capacity(size + 1);
            splits.push(0i64);
            for (i, row) in values.chunks_exact(width).enumerate() {
                let before = kept.len();
                for (j, &id) in row.iter().enumerate() {
                    if id == PAD_ID {
                        continue;
                    }
                    kept.push(id);
                    if let (Some(out), Some(w)) = (kept_w.as_mut(), w.as_ref()) {
                        let x = w[i * width + j];
                        if !x.is_finite() {
                            return None;
                        }
                        out.push(x);
                    }
                }
                if f.max_ids.is_some_and(|m| kept.len() - before > m) {
                    return None;
                }
                splits.push(kept.len() as i64);
            }
            SparseOut {
                ids: kept,
                splits,
                weights: kept_w,
            }
        };
        sparse.push(out);
    }
    let mut dense_out = Vec::with_capacity(nd);
    for (&(c, e), (_, dim)) in dense.iter().zip(&layout.dense) {
        let plain = c.2.len() == 2 && c.2[1] == *dim as i64;
        if !(plain || (c.2.len() == 1 && *dim == 1)) {
            return None;
        }
        dense_out.push(floats_of(raw, c, e)?);
    }
    Some(Parsed {
        row: false,
        size,
        sparse,
        dense: dense_out,
    })
}

/// The features of a serialized `PredictRequest` (`row` is always False), or None: run the reference. Read without
/// the GIL.
#[pyfunction]
fn tensor_features<'py>(
    py: Python<'py>,
    raw: &[u8],
    layout: &FeatureLayout,
) -> PyResult<Option<Arrays<'py>>> {
    let parsed = py.allow_threads(|| parse(raw, layout));
    to_python(py, layout, parsed)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(tensor_features, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_int32_values_are_read_from_their_low_32_bits_as_protobuf_reads_them() {
        let five_bytes = [0xff, 0xff, 0xff, 0xff, 0x0f]; // 2^32 - 1, not sign-extended
        let ints = |data: &[u8], dtype: i32, n: usize| -> Option<Vec<i64>> {
            values(data, n, false)?
                .into_iter()
                .map(|v| int_of(v, dtype))
                .collect()
        };
        assert_eq!(ints(&five_bytes, DT_INT32, 1), Some(vec![-1]));
        assert_eq!(ints(&five_bytes, DT_INT64, 1), Some(vec![(1i64 << 32) - 1]));
        let minus_one = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(ints(&minus_one, DT_INT32, 1), Some(vec![-1]));
        assert_eq!(ints(&minus_one, DT_INT64, 1), Some(vec![-1]));
        assert_eq!(ints(&[0x80], DT_INT64, 1), None); // truncated
        assert_eq!(ints(&[1, 2], DT_INT64, 1), None); // more values than elements
        assert_eq!(ints(&[1], DT_INT64, 2), None); // fewer: TensorProto's "the last value repeats"
    }

    #[test]
    fn unpacked_records_give_varints_and_fixed32_bits() {
        // field 10 (int64_val) varints 7 and 300; field 5 (float_val) fixed32 1.5
        assert_eq!(
            values(&[0x50, 7, 0x50, 0xac, 0x02], 2, true),
            Some(vec![7, 300])
        );
        let one_and_a_half = 1.5f32.to_bits().to_le_bytes();
        let mut rec = vec![0x2d];
        rec.extend_from_slice(&one_and_a_half);
        assert_eq!(
            values(&rec, 1, true),
            Some(vec![u64::from(1.5f32.to_bits())])
        );
        assert_eq!(values(&rec[..3], 1, true), None); // truncated fixed32
        assert_eq!(values(&[0x50, 7, 0x50, 8], 1, true), None); // more records than elements
    }
}
