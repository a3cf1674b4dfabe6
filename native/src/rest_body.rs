//! An embedding model's REST predict body in ONE streaming pass: bytes -> the `FeatureBatch` arrays.
//!
//! `rest_features(body, layout, max_depth, max_instances, max_ids, max_name)` scans the raw bytes once (a hand-rolled
//! scanner, no `serde_json::Value` tree, no per-value allocation) and writes each feature's ids, row splits,
//! weights and dense values straight into its typed columnar `Vec`s while it enforces, on the way, what
//! `gateway.limits.parse_document` checks on the text and on the parsed document: strict JSON (no NaN/Infinity
//! tokens, no lone UTF-16 surrogates, no control characters in strings, nothing after the root object), the
//! nesting depth (`max_depth`), the batch size (`max_instances`) and the per-example list lengths (`max_ids`); and
//! reads `signature_name`. The features follow `native/src/features.rs` (itself checked against the reference
//! `gateway.features.batch_from_instances` / `batch_from_columns`), value for value.
//!
//! It answers only bodies the reference accepts and whose values it types exactly: a root object of
//! `signature_name` (a string), and `instances` (a non-empty list of row objects) or `inputs` (an object of equally
//! long, non-empty columns), with integer ids and numeric weights/dense values. Anything else -- every error,
//! a key it does not know, a duplicate key, `b64` examples, strings, booleans, nulls, numbers that overflow a
//! double -- returns `None`, and the caller runs the reference, which words every
//! error exactly as before. So native and reference give the same batch or the same error text by construction of
//! the fallback; `tests/gateway/test_native_rest_body.py` checks the batches are the same bit for bit.

use std::borrow::Cow;

use pyo3::prelude::*;

use crate::features::{to_python, Arrays, FeatureLayout, Parsed, Role, SparseOut};

/// `gateway.limits.LimitsSettings`' structural limits.
struct Limits {
    max_depth: usize,
    max_instances: usize,
    max_ids: usize,
}

/// One example's (or one column's) weights as read: the values, and whether they came as a bare number.
#[derive(Default)]
struct Weights {
    values: Vec<f32>,
    counts: Vec<(usize, bool)>, // per example: (values, bare number)
    seen: bool,
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    lim: Limits,
}

#[inline]
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// A number literal as the reference's double: Python's `float()` of the int or of the decimal literal (correctly
/// rounded, integer literals of any length too; the integer literal `-0` is the int 0, so +0.0). None for values
/// that overflow a double (the reference decides those).
#[inline]
fn double(tok: &[u8], int: bool) -> Option<f64> {
    if int {
        if tok.len() <= 19 && tok.first() != Some(&b'-') {
            let mut v: u64 = 0;
            for &d in tok {
                v = v * 10 + u64::from(d - b'0');
            }
            return Some(v as f64); // round to nearest even, as float(int)
        }
        if tok == b"-0" {
            return Some(0.0);
        }
    }
    if let Some(v) = exact_double(tok) {
        return Some(v);
    }
    // SAFETY: a number token holds ASCII digits, signs, '.', 'e' and 'E' only
    let v: f64 = unsafe { std::str::from_utf8_unchecked(tok) }.parse().ok()?;
    v.is_finite().then_some(v)
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A decimal literal whose digits fit in 2^53 and whose power of ten is at most 22 either way (most sent values):
/// both are exact doubles, so one IEEE division or multiplication is the correctly rounded value (Clinger's fast
/// path), what `str::parse` and Python's `float()` give. None: the caller takes the general parser.
#[inline]
fn exact_double(tok: &[u8]) -> Option<f64> {
    let (neg, rest) = match tok.first()? {
        b'-' => (true, &tok[1..]),
        _ => (false, tok),
    };
    let mut mantissa: u64 = 0;
    let mut digits = 0usize;
    let mut scale: i32 = 0;
    let mut i = 0usize;
    let mut frac = false;
    while let Some(&c) = rest.get(i) {
        match c {
            b'0'..=b'9' => {
                if mantissa != 0 || c != b'0' {
                    digits += 1;
                }
                if digits > 15 {
                    return None;
                }
                mantissa = mantissa * 10 + u64::from(c - b'0');
                if frac {
                    scale -= 1;
                }
            }
            b'.' => frac = true,
            _ => break,
        }
        i += 1;
    }
    if i < rest.len() {
        // an exponent: e or E, an optional sign, digits
        let exp = &rest[i + 1..];
        let (eneg, edigits) = match exp.first()? {
            b'-' => (true, &exp[1..]),
            b'+' => (false, &exp[1..]),
            _ => (false, exp),
        };
        if edigits.len() > 3 {
            return None;
        }
        let mut e: i32 = 0;
        for &d in edigits {
            e = e * 10 + i32::from(d - b'0');
        }
        scale += if eneg { -e } else { e };
    }
    let m = mantissa as f64; // exact: at most 15 significant digits
    let v = if scale < 0 {
        m / *POW10.get(usize::try_from(-scale).ok()?)?
    } else {
        m * *POW10.get(usize::try_from(scale).ok()?)?
    };
    Some(if neg { -v } else { v })
}

impl<'a> Scanner<'a> {
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            if !is_ws(c) {
                return Some(c);
            }
            self.i += 1;
        }
        None
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        if self.peek()? == c {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    #[inline]
    fn eat_if(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// Opens an array or object at nesting `depth` (the root object is 1): None past `max_depth`.
    #[inline]
    fn open(&mut self, c: u8, depth: usize) -> Option<()> {
        if depth > self.lim.max_depth {
            return None;
        }
        self.eat(c)
    }

    /// After a member or element: true when another one follows (`,`), false at `close`.
    #[inline]
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// A list at nesting `depth`: opens it, reads every element with `each` (given the scanner at the element),
    /// and closes it; None as soon as the list or an element is not accepted.
    fn list(&mut self, depth: usize, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.open(b'[', depth)?;
        if !self.eat_if(b']') {
            loop {
                each(self)?;
                if !self.more(b']')? {
                    break;
                }
            }
        }
        Some(())
    }

    fn hex4(&mut self) -> Option<u32> {
        let s = self.b.get(self.i..self.i + 4)?;
        let mut v = 0u32;
        for &c in s {
            v = v * 16 + (c as char).to_digit(16)?;
        }
        self.i += 4;
        Some(v)
    }

    /// A JSON string as text (UTF-8 checked): `signature_name`.
    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.string()?.into_owned()).ok()
    }

    /// A JSON string: its bytes between the quotes when it has no escape, else its decoded bytes. None for invalid
    /// JSON, raw control characters and lone surrogates (what `parse_document` refuses). The bytes are not checked
    /// to be UTF-8 here: keys are only used when they equal a feature's name (UTF-8 text); `text` checks the rest.
    fn string(&mut self) -> Option<Cow<'a, [u8]>> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    let s = &self.b[start..self.i];
                    self.i += 1;
                    return Some(Cow::Borrowed(s));
                }
                b'\\' => break,
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        let mut out = self.b[start..self.i].to_vec();
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    let e = *self.b.get(self.i + 1)?;
                    self.i += 2;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            if (0xD800..0xDC00).contains(&hi) {
                                if self.b.get(self.i..self.i + 2)? != b"\\u" {
                                    return None; // lone high surrogate
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)? // None for a lone low surrogate
                            }
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return None,
                c => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// A number token (strict JSON grammar) and whether it is an integer literal (no fraction, no exponent).
    #[inline]
    fn number(&mut self) -> Option<(&'a [u8], bool)> {
        self.peek()?;
        let b = self.b;
        let start = self.i;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match *b.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => {
                i += 1;
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => return None,
        }
        let mut int = true;
        if b.get(i) == Some(&b'.') {
            int = false;
            i += 1;
            let d = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            if i == d {
                return None;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            int = false;
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let d = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            if i == d {
                return None;
            }
        }
        self.i = i;
        Some((&b[start..i], int))
    }

    /// An id: an integer literal within int64, read in one go (what `int64(number())` gives, without the second
    /// pass over the digits); None for anything else.
    #[inline]
    fn id(&mut self) -> Option<i64> {
        self.peek()?;
        let b = self.b;
        let mut i = self.i;
        let neg = b[i] == b'-';
        if neg {
            i += 1;
        }
        let start = i;
        let mut v: u64 = 0;
        while let Some(&c) = b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            i += 1;
        }
        let n = i - start;
        if n == 0 || (n > 1 && b[start] == b'0') || matches!(b.get(i), Some(b'.' | b'e' | b'E')) {
            return None; // not an integer literal of strict JSON (or a fraction / exponent: left to the reference)
        }
        self.i = i;
        if neg {
            if v > 1u64 << 63 {
                return None;
            }
            Some((v as i64).wrapping_neg())
        } else {
            i64::try_from(v).ok()
        }
    }

    /// A number as the reference's double narrowed to float32: plain decimals of at most 15 significant digits
    /// without an exponent are read in one go (`exact_double`'s fast path); the rest through `number` + `double`.
    #[inline]
    fn float32(&mut self) -> Option<f32> {
        self.peek()?;
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let neg = b[i] == b'-';
        if neg {
            i += 1;
        }
        let int_start = i;
        let mut mantissa: u64 = 0;
        let mut digits = 0u32;
        while let Some(&c) = b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            mantissa = mantissa * 10 + u64::from(c - b'0');
            if mantissa != 0 {
                digits += 1;
            }
            i += 1;
            if digits > 15 {
                return self.float32_slow();
            }
        }
        let int_len = i - int_start;
        if int_len == 0 || (int_len > 1 && b[int_start] == b'0') {
            return None;
        }
        let mut scale = 0usize;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let frac_start = i;
            while let Some(&c) = b.get(i) {
                if !c.is_ascii_digit() {
                    break;
                }
                mantissa = mantissa * 10 + u64::from(c - b'0');
                if mantissa != 0 {
                    digits += 1;
                }
                i += 1;
                if digits > 15 || i - frac_start > 22 {
                    return self.float32_slow();
                }
            }
            scale = i - frac_start;
            if scale == 0 {
                return None;
            }
        } else if !neg || mantissa != 0 {
            // an integer literal (`-0` is the int 0 on the reference: the slow path reads it)
        } else {
            return self.float32_slow();
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            return self.float32_slow();
        }
        self.i = i;
        let v = mantissa as f64 / POW10[scale]; // both exact: one correctly rounded division
        Some((if neg { -v } else { v }) as f32)
    }

    #[cold]
    fn float32_slow(&mut self) -> Option<f32> {
        let (tok, int) = self.number()?;
        Some(double(tok, int)? as f32)
    }

    /// One example's ids at `depth` (a list opens `depth + 1`): an id or a one-element list for a single feature,
    /// a list of at most the feature's `max_ids` for a multi one; every list within `limits.max_ids_per_feature`.
    fn ids(
        &mut self,
        multi: bool,
        feature_max: Option<usize>,
        depth: usize,
        out: &mut Vec<i64>,
    ) -> Option<usize> {
        if self.peek()? != b'[' {
            if multi {
                return None;
            }
            out.push(self.id()?);
            return Some(1);
        }
        let start = out.len();
        self.list(depth + 1, |s| {
            out.push(s.id()?);
            Some(())
        })?;
        let n = out.len() - start;
        if n > self.lim.max_ids {
            return None;
        }
        if multi {
            if feature_max.is_some_and(|m| n > m) {
                return None;
            }
        } else if n != 1 {
            return None;
        }
        Some(n)
    }

    /// One example's weights into `w` (finite after narrowing to float32), a list or a bare number.
    fn weights(&mut self, depth: usize, w: &mut Weights) -> Option<()> {
        let start = w.values.len();
        let mut push = |s: &mut Self| -> Option<()> {
            let v = s.float32()?;
            if !v.is_finite() {
                return None;
            }
            w.values.push(v);
            Some(())
        };
        if self.peek()? != b'[' {
            push(self)?;
            w.counts.push((1, true));
            return Some(());
        }
        self.list(depth + 1, push)?;
        let n = w.values.len() - start;
        if n > self.lim.max_ids {
            return None;
        }
        w.counts.push((n, false));
        Some(())
    }

    /// One example's dense values: a list of `dim` numbers, or a bare number when `dim == 1`.
    fn dense(&mut self, dim: usize, depth: usize, out: &mut Vec<f32>) -> Option<()> {
        if self.peek()? != b'[' {
            if dim != 1 {
                return None;
            }
            out.push(self.float32()?);
            return Some(());
        }
        let start = out.len();
        self.list(depth + 1, |s| {
            out.push(s.float32()?);
            Some(())
        })?;
        let n = out.len() - start;
        if n != dim || n > self.lim.max_ids {
            return None;
        }
        Some(())
    }
}

/// Per-example state of the row parser, reused across examples.
struct RowState {
    ids_seen: Vec<Option<usize>>,
    weights: Vec<Weights>,
    dense_seen: Vec<bool>,
}

impl FeatureLayout {
    /// Weights of one feature appended to `out`: the example's `n` ids' weights, or 1.0 each when absent.
    fn finish_weights(w: &Weights, multi: bool, n: usize, out: &mut SparseOut) -> Option<()> {
        if !w.seen {
            if let Some(all) = out.weights.as_mut() {
                all.resize(all.len() + n, 1.0);
            }
            return Some(());
        }
        let &(count, bare) = w.counts.last()?;
        if count != n || (bare && (multi || n != 1)) {
            return None;
        }
        let filled = out.ids.len() - n; // ids before this example
        out.weights
            .get_or_insert_with(|| vec![1.0; filled])
            .extend_from_slice(&w.values);
        Some(())
    }

    /// One row object (depth 3): every ids and dense feature once, weights optional, nothing else.
    fn row(
        &self,
        s: &mut Scanner<'_>,
        st: &mut RowState,
        sparse: &mut [SparseOut],
        dense: &mut [Vec<f32>],
    ) -> Option<()> {
        s.open(b'{', 3)?;
        st.ids_seen.iter_mut().for_each(|x| *x = None);
        st.dense_seen.iter_mut().for_each(|x| *x = false);
        for w in st.weights.iter_mut() {
            w.values.clear();
            w.counts.clear();
            w.seen = false;
        }
        let mut hint = 0usize;
        if !s.eat_if(b'}') {
            loop {
                let key = s.string()?;
                s.eat(b':')?;
                let (role, at) = self.role(&key, hint)?;
                hint = at + 1;
                match role {
                    Role::Ids(k) => {
                        if st.ids_seen[k].is_some() {
                            return None;
                        }
                        let f = &self.sparse[k];
                        st.ids_seen[k] = Some(s.ids(f.multi, f.max_ids, 3, &mut sparse[k].ids)?);
                    }
                    Role::Weights(k) => {
                        let w = &mut st.weights[k];
                        if w.seen {
                            return None;
                        }
                        w.seen = true;
                        s.weights(3, w)?;
                    }
                    Role::Dense(k) => {
                        if st.dense_seen[k] {
                            return None;
                        }
                        st.dense_seen[k] = true;
                        s.dense(self.dense[k].1, 3, &mut dense[k])?;
                    }
                }
                if !s.more(b'}')? {
                    break;
                }
            }
        }
        for (k, f) in self.sparse.iter().enumerate() {
            let n = st.ids_seen[k]?;
            let out = &mut sparse[k];
            out.splits.push(out.ids.len() as i64);
            Self::finish_weights(&st.weights[k], f.multi, n, out)?;
        }
        st.dense_seen.iter().all(|&x| x).then_some(())
    }

    /// `instances` (depth 2): a non-empty list of at most `max_instances` row objects.
    fn scan_rows(&self, s: &mut Scanner<'_>) -> Option<Parsed> {
        s.open(b'[', 2)?;
        let guess = (s.b.len() / 256).clamp(1, 1 << 16);
        let (mut sparse, mut dense) = self.empty(guess);
        let mut st = RowState {
            ids_seen: vec![None; self.sparse.len()],
            weights: self.sparse.iter().map(|_| Weights::default()).collect(),
            dense_seen: vec![false; self.dense.len()],
        };
        let mut size = 0usize;
        if s.eat_if(b']') {
            return None; // no examples: the reference words it
        }
        loop {
            size += 1;
            if size > s.lim.max_instances {
                return None;
            }
            self.row(s, &mut st, &mut sparse, &mut dense)?;
            if !s.more(b']')? {
                break;
            }
        }
        Some(Parsed {
            row: true,
            size,
            sparse,
            dense,
        })
    }

    /// `inputs` (depth 2): an object of columns (depth 3), one per ids and dense feature, weights optional, each
    /// a list of one value per example, all of one length (at least 1, at most `max_instances`).
    fn scan_columns(&self, s: &mut Scanner<'_>) -> Option<Parsed> {
        s.open(b'{', 2)?;
        let (mut sparse, mut dense) = self.empty(0);
        let mut ids_len: Vec<Option<usize>> = vec![None; self.sparse.len()];
        let mut weights: Vec<Weights> = self.sparse.iter().map(|_| Weights::default()).collect();
        let mut dense_len: Vec<Option<usize>> = vec![None; self.dense.len()];
        let mut hint = 0usize;
        if s.eat_if(b'}') {
            return None;
        }
        loop {
            let key = s.string()?;
            s.eat(b':')?;
            let (role, at) = self.role(&key, hint)?;
            hint = at + 1;
            s.open(b'[', 3)?;
            let mut n = 0usize;
            if !s.eat_if(b']') {
                loop {
                    n += 1;
                    if n > s.lim.max_instances {
                        return None;
                    }
                    match role {
                        Role::Ids(k) => {
                            let f = &self.sparse[k];
                            let out = &mut sparse[k];
                            s.ids(f.multi, f.max_ids, 3, &mut out.ids)?;
                            out.splits.push(out.ids.len() as i64);
                        }
                        Role::Weights(k) => s.weights(3, &mut weights[k])?,
                        Role::Dense(k) => s.dense(self.dense[k].1, 3, &mut dense[k])?,
                    }
                    if !s.more(b']')? {
                        break;
                    }
                }
            }
            let seen = match role {
                Role::Ids(k) => ids_len[k].replace(n),
                Role::Weights(k) => {
                    let was = weights[k].seen;
                    weights[k].seen = true;
                    was.then_some(0)
                }
                Role::Dense(k) => dense_len[k].replace(n),
            };
            if seen.is_some() {
                return None; // a duplicate key
            }
            if !s.more(b'}')? {
                break;
            }
        }
        let size = ids_len.first().copied()??;
        if size == 0 || ids_len.iter().chain(&dense_len).any(|&n| n != Some(size)) {
            return None;
        }
        for ((f, out), w) in self.sparse.iter().zip(sparse.iter_mut()).zip(&weights) {
            if !w.seen {
                continue;
            }
            if w.counts.len() != size {
                return None;
            }
            for (e, &(count, bare)) in w.counts.iter().enumerate() {
                let n = (out.splits[e + 1] - out.splits[e]) as usize;
                if count != n || (bare && (f.multi || n != 1)) {
                    return None;
                }
            }
            out.weights = Some(w.values.clone());
        }
        Some(Parsed {
            row: false,
            size,
            sparse,
            dense,
        })
    }

    /// Pure: the signature name and the features of a raw predict body in one pass, or None (see the module docs).
    fn scan(&self, body: &[u8], lim: Limits) -> Option<(String, Parsed)> {
        if self.ambiguous || self.sparse.is_empty() {
            return None;
        }
        let mut s = Scanner { b: body, i: 0, lim };
        s.open(b'{', 1)?;
        let mut sig: Option<String> = None;
        let mut parsed: Option<Parsed> = None;
        if !s.eat_if(b'}') {
            loop {
                let key = s.string()?;
                s.eat(b':')?;
                match &*key {
                    b"signature_name" if sig.is_none() => {
                        sig = Some(s.text()?);
                    }
                    b"instances" if parsed.is_none() => parsed = Some(self.scan_rows(&mut s)?),
                    b"inputs" if parsed.is_none() => parsed = Some(self.scan_columns(&mut s)?),
                    _ => return None,
                }
                if !s.more(b'}')? {
                    break;
                }
            }
        }
        if s.peek().is_some() {
            return None; // something after the root object
        }
        Some((sig.unwrap_or_default(), parsed?))
    }
}

/// `(signature_name, (row format?, size, sparse arrays, dense arrays))` of a raw REST predict body, parsed and
/// checked in one pass without the GIL; None: run the reference (see the module docs). The name is given as
/// `crate::name_or_size` does: its size (an int) when it has more than `max_name` UTF-8 bytes.
#[pyfunction]
fn rest_features<'py>(
    py: Python<'py>,
    body: &[u8],
    layout: &FeatureLayout,
    max_depth: usize,
    max_instances: usize,
    max_ids: usize,
    max_name: usize,
) -> PyResult<Option<(PyObject, Arrays<'py>)>> {
    let lim = Limits {
        max_depth,
        max_instances,
        max_ids,
    };
    let Some((sig, parsed)) = py.allow_threads(|| layout.scan(body, lim)) else {
        return Ok(None);
    };
    let Some(arrays) = to_python(py, layout, Some(parsed))? else {
        return Ok(None);
    };
    Ok(Some((crate::name_or_size(py, &sig, max_name)?, arrays)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rest_features, m)?)?;
    Ok(())
}
